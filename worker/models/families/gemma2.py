"""Gemma 2: embeddings scaled by sqrt(hidden), norms of (1 + w) before and after both
attention and MLP, GeGLU (tanh), ``query_pre_attn_scalar``, attention and final logits
soft-capped, sliding-window and global layers alternating (``layer_types``)."""

import dataclasses

from transformers import PretrainedConfig

from worker.models.family import Family
from worker.models.traits import Traits, llama_traits


def gemma_traits(config: PretrainedConfig) -> Traits:
    """What Gemma 2 and 3 share."""
    return dataclasses.replace(
        llama_traits(config),
        norms="sandwich",
        norm_offset=1.0,
        activation="gelu_tanh",
        embedding_scale=config.hidden_size**0.5,
        attention_scale=config.query_pre_attn_scalar**-0.5,
    )


def gemma2_traits(config: PretrainedConfig) -> Traits:
    return dataclasses.replace(
        gemma_traits(config),
        attn_logit_softcap=config.attn_logit_softcapping or 0.0,
        final_logit_softcap=config.final_logit_softcapping or 0.0,
    )


FAMILY = Family(
    name="gemma2",
    architectures=("Gemma2ForCausalLM",),
    model_types=("gemma2",),
    traits=gemma2_traits,
    gguf_architecture="gemma2",
)
