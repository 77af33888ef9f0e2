"""How the native ops see torch tensors: element type and row layout.

These checks run once per op call, so they stay cheap for the usual case
(2-D tensors whose rows are contiguous) and only then look closer.
"""

import torch

from kernels.native.build import DTYPE_SUFFIXES

# The fp8 KV-cache formats the library reads and writes, by their entry points' names.
FP8_FORMATS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


def native_dtype(*tensors: torch.Tensor) -> torch.dtype | None:
    """The tensors' common dtype if the library has entry points for it, else None."""
    dtype = tensors[0].dtype
    if dtype in DTYPE_SUFFIXES and all(t.dtype == dtype for t in tensors):
        return dtype
    return None


def row_stride(tensor: torch.Tensor) -> int | None:
    """Elements between rows (first dim) when each row is one contiguous run, else None."""
    if tensor.dim() == 0:
        return None
    strides = tensor.stride()
    if tensor.is_contiguous():
        return strides[0]
    expected = 1
    for size, stride in zip(reversed(tensor.shape[1:]), reversed(strides[1:]), strict=True):
        if size > 1 and stride != expected:
            return None
        expected *= size
    return strides[0]
