"""Qwen2-MoE and Qwen3-MoE: Qwen2's and Qwen3's attention with a mixture of experts on
the layers ``decoder_sparse_step`` picks and ``mlp_only_layers`` does not (a dense
MLP of ``intermediate_size`` on the others). Qwen2-MoE adds a shared expert every
token goes through, gated by sigmoid(``shared_expert_gate``), and keeps the top-k
softmax weights as they are unless ``norm_topk_prob``."""

import dataclasses

from transformers import PretrainedConfig

from worker.models.families.qwen2 import qwen2_traits
from worker.models.families.qwen3 import qwen3_traits
from worker.models.family import Family
from worker.models.traits import MoETraits, Traits


def _moe(config: PretrainedConfig) -> MoETraits:
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
    return MoETraits(
        experts=config.num_experts,
        top_k=config.num_experts_per_tok,
        intermediate=config.moe_intermediate_size,
        sparse_layers=frozenset(
            i
            for i in range(config.num_hidden_layers)
            if i not in dense and config.num_experts > 0 and (i + 1) % step == 0
        ),
        renormalize=bool(config.norm_topk_prob),
        shared_intermediate=shared,
        shared_gate=shared > 0,
    )


def qwen2_moe_traits(config: PretrainedConfig) -> Traits:
    qkv_bias = bool(getattr(config, "qkv_bias", True))
    return dataclasses.replace(qwen2_traits(config), qkv_bias=qkv_bias, moe=_moe(config))


def qwen3_moe_traits(config: PretrainedConfig) -> Traits:
    return dataclasses.replace(qwen3_traits(config), moe=_moe(config))


QWEN2_MOE = Family(
    name="qwen2_moe",
    architectures=("Qwen2MoeForCausalLM",),
    model_types=("qwen2_moe",),
    traits=qwen2_moe_traits,
    gguf_architecture="qwen2moe",
)
QWEN3_MOE = Family(
    name="qwen3_moe",
    architectures=("Qwen3MoeForCausalLM",),
    model_types=("qwen3_moe",),
    traits=qwen3_moe_traits,
    gguf_architecture="qwen3moe",
)
