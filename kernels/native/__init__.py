"""What CPU hosts run: every op compiled from C++ (built on first use with the
system compiler), falling back per call to the torch reference for a dtype or
layout the library does not take."""

from kernels.native.attention import paged_attention
from kernels.native.build import NativeKernelsUnavailable, load_library
from kernels.native.layer_ops import (
    fused_experts,
    gelu_tanh_and_mul,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
    write_kv_cache,
)
from kernels.native.quantized import dequantize, quantized_linear

__all__ = [
    "NativeKernelsUnavailable",
    "dequantize",
    "fused_experts",
    "gelu_tanh_and_mul",
    "load_library",
    "paged_attention",
    "quantized_linear",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "write_kv_cache",
]
