"""SmolLM3: Llama's layers, every layer ``no_rope_layers`` marks 0 without rotary
embeddings (by default every fourth)."""

import dataclasses

from transformers import PretrainedConfig

from worker.models.family import Family
from worker.models.traits import LayerTraits, Traits, llama_traits, sliding_windows


def smollm3_traits(config: PretrainedConfig) -> Traits:
    layers = tuple(
        LayerTraits(sliding_window=window, rope="default" if uses_rope else None)
        for window, uses_rope in zip(sliding_windows(config), config.no_rope_layers, strict=True)
    )
    return dataclasses.replace(llama_traits(config), layers=layers)


FAMILY = Family(
    name="smollm3",
    architectures=("SmolLM3ForCausalLM",),
    model_types=("smollm3",),
    traits=smollm3_traits,
    gguf_architecture="smollm3",
)
