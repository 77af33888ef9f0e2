"""Granite: Llama's layers with multipliers on the embeddings, the residual branches
and the attention scores, and logits divided by ``logits_scaling``."""

import dataclasses

from transformers import PretrainedConfig

from worker.models.family import Family
from worker.models.traits import Traits, llama_traits


def granite_traits(config: PretrainedConfig) -> Traits:
    return dataclasses.replace(
        llama_traits(config),
        embedding_scale=config.embedding_multiplier,
        residual_scale=config.residual_multiplier,
        attention_scale=config.attention_multiplier,
        logits_scale=1.0 / config.logits_scaling,
    )


FAMILY = Family(
    name="granite",
    architectures=("GraniteForCausalLM",),
    model_types=("granite",),
    traits=granite_traits,
    gguf_architecture="granite",
)
