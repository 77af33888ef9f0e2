"""Llama (and SmolLM2, and every checkpoint that says ``LlamaForCausalLM``)."""

from worker.models.family import Family
from worker.models.traits import llama_traits

FAMILY = Family(
    name="llama",
    architectures=("LlamaForCausalLM",),
    model_types=("llama",),
    traits=llama_traits,
    gguf_architecture="llama",
)
