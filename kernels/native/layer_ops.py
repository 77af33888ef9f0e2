"""RMSNorm, rotary embedding, SiLU- and GeLU-and-mul and the KV cache write through the native
library (see layer_ops.cpp). Same contracts as the torch references, which run
instead for a dtype or layout the library does not take."""

import ctypes
import functools

import torch

from kernels import reference
from kernels.native.build import NativeOp
from kernels.native.tensors import FP8_FORMATS, native_dtype, row_stride
from kernels.reference.experts import stacked_experts

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_rms_norm = NativeOp("rms_norm", _P, _I, _P, _I, _P, _I, _I, _F, _P, _P)
_rotary_embedding = NativeOp(
    "rotary_embedding", _P, _I, _P, _I, _I, _P, _I, _I, _P, _I, _I, ctypes.c_int32
)
_GATED = {
    "silu": NativeOp("silu_and_mul", _P, _I, _I, _P),
    "gelu_tanh": NativeOp("gelu_tanh_and_mul", _P, _I, _I, _P),
}
_GATED_REFERENCE = {"silu": reference.silu_and_mul, "gelu_tanh": reference.gelu_tanh_and_mul}
_WRITE_ARGS = (_P, _I, _P, _I, _P, _P, _P, _I, _I)
_write_kv_cache = NativeOp("write_kv_cache", *_WRITE_ARGS)
_FP8_WRITE_KV_CACHE = {
    dtype: NativeOp(f"write_kv_cache_{name}", *_WRITE_ARGS) for dtype, name in FP8_FORMATS.items()
}


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    given = (x, weight) if residual is None else (x, weight, residual)
    dtype = native_dtype(*given)
    x_stride = row_stride(x) if x.dim() == 2 else None
    residual_stride: int | None
    if residual is None:
        residual_stride = 0
    elif residual.shape == x.shape:
        residual_stride = row_stride(residual)
    else:
        residual_stride = None
    if (
        dtype is None
        or x_stride is None
        or residual_stride is None
        or weight.shape != x.shape[-1:]  # the reference raises; the kernel would overrun
        or not weight.is_contiguous()
    ):
        return reference.rms_norm(x, weight, eps, residual)
    rows, width = x.shape
    out = torch.empty((rows, width), dtype=dtype)
    new_residual = None if residual is None else torch.empty((rows, width), dtype=dtype)
    _rms_norm(
        dtype,
        x.data_ptr(),
        x_stride,
        None if residual is None else residual.data_ptr(),
        residual_stride,
        weight.data_ptr(),
        rows,
        width,
        eps,
        out.data_ptr(),
        None if new_residual is None else new_residual.data_ptr(),
    )
    return out, new_residual


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool = True,
) -> None:
    dtype = native_dtype(query, key)
    query_stride, key_stride = row_stride(query), row_stride(key)
    if (
        dtype is None
        or query_stride is None
        or key_stride is None
        or cos_sin_cache.dtype != torch.float32
        or not cos_sin_cache.is_contiguous()
    ):
        reference.rotary_embedding(positions, query, key, cos_sin_cache, head_size, is_neox)
        return
    num_tokens = positions.shape[0]
    positions = positions.to(torch.int64).contiguous()
    per_token = num_tokens * head_size
    _rotary_embedding(
        dtype,
        positions.data_ptr(),
        num_tokens,
        query.data_ptr(),
        query_stride,
        query.numel() // per_token if per_token else 0,
        key.data_ptr(),
        key_stride,
        key.numel() // per_token if per_token else 0,
        cos_sin_cache.data_ptr(),
        cos_sin_cache.shape[-1],
        head_size,
        int(is_neox),
    )


def _gated(activation: str, x: torch.Tensor) -> torch.Tensor:
    dtype = native_dtype(x)
    if dtype is None or x.shape[-1] % 2:  # an odd width: the reference raises
        return _GATED_REFERENCE[activation](x)
    x = x.contiguous()
    d = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], d), dtype=dtype)
    rows = out.numel() // d if d else 0
    _GATED[activation](dtype, x.data_ptr(), rows, d, out.data_ptr())
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _gated("silu", x)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _gated("gelu_tanh", x)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    op = _FP8_WRITE_KV_CACHE.get(key_cache.dtype, _write_kv_cache)
    cache = () if op is not _write_kv_cache else (key_cache, value_cache)
    dtype = native_dtype(key, value, *cache)
    key_stride, value_stride = row_stride(key), row_stride(value)
    if (
        dtype is None
        or value_cache.dtype != key_cache.dtype
        or key_stride is None
        or value_stride is None
        # Rows that do not match the cache's: the reference raises, the kernel would overrun.
        or key.shape[1:] != key_cache.shape[2:]
        or value.shape != key.shape
        or value_cache.shape != key_cache.shape
        or not key_cache.is_contiguous()
        or not value_cache.is_contiguous()
    ):
        reference.write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
        return
    slot_mapping = slot_mapping.to(torch.int64).contiguous()
    num_tokens = key.shape[0]
    op(
        dtype,
        key.data_ptr(),
        key_stride,
        value.data_ptr(),
        value_stride,
        key_cache.data_ptr(),
        value_cache.data_ptr(),
        slot_mapping.data_ptr(),
        num_tokens,
        key.numel() // num_tokens if num_tokens else 0,
    )


def fused_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    """The reference's grouping with this library's gated activation and torch's
    matmuls over the stacked weights (``worker.models.moe`` re-lays them out per
    expert for the native linear where it can)."""
    gated = functools.partial(_gated, activation)
    return stacked_experts(x, gate_up, down, topk_weights, topk_ids, gated)
