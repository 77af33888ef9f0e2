"""Linear layers over GGUF-quantized weights through the native library
(see quantized_linear.cpp).

Few rows (decoding): the library's integer dot products over the blocks, which
read each weight once in its 4.5 to 8.5 bits. Many rows (a prefill chunk): the
matmul is compute-bound, so the weight is de-quantized a tile of output rows at
a time and multiplied by torch's float matmul.
"""

import ctypes
from functools import cache

import torch
import torch.nn.functional as F

from kernels.native.build import NativeOp
from kernels.native.tensors import native_dtype, row_stride
from kernels.quantized_weight import QuantizedWeight
from kernels.reference import quantized as reference

_P, _I, _T = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
_linear = NativeOp("quantized_linear", _T, _P, _I, _I, _P, _P, _I, _I, _P)
_dequantize = NativeOp("dequantize", _T, _P, _I, _I, _P)

# Rows from which de-quantize-then-matmul beats the integer dot products
# (docs/benchmarks.md, "Quantized weights").
MATMUL_ROWS = 32
# Weights de-quantized at once on the matmul path: 4 MiB of fp32, about a core's L2.
TILE_ELEMENTS = 1 << 20


def dequantize(
    weight: QuantizedWeight, dtype: torch.dtype, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The weights in ``dtype``, written to ``out`` when given (rows of ``in_features``)."""
    if dtype not in (torch.float32, torch.bfloat16):
        return reference.dequantize(weight, dtype)
    if out is None:
        out = torch.empty((weight.out_features, weight.in_features), dtype=dtype)
    data = weight.data.contiguous()
    _dequantize(
        dtype, int(weight.ggml_type), data.data_ptr(), weight.out_features,
        weight.in_features, out.data_ptr(),
    )  # fmt: skip
    return out


@cache
def _tile_buffer(dtype: torch.dtype) -> torch.Tensor:
    """One tile's room, allocated once: a fresh buffer per call would cost page faults."""
    return torch.empty(TILE_ELEMENTS, dtype=dtype)


def _tiled_matmul(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    rows_per_tile = max(1, TILE_ELEMENTS // weight.in_features)
    buffer = _tile_buffer(x.dtype)
    tiles = []
    for first in range(0, weight.out_features, rows_per_tile):
        last = min(first + rows_per_tile, weight.out_features)
        part = QuantizedWeight(weight.ggml_type, weight.data[first:last], last - first,
                               weight.in_features)  # fmt: skip
        tile = dequantize(part, x.dtype, buffer[: part.out_features * part.in_features])
        tile = tile.view(part.out_features, part.in_features)
        tiles.append(F.linear(x, tile, None if bias is None else bias[first:last]))
    return tiles[0] if len(tiles) == 1 else torch.cat(tiles, dim=-1)


def quantized_linear(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """Same contract as ``kernels.reference.quantized_linear``."""
    if native_dtype(x) is None or (bias is not None and bias.dtype != x.dtype):
        return reference.quantized_linear(x, weight, bias)
    leading = x.shape[:-1]
    x = x.reshape(-1, weight.in_features)
    if x.shape[0] >= MATMUL_ROWS:
        return _tiled_matmul(x, weight, bias).view(*leading, weight.out_features)
    stride = row_stride(x)
    if stride is None:
        x, stride = x.contiguous(), weight.in_features
    out = torch.empty((x.shape[0], weight.out_features), dtype=x.dtype)
    data = weight.data.contiguous()
    _linear(
        x.dtype, int(weight.ggml_type), x.data_ptr(), stride, x.shape[0], data.data_ptr(),
        None if bias is None else bias.contiguous().data_ptr(),
        weight.out_features, weight.in_features, out.data_ptr(),
    )  # fmt: skip
    return out.view(*leading, weight.out_features)
