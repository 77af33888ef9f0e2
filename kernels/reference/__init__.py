"""Pure-torch reference implementations: the oracle every other implementation is
tested against, and the fallback where neither the native nor the Triton ops run."""

from kernels.reference.activation import gelu_tanh_and_mul, silu_and_mul
from kernels.reference.attention import paged_attention
from kernels.reference.cache import write_kv_cache
from kernels.reference.experts import fused_experts, grouped_experts
from kernels.reference.norm import rms_norm
from kernels.reference.quantized import dequantize, quantized_linear
from kernels.reference.rotary import rotary_embedding

__all__ = [
    "dequantize",
    "fused_experts",
    "gelu_tanh_and_mul",
    "grouped_experts",
    "paged_attention",
    "quantized_linear",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "write_kv_cache",
]
