"""DeepSeek V2 and V3: multi-head latent attention (``worker.models.latent_attention``)
with rotary over interleaved pairs, and a mixture of experts from layer
``first_k_dense_replace`` on (every ``moe_layer_freq``-th), with ``n_shared_experts``
experts' worth of shared MLP every token goes through.

V2's router: a softmax, top-k kept as it gave them (no rescaling), limited to the
token's best ``topk_group`` groups of experts (a group scored by its best expert)
where ``topk_method`` is ``group_limited_greedy``. V3's: sigmoid scores, a learned
correction bias that picks but does not weigh, groups scored by their best two,
the chosen weights rescaled to sum to 1 (``norm_topk_prob``). Both times
``routed_scaling_factor``. Under yarn, softmax scale times mscale(factor,
``mscale_all_dim``) squared.

The checkpoint names the shared MLP ``shared_experts`` and V3's bias
``gate.e_score_correction_bias``; V3's multi-token-prediction layers (past
``num_hidden_layers``) are not served and are skipped at load. llama.cpp writes both
as ``deepseek2``, a config transformers does not read from the file: a GGUF needs the
model's config.json beside it (``worker.models.gguf``)."""

import dataclasses
import math

from transformers import PretrainedConfig

from worker.models.family import Family
from worker.models.rotary import rope_parameters
from worker.models.traits import LatentTraits, MoETraits, Traits, llama_traits


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _attention_scale(config: PretrainedConfig) -> float:
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    rope = rope_parameters(config)
    if rope["rope_type"] != "default" and rope.get("mscale_all_dim"):
        scale *= _yarn_mscale(rope["factor"], rope["mscale_all_dim"]) ** 2
    return scale


def _moe(config: PretrainedConfig, v3: bool) -> MoETraits:
    freq = getattr(config, "moe_layer_freq", 1) or 1
    first_sparse = config.first_k_dense_replace
    grouped = v3 or config.topk_method == "group_limited_greedy"
    return MoETraits(
        experts=config.n_routed_experts,
        top_k=config.num_experts_per_tok,
        intermediate=config.moe_intermediate_size,
        sparse_layers=frozenset(
            i for i in range(first_sparse, config.num_hidden_layers) if i % freq == 0
        ),
        renormalize=v3 and bool(config.norm_topk_prob),
        shared_intermediate=config.moe_intermediate_size * (config.n_shared_experts or 0),
        scoring="sigmoid" if v3 else "softmax",
        groups=(config.n_group or 1) if grouped else 1,
        top_groups=(config.topk_group or 1) if grouped else 1,
        group_score="top2_sum" if v3 else "max",
        routed_scaling=config.routed_scaling_factor,
        correction_bias=v3,
    )


def _deepseek_traits(config: PretrainedConfig, v3: bool) -> Traits:
    latent = LatentTraits(
        kv_lora_rank=config.kv_lora_rank,
        q_lora_rank=config.q_lora_rank or 0,
        nope_dim=config.qk_nope_head_dim,
        rope_dim=config.qk_rope_head_dim,
        value_dim=config.v_head_dim,
    )
    return dataclasses.replace(
        llama_traits(config),
        head_dim=config.qk_rope_head_dim,  # the rotary table's width
        attention_scale=_attention_scale(config),
        interleaved_rope=not v3 or bool(getattr(config, "rope_interleave", True)),
        moe=_moe(config, v3),
        latent=latent,
    )


def deepseek_v2_traits(config: PretrainedConfig) -> Traits:
    return _deepseek_traits(config, v3=False)


def deepseek_v3_traits(config: PretrainedConfig) -> Traits:
    return _deepseek_traits(config, v3=True)


RENAMES = (
    (".mlp.shared_experts.", ".mlp.shared_expert."),
    (".mlp.gate.e_score_correction_bias", ".mlp.e_score_correction_bias"),
)
DEEPSEEK_V2 = Family(
    name="deepseek_v2",
    architectures=("DeepseekV2ForCausalLM",),
    model_types=("deepseek_v2",),
    traits=deepseek_v2_traits,
    checkpoint_renames=RENAMES,
)
DEEPSEEK_V3 = Family(
    name="deepseek_v3",
    architectures=("DeepseekV3ForCausalLM",),
    model_types=("deepseek_v3",),
    traits=deepseek_v3_traits,
    checkpoint_renames=RENAMES,
)
