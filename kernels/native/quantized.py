"""Linear layers over GGUF-quantized weights through the native library
(see quantized_linear.cpp).

Few rows (decoding): the library's integer dot products over the blocks, which
read each weight once in its 4.5 to 8.5 bits. Weights are re-laid out once
(``PackedWeight``: the same bytes in groups of 8 rows) for the kernel that
advances 8 rows per instruction. Many rows (a prefill chunk): the
matmul is compute-bound, so the weight can be de-quantized a tile of output rows
at a time and multiplied by torch's float matmul. For re-laid-out weights the
caller says from how many rows (the load times it: ``worker/models/linear.py``).
"""

import copy
import ctypes
from collections.abc import Callable
from functools import cache

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType

from kernels.native.build import NativeOp, load_library
from kernels.native.tensors import native_dtype, row_stride
from kernels.quantized_weight import QuantizedWeight
from kernels.reference import quantized as reference

_P, _I, _T = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
_linear = NativeOp("quantized_linear", _T, _P, _I, _I, _P, _P, _I, _I, _P)
_dequantize = NativeOp("dequantize", _T, _P, _I, _I, _P)
_packed_linear = NativeOp("packed_linear", _T, _P, _I, _I, _P, _P, _I, _I, _P)
_packed_dequantize = NativeOp("packed_dequantize", _T, _P, _I, _P, _I, _P)

PACKED_TYPES = (
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.Q8_0,
)
GROUP_ROWS = 8  # output rows per packed group
# Rows from which de-quantize-then-matmul beats the row-by-row kernel (blocks as
# stored: the K-quants, which keep no other form; docs/benchmarks.md, "Quantized weights").
MATMUL_ROWS = 32
# Weights de-quantized at once on the matmul path: 4 MiB of fp32, about a core's L2.
TILE_ELEMENTS = 1 << 20


