"""What CPU hosts run: every op compiled from C++ (built on first use with the
system compiler), falling back per call to the torch reference for a dtype or
layout the library does not take."""

from kernels.native.attention import paged_attention
from kernels.native.build import NativeKernelsUnavailable, load_library
from kernels.native.layer_ops import rms_norm, rotary_embedding, silu_and_mul, write_kv_cache

__all__ = [
    "NativeKernelsUnavailable",
    "load_library",
    "paged_attention",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "write_kv_cache",
]
