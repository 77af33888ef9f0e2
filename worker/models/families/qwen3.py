"""Qwen3: an RMSNorm over each head of q and k before the rotary embedding, and an
explicit ``head_dim``."""

import dataclasses

from transformers import PretrainedConfig

from worker.models.family import Family
from worker.models.traits import Traits, llama_traits


def qwen3_traits(config: PretrainedConfig) -> Traits:
    return dataclasses.replace(llama_traits(config), qk_norm="head")


FAMILY = Family(
    name="qwen3",
    architectures=("Qwen3ForCausalLM",),
    model_types=("qwen3",),
    traits=qwen3_traits,
    gguf_architecture="qwen3",
)