class PackedWeight:
    """A Q4_0, Q4_1 or Q8_0 weight in the library's groups of 8 rows (the same bytes)."""

    def __init__(self, weight: QuantizedWeight) -> None:
        if weight.ggml_type not in PACKED_TYPES:
            raise ValueError(f"only {[t.name for t in PACKED_TYPES]} weights are re-laid out")
        library = load_library()
        size = library.packed_bytes
        size.argtypes, size.restype = [_T, _I, _I], _I
        pack = library.pack
        pack.argtypes, pack.restype = [_T, _P, _I, _I, _P], None
        self.ggml_type = weight.ggml_type
        self.out_features, self.in_features = weight.out_features, weight.in_features
        self.group_bytes = weight.in_features // 32 * weight.block_bytes * GROUP_ROWS
        self.data = torch.empty(
            size(int(self.ggml_type), self.out_features, self.in_features), dtype=torch.uint8
        )
        source = weight.data.contiguous()
        pack(int(self.ggml_type), source.data_ptr(), self.out_features, self.in_features,
             self.data.data_ptr())  # fmt: skip

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def head(self, rows: int) -> "PackedWeight":
        """The first ``rows`` output rows (whole groups), sharing these bytes."""
        head = copy.copy(self)
        head.out_features = min(self.out_features, -(-rows // GROUP_ROWS) * GROUP_ROWS)
        head.data = self.data[: head.out_features // GROUP_ROWS * self.group_bytes]
        return head

    def dequantize_rows(self, first: int, last: int, out: torch.Tensor) -> torch.Tensor:
        """Rows [first, last) in ``out``'s dtype (``first`` a multiple of 8)."""
        data = self.data[first // GROUP_ROWS * self.group_bytes :]
        _packed_dequantize(out.dtype, int(self.ggml_type), data.data_ptr(), self.in_features,
                           None, last - first, out.data_ptr())  # fmt: skip
        return out.view(last - first, self.in_features)

    def rows(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The rows at ``index`` (an embedding lookup), de-quantized to ``dtype``."""
        index = index.to(torch.int64).contiguous()
        out = torch.empty((index.numel(), self.in_features), dtype=dtype)
        _packed_dequantize(dtype, int(self.ggml_type), self.data.data_ptr(), self.in_features,
                           index.data_ptr(), index.numel(), out.data_ptr())  # fmt: skip
        return out


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
    return out.view(weight.out_features, weight.in_features)


@cache
def _tile_buffer(dtype: torch.dtype) -> torch.Tensor:
    """One tile's room, allocated once: a fresh buffer per call would cost page faults."""
    return torch.empty(TILE_ELEMENTS, dtype=dtype)


def _tiled_matmul(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out_features: int,
    in_features: int,
    dequantize_rows: Callable[[int, int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``x @ W.T + bias``, W de-quantized ``dequantize_rows(first, last, buffer)`` a tile
    (a multiple of 8 rows) at a time."""
    rows_per_tile = max(GROUP_ROWS, TILE_ELEMENTS // in_features // GROUP_ROWS * GROUP_ROWS)
    buffer = _tile_buffer(x.dtype)
    if rows_per_tile * in_features > buffer.numel():
        buffer = torch.empty(rows_per_tile * in_features, dtype=x.dtype)
    tiles = []
    for first in range(0, out_features, rows_per_tile):
        last = min(first + rows_per_tile, out_features)
        tile = dequantize_rows(first, last, buffer[: (last - first) * in_features])
        tiles.append(F.linear(x, tile, None if bias is None else bias[first:last]))
    return tiles[0] if len(tiles) == 1 else torch.cat(tiles, dim=-1)


def _gguf_rows(weight: QuantizedWeight) -> Callable[[int, int, torch.Tensor], torch.Tensor]:
    def rows(first: int, last: int, out: torch.Tensor) -> torch.Tensor:
        part = QuantizedWeight(weight.ggml_type, weight.data[first:last], last - first,
                               weight.in_features)  # fmt: skip
        return dequantize(part, out.dtype, out)

    return rows


def _linear_rows(
    x: torch.Tensor, bias: torch.Tensor | None, out_features: int, in_features: int,
    run: NativeOp, ggml_type: GGMLQuantizationType, data: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """The integer-dot-product kernel ``run`` over x's rows."""
    stride = row_stride(x)
    if stride is None:
        x, stride = x.contiguous(), in_features
    out = torch.empty((x.shape[0], out_features), dtype=x.dtype)
    run(
        x.dtype, int(ggml_type), x.data_ptr(), stride, x.shape[0], data.data_ptr(),
        None if bias is None else bias.contiguous().data_ptr(),
        out_features, in_features, out.data_ptr(),
    )  # fmt: skip
    return out


def quantized_linear(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """Same contract as ``kernels.reference.quantized_linear``."""
    if native_dtype(x) is None or (bias is not None and bias.dtype != x.dtype):
        return reference.quantized_linear(x, weight, bias)
    leading = x.shape[:-1]
    x = x.reshape(-1, weight.in_features)
    n, k = weight.out_features, weight.in_features
    if x.shape[0] >= MATMUL_ROWS:
        out = _tiled_matmul(x, bias, n, k, _gguf_rows(weight))
    else:
        out = _linear_rows(x, bias, n, k, _linear, weight.ggml_type, weight.data.contiguous())
    return out.view(*leading, n)


def packed_linear(
    x: torch.Tensor,
    weight: PackedWeight,
    bias: torch.Tensor | None,
    matmul_from_rows: int | None = None,
) -> torch.Tensor:
    """``quantized_linear`` over a re-laid-out weight; x float32 or bfloat16. From
    ``matmul_from_rows`` rows of x (never when None) de-quantized tiles and a matmul."""
    leading = x.shape[:-1]
    x = x.reshape(-1, weight.in_features)
    n, k = weight.out_features, weight.in_features
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    if matmul_from_rows is not None and x.shape[0] >= matmul_from_rows:
        out = _tiled_matmul(x, bias, n, k, weight.dequantize_rows)
    else:
        out = _linear_rows(x, bias, n, k, _packed_linear, weight.ggml_type, weight.data)
    return out.view(*leading, n)
