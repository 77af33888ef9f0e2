"""Gemma 3 (text): Gemma 2's layers with a per-head RMSNorm of q and k instead of
soft-capping, and local (sliding) layers rotated with a rope base of their own."""

import dataclasses

from transformers import PretrainedConfig

from worker.models.families.gemma2 import gemma_traits
from worker.models.family import Family
from worker.models.traits import LayerTraits, Traits, sliding_windows


def gemma3_traits(config: PretrainedConfig) -> Traits:
    layers = tuple(
        LayerTraits(sliding_window=window, rope=kind)
        for window, kind in zip(sliding_windows(config), config.layer_types, strict=True)
    )
    return dataclasses.replace(
        gemma_traits(config),
        layers=layers,
        qk_norm="head",
        attn_logit_softcap=config.attn_logit_softcapping or 0.0,
        final_logit_softcap=config.final_logit_softcapping or 0.0,
        rope_tables=tuple(sorted(set(config.layer_types))),
    )


FAMILY = Family(
    name="gemma3",
    architectures=("Gemma3ForCausalLM",),
    model_types=("gemma3_text",),
    traits=gemma3_traits,
    gguf_architecture="gemma3",
)
