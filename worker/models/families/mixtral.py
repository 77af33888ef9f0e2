"""Mixtral: Mistral's layers with a mixture of experts in every layer's place of the
MLP (softmax router, top-k weights rescaled to sum to 1); the checkpoint names the
block ``block_sparse_moe`` and each expert's projections ``w1`` (gate), ``w3`` (up)
and ``w2`` (down)."""

import dataclasses

from transformers import PretrainedConfig

from worker.models.family import Family
from worker.models.traits import MoETraits, Traits, llama_traits


def mixtral_traits(config: PretrainedConfig) -> Traits:
    moe = MoETraits(
        experts=config.num_local_experts,
        top_k=config.num_experts_per_tok,
        intermediate=config.intermediate_size,
        sparse_layers=frozenset(range(config.num_hidden_layers)),
    )
    return dataclasses.replace(llama_traits(config), moe=moe)


FAMILY = Family(
    name="mixtral",
    architectures=("MixtralForCausalLM",),
    model_types=("mixtral",),
    traits=mixtral_traits,
    gguf_architecture="llama",
    checkpoint_renames=(
        (".block_sparse_moe.", ".mlp."),
        (".w1.", ".gate_proj."),
        (".w3.", ".up_proj."),
        (".w2.", ".down_proj."),
    ),
)
