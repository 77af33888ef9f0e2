"""Compute ops for the engine: one dispatch point; per op a torch reference,
a Triton kernel (CUDA) and a native C++ one (CPU hosts).

Every op has the same signature in every implementation; the engine imports
only the names below and never chooses an implementation itself.
"""

from kernels.dispatch import (
    dequantize,
    kernel_backend,
    paged_attention,
    quantized_linear,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
    write_kv_cache,
)

__all__ = [
    "dequantize",
    "kernel_backend",
    "paged_attention",
    "quantized_linear",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "write_kv_cache",
]
