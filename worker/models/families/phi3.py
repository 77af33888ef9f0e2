"""Phi-3 and Phi-4: q, k and v fused in one ``qkv_proj`` and gate and up in one
``gate_up_proj`` in the checkpoint (the engine's own layout), rotary over a part of
each head (``partial_rotary_factor``), LongRoPE's short and long factors."""

from worker.models.family import Family
from worker.models.traits import llama_traits

FAMILY = Family(
    name="phi3",
    architectures=("Phi3ForCausalLM",),
    model_types=("phi3",),
    traits=llama_traits,
    gguf_architecture="phi3",
)
