"""Paged attention on CPU tensors through the native library (see paged_attention.cpp)."""

import ctypes

import torch

from kernels.native.build import NativeOp
from kernels.native.tensors import FP8_FORMATS, native_dtype, row_stride
from kernels.reference import paged_attention as reference_paged_attention

_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGS = (_P, _I, *[_P] * 5, *[_I] * 7, ctypes.c_float, _I, ctypes.c_float, _P)
# By the cache's element type: the query's own, or an fp8 format.
_paged_attention = NativeOp("paged_attention", *_ARGS)
_FP8_PAGED_ATTENTION = {
    dtype: NativeOp(f"paged_attention_{name}", *_ARGS) for dtype, name in FP8_FORMATS.items()
}


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int = 0,
    logit_softcap: float = 0.0,
) -> torch.Tensor:
    """Same contract as ``kernels.reference.paged_attention``; query rows may be strided.
    The kernel reads value rows where key rows lie: a cache of the keys' layout, or a
    view of the keys' own first features (multi-head latent attention)."""
    op = _FP8_PAGED_ATTENTION.get(key_cache.dtype, _paged_attention)
    cache = () if op is not _paged_attention else (key_cache, value_cache)
    dtype = native_dtype(query, *cache)
    query_stride = row_stride(query)
    value_size = value_cache.shape[-1]
    if (
        dtype is None
        or query_stride is None
        or value_cache.dtype != key_cache.dtype
        or not key_cache.is_contiguous()
        or value_cache.stride() != key_cache.stride()
        or value_cache.shape[:-1] != key_cache.shape[:-1]
        or value_size > key_cache.shape[-1]
    ):
        return reference_paged_attention(
            query,
            key_cache,
            value_cache,
            block_tables,
            seq_lens,
            query_start_loc,
            scale,
            sliding_window,
            logit_softcap,
        )
    block_tables = block_tables.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int64).contiguous()
    query_start_loc = query_start_loc.to(torch.int64).contiguous()
    num_tokens, num_heads, head_size = query.shape
    out = torch.empty((num_tokens, num_heads, value_size), dtype=dtype)
    _, block_size, num_kv_heads, _ = key_cache.shape
    op(
        dtype,
        query.data_ptr(),
        query_stride,
        key_cache.data_ptr(),
        value_cache.data_ptr(),
        block_tables.data_ptr(),
        seq_lens.data_ptr(),
        query_start_loc.data_ptr(),
        block_tables.shape[0],
        num_heads,
        num_kv_heads,
        head_size,
        value_size,
        block_size,
        block_tables.shape[1],
        scale,
        sliding_window,
        logit_softcap,
        out.data_ptr(),
    )
    return out
