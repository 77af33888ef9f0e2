"""The one place that picks an implementation for each op.

CUDA tensors run the Triton kernels, CPU tensors run the torch references.
``GENFLEET_KERNELS=triton`` forces Triton everywhere (on CPU that needs
``TRITON_INTERPRET=1`` set before the process starts); ``GENFLEET_KERNELS=torch``
forces the references.
"""

import os
from types import ModuleType

import torch

from kernels import reference

_BACKENDS = ("auto", "torch", "triton")


def kernel_backend(device: torch.device) -> str:
    """Name of the implementation that ops on ``device`` run: "torch" or "triton"."""
    choice = os.environ.get("GENFLEET_KERNELS", "auto").lower()
    if choice not in _BACKENDS:
        raise ValueError(f"GENFLEET_KERNELS must be one of {_BACKENDS}, got {choice!r}")
    if choice == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return choice


def _impl(device: torch.device) -> ModuleType:
    if kernel_backend(device) == "triton":
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            # Triton's own helpers (tl.sum, tl.max, ...) are built when triton is
            # first imported, so the interpreter cannot be switched on from here.
            raise RuntimeError(
                "Triton kernels on CPU tensors need TRITON_INTERPRET=1 in the environment "
                "before the process starts"
            )
        from kernels import triton_ops  # imported lazily: triton is optional on CPU hosts

        return triton_ops
    return reference


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return _impl(query.device).paged_attention(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale
    )


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    _impl(key.device).write_kv_cache(key, value, key_cache, value_cache, slot_mapping)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    return _impl(x.device).rms_norm(x, weight, eps, residual)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool = True,
) -> None:
    _impl(query.device).rotary_embedding(positions, query, key, cos_sin_cache, head_size, is_neox)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _impl(x.device).silu_and_mul(x)
