"""Qwen2: biases on q, k and v (not on the output projection); sliding windows on the
layers ``layer_types`` names when ``use_sliding_window``."""

import dataclasses

from transformers import PretrainedConfig

from worker.models.family import Family
from worker.models.traits import Traits, llama_traits


def qwen2_traits(config: PretrainedConfig) -> Traits:
    return dataclasses.replace(llama_traits(config), qkv_bias=True, o_bias=False)


FAMILY = Family(
    name="qwen2",
    architectures=("Qwen2ForCausalLM",),
    model_types=("qwen2",),
    traits=qwen2_traits,
    gguf_architecture="qwen2",
)
