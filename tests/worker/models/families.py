"""A tiny random config of every supported family beyond the Llama kinds of
``tests/conftest.py``, each with what sets it apart turned on."""

import torch
import transformers
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GraniteConfig,
    GraniteForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

# Shorter than most test prompts (up to 90 tokens, plus the outputs).
WINDOW = 24
GEMMA = {
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "sliding_window": WINDOW,
    "layer_types": ["sliding_attention", "full_attention"],
    "tie_word_embeddings": True,
}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
# Multi-head latent attention over a 32-feature latent and 8 rotary features per token
# (4 heads of 16 + 8 query/key and 16 value features), then 8 experts in 2 groups.
DEEPSEEK = {
    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
    "num_key_value_heads": 4,  # as DeepSeek's configs say (transformers repeats by it)
}  # fmt: skip
YARN = {
    "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
    "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0,
}  # fmt: skip


class DeepseekV3ForCausalLM(transformers.DeepseekV3ForCausalLM):
    """DeepSeek V3 as trained, with a router correction bias that moves the choice of
    experts (transformers starts it at zeros). Named as the original: the name is
    what the saved config's ``architectures`` says."""

    def __init__(self, config: DeepseekV3Config) -> None:
        super().__init__(config)
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for layer in self.model.layers:
                router = getattr(layer.mlp, "gate", None)
                if router is not None:
                    bias = router.e_score_correction_bias
                    bias.copy_(torch.randn(bias.shape, generator=generator) * 0.2)


FAMILY_MODELS: dict[str, tuple[type, type, dict]] = {
    "mistral-window": (MistralConfig, MistralForCausalLM, {"sliding_window": WINDOW}),
    "qwen2-window": (
        Qwen2Config,
        Qwen2ForCausalLM,
        # Layers from max_window_layers on slide: the first is full, the second slides.
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 32, "tie_word_embeddings": True}),
    "gemma2": (
        Gemma2Config,
        Gemma2ForCausalLM,
        {**GEMMA, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0},
    ),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, GEMMA),
    "phi3": (
        Phi3Config,
        Phi3ForCausalLM,
        {"partial_rotary_factor": 0.5, "tie_word_embeddings": False, "pad_token_id": 0},
    ),
    "olmo2": (Olmo2Config, Olmo2ForCausalLM, {"tie_word_embeddings": False}),
    "granite": (
        GraniteConfig,
        GraniteForCausalLM,
        {
            "embedding_multiplier": 6.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.2,
            "logits_scaling": 0.5,
        },
    ),
    "smollm3": (SmolLM3Config, SmolLM3ForCausalLM, {"no_rope_layers": [1, 0]}),
    # Mixtures of experts: four experts, two per token.
    "mixtral": (
        MixtralConfig,
        MixtralForCausalLM,
        {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    ),
    "qwen2-moe": (
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        # The first layer dense; the top-2 weights kept as the softmax gave them.
        {**MOE, "shared_expert_intermediate_size": 96, "mlp_only_layers": [0]},
    ),
    "qwen3-moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, {**MOE, "norm_topk_prob": True}),
    # q from one projection, softmax router limited to the best group.
    "deepseek-v2": (
        DeepseekV2Config,
        DeepseekV2ForCausalLM,
        {**DEEPSEEK, "q_lora_rank": None, "topk_method": "group_limited_greedy"},
    ),
    # q through its low-rank projection, sigmoid router with its bias, yarn's mscale.
    "deepseek-v3": (
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        {**DEEPSEEK, "q_lora_rank": 64, "rope_parameters": YARN},
    ),
}
FAMILY_KINDS = tuple(FAMILY_MODELS)
MOE_KINDS = ("mixtral", "qwen2-moe", "qwen3-moe", "deepseek-v2", "deepseek-v3")
