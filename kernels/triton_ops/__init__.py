"""Triton implementations of every op in ``kernels``, with the references' signatures.

What CUDA devices run. On a CPU they run only under Triton's interpreter
(``TRITON_INTERPRET=1``, set by the tests): that is how they are verified here.
"""

from kernels.reference.quantized import dequantize  # torch ops: they run on any device
from kernels.triton_ops.activation import gelu_tanh_and_mul, silu_and_mul
from kernels.triton_ops.attention import paged_attention
from kernels.triton_ops.cache import write_kv_cache
from kernels.triton_ops.experts import fused_experts
from kernels.triton_ops.norm import rms_norm
from kernels.triton_ops.quantized import quantized_linear
from kernels.triton_ops.rotary import rotary_embedding

__all__ = [
    "dequantize",
    "fused_experts",
    "gelu_tanh_and_mul",
    "paged_attention",
    "quantized_linear",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "write_kv_cache",
]
