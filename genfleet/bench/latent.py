"""Multi-head latent attention's cache against the same model's full keys and values.

Per token, the engine's cache (``kv_cache_shape``, on a model built without weights)
for DeepSeek-V2-Lite's and DeepSeek-V3's published shapes, in bf16: one row per layer
of the latent and the shared rotary key, against what a cache of every head's keys
(non-rotary and rotary features) and values would hold.
"""

import math

import torch
from rich.table import Table
from transformers import DeepseekV2Config, DeepseekV3Config, PretrainedConfig

from worker.execution.model_runner import kv_cache_shape
from worker.models.decoder import CausalLM

SHAPES: dict[str, PretrainedConfig] = {
    "DeepSeek-V2-Lite": DeepseekV2Config(
        hidden_size=2048, num_hidden_layers=27, num_attention_heads=16,
        num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, num_experts_per_tok=6,
        moe_intermediate_size=1408, n_shared_experts=2, first_k_dense_replace=1,
        architectures=["DeepseekV2ForCausalLM"],
    ),
    "DeepSeek-V3": DeepseekV3Config(architectures=["DeepseekV3ForCausalLM"]),
}  # fmt: skip
BYTES = torch.bfloat16.itemsize


def latent_cache_table() -> Table:
    table = Table(title="KV cache bytes per token (bf16): latent rows against full K/V")
    for column in ("model", "latent", "full K/V", "share"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, config in SHAPES.items():
        with torch.device("meta"):
            model = CausalLM(config)
        latent = math.prod(kv_cache_shape(model, 1, 1)) * BYTES
        per_head = config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim
        full = config.num_hidden_layers * config.num_attention_heads * per_head * BYTES
        table.add_row(name, f"{latent:,}", f"{full:,}", f"1/{full / latent:.1f}")
    return table
