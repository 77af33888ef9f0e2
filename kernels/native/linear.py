"""bfloat16 linear layers through the native library (see linear.cpp).

The weight is re-laid out once (``PackedBf16Weight``); ``bf16_linear`` then
streams it. Taken where the CPU has AVX512-BF16 (``bf16_linear_available``).
"""

import ctypes
from functools import cache

import torch

from kernels.native.build import NativeOp, load_library
from kernels.native.tensors import row_stride

_P, _I = ctypes.c_void_p, ctypes.c_int64
_pack = NativeOp("linear_pack", _P, _I, _I, _P)
_linear = NativeOp("linear", _P, _I, _I, _P, _P, _I, _I, _P)


@cache
def bf16_linear_available() -> bool:
    return bool(load_library().linear_available())


def _packed_size(out_features: int, in_features: int) -> int:
    """Elements of the packed layout (outputs padded to the kernel's group size)."""
    size = load_library().linear_packed_size_bfloat16
    size.argtypes, size.restype = [_I, _I], _I
    return size(out_features, in_features)


class PackedBf16Weight:
    """A [out_features, in_features] bf16 weight in the library's streaming layout."""

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dtype != torch.bfloat16 or weight.dim() != 2 or weight.shape[1] % 2:
            raise ValueError("the native linear takes 2-D bf16 weights with an even in_features")
        self.out_features, self.in_features = weight.shape
        size = _packed_size(self.out_features, self.in_features)
        self.data = torch.empty(size, dtype=torch.bfloat16)
        weight = weight.detach().contiguous()
        _pack(
            torch.bfloat16,
            weight.data_ptr(),
            self.out_features,
            self.in_features,
            self.data.data_ptr(),
        )


def bf16_linear(
    x: torch.Tensor, weight: PackedBf16Weight, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ W.T + bias`` for x [..., in_features] bf16, shaped like ``F.linear``'s
    result; fp32 accumulation, one rounding."""
    leading = x.shape[:-1]
    stride = row_stride(x)
    if stride is None or x.dim() != 2:
        x = x.reshape(-1, weight.in_features).contiguous()
        stride = weight.in_features
    if bias is not None:
        bias = bias.to(torch.bfloat16).contiguous()
    rows = x.shape[0]
    out = torch.empty((rows, weight.out_features), dtype=torch.bfloat16)
    _linear(
        torch.bfloat16,
        x.data_ptr(),
        stride,
        rows,
        weight.data.data_ptr(),
        None if bias is None else bias.data_ptr(),
        weight.out_features,
        weight.in_features,
        out.data_ptr(),
    )
    return out.view(*leading, weight.out_features)
