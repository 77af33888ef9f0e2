"""Mistral: Llama's layers, every one attending within ``sliding_window`` tokens."""

from worker.models.family import Family
from worker.models.traits import llama_traits

FAMILY = Family(
    name="mistral",
    architectures=("MistralForCausalLM",),
    model_types=("mistral",),
    traits=llama_traits,
    gguf_architecture="llama",
)
