"""Linear layers over GGUF-quantized weights (Q4_0, Q4_1, Q8_0) in Triton.

Each program computes a [BLOCK_M, BLOCK_N] tile of ``x @ W.T``: per block of 32
input features it loads the tile's rows of the weight's bytes, de-quantizes them
in registers (scale, nibbles or signed bytes, Q4_1's min) and accumulates two
16-wide dot products in fp32. The weight stays in its blocks in memory.
"""

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType

from kernels.quantized_weight import QuantizedWeight

BLOCK_M = 16
BLOCK_N = 32


@triton.jit
def _half(row_bytes_ptr, offset):
    """The fp16 at byte ``offset`` of each row (little-endian), as fp32."""
    low = tl.load(row_bytes_ptr + offset).to(tl.uint16)
    high = tl.load(row_bytes_ptr + offset + 1).to(tl.uint16)
    return (low | (high << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _quantized_linear_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    rows, n, k, x_stride, row_bytes,
    SIGNED_BYTES: tl.constexpr, HAS_MIN: tl.constexpr, BLOCK_BYTES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    outputs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    half = tl.arange(0, 16)
    row_ok = m < rows
    out_ok = outputs < n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for block in range(0, k // 32):
        block_ptr = w_ptr + outputs.to(tl.int64) * row_bytes + block * BLOCK_BYTES
        scale = tl.where(out_ok, _half(block_ptr, 0), 0.0)[None, :]
        if SIGNED_BYTES:  # Q8_0
            first = tl.load(block_ptr[None, :] + 2 + half[:, None], mask=out_ok[None, :], other=0)
            second = tl.load(block_ptr[None, :] + 18 + half[:, None], mask=out_ok[None, :], other=0)
            w_first = first.to(tl.int8, bitcast=True).to(tl.float32) * scale
            w_second = second.to(tl.int8, bitcast=True).to(tl.float32) * scale
        else:  # Q4_0 / Q4_1: weight j in the low nibble of byte j, weight j + 16 in its high one
            start = 4 if HAS_MIN else 2
            nibbles = tl.load(
                block_ptr[None, :] + start + half[:, None], mask=out_ok[None, :], other=0
            ).to(tl.int32)
            zero = 0 if HAS_MIN else 8  # Q4_1 adds a min; Q4_0 centres on 8
            w_first = ((nibbles & 15) - zero).to(tl.float32) * scale
            w_second = ((nibbles >> 4) - zero).to(tl.float32) * scale
            if HAS_MIN:
                low = tl.where(out_ok, _half(block_ptr, 2), 0.0)[None, :]
                w_first += low
                w_second += low
        x_block = x_ptr + m[:, None].to(tl.int64) * x_stride + block * 32 + half[None, :]
        x_first = tl.load(x_block, mask=row_ok[:, None], other=0.0).to(tl.float32)
        x_second = tl.load(x_block + 16, mask=row_ok[:, None], other=0.0).to(tl.float32)
        acc += tl.dot(x_first, w_first, input_precision="ieee")
        acc += tl.dot(x_second, w_second, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + outputs, mask=out_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + m[:, None].to(tl.int64) * n + outputs[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & out_ok[None, :])


def quantized_linear(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """Same contract as ``kernels.reference.quantized_linear``."""
    leading = x.shape[:-1]
    x = x.reshape(-1, weight.in_features).contiguous()
    rows = x.shape[0]
    out = torch.empty((rows, weight.out_features), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(weight.out_features, BLOCK_N))
    _quantized_linear_kernel[grid](
        x, weight.data, x if bias is None else bias, out,
        rows, weight.out_features, weight.in_features, x.stride(0), weight.data.shape[1],
        SIGNED_BYTES=weight.ggml_type == GGMLQuantizationType.Q8_0,
        HAS_MIN=weight.ggml_type == GGMLQuantizationType.Q4_1, BLOCK_BYTES=weight.block_bytes,
        HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
    )  # fmt: skip
    return out.view(*leading, weight.out_features)
