"""Compute ops for the engine: one dispatch point; per op a torch reference,
a Triton kernel (CUDA) and a native C++ one (CPU hosts).

Every op has the same signature in every implementation; the engine imports
only the names below and never chooses an implementation itself.
"""

from typing import TYPE_CHECKING

from kernels.chain_plan import CHAIN_PARTS, ChainLayer, ChainProjection, ChainShape
from kernels.dispatch import (
    DecoderChain,
    PackedLinear,
    decoder_chain,
    dequantize,
    fused_experts,
    gelu_tanh_and_mul,
    grouped_experts,
    kernel_backend,
    pack_bf16_weight,
    pack_quantized_weight,
    packed_quantized_linear,
    paged_attention,
    quantized_linear,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
    write_kv_cache,
)

if TYPE_CHECKING:
    from kernels.native.quantized import PackedWeight

__all__ = [
    "CHAIN_PARTS",
    "ChainLayer",
    "ChainProjection",
    "ChainShape",
    "DecoderChain",
    "PackedLinear",
    "PackedWeight",
    "decoder_chain",
    "dequantize",
    "fused_experts",
    "gelu_tanh_and_mul",
    "grouped_experts",
    "kernel_backend",
    "pack_bf16_weight",
    "pack_quantized_weight",
    "packed_quantized_linear",
    "paged_attention",
    "quantized_linear",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "write_kv_cache",
]
