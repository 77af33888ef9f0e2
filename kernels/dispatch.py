"""The one place that picks an implementation for each op.

CUDA tensors run the Triton kernels. CPU tensors run ``kernels.native``
(C++ built on first use with the host's compiler) or, where it cannot be
built, the torch references. ``GENFLEET_KERNELS`` forces one:
``triton`` (on CPU that needs ``TRITON_INTERPRET=1`` set before the process
starts), ``native`` (CPU only; a failed build is then an error) or ``torch``.
"""

import logging
import os
from collections.abc import Callable
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from kernels import reference
from kernels.quantized_weight import QuantizedWeight
from kernels.reference.experts import RunExpert

if TYPE_CHECKING:
    from kernels.chain_plan import ChainLayer, ChainShape
    from kernels.native.quantized import PackedWeight

# A float weight re-laid out once: x, bias -> x @ weight.T + bias.
PackedLinear = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]

_BACKENDS = ("auto", "torch", "native", "triton")
log = logging.getLogger(__name__)


@cache
def _native_builds() -> bool:
    from kernels.native import NativeKernelsUnavailable, load_library

    try:
        load_library()
    except NativeKernelsUnavailable as error:
        log.warning("native CPU kernels unavailable, running the torch references: %s", error)
        return False
    return True


def kernel_backend(device: torch.device) -> str:
    """Name of the implementation that ops on ``device`` run: "torch", "native" or "triton".

    Read for every op call (tests switch ``GENFLEET_KERNELS``); the answer is cached.
    """
    return _backend(os.environ.get("GENFLEET_KERNELS", "auto").lower(), device.type)


@cache
def _backend(choice: str, device_type: str) -> str:
    if choice not in _BACKENDS:
        raise ValueError(f"GENFLEET_KERNELS must be one of {_BACKENDS}, got {choice!r}")
    if choice == "auto":
        if device_type == "cuda":
            return "triton"
        return "native" if device_type == "cpu" and _native_builds() else "torch"
    if choice == "native" and device_type != "cpu":
        raise ValueError(f"GENFLEET_KERNELS=native runs on CPU tensors only, not {device_type}")
    return choice


def _impl(device: torch.device) -> ModuleType:
    backend = kernel_backend(device)
    if backend == "native":
        from kernels import native

        return native
    if backend == "triton":
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
    sliding_window: int = 0,
    logit_softcap: float = 0.0,
) -> torch.Tensor:
    return _impl(query.device).paged_attention(
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


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _impl(x.device).gelu_tanh_and_mul(x)


def fused_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    impl = _impl(x.device)
    return impl.fused_experts(x, gate_up, down, topk_weights, topk_ids, activation)


def grouped_experts(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, run_expert: RunExpert
) -> torch.Tensor:
    """``fused_experts`` over experts the caller runs (``run_expert(e, rows)``: weights
    re-laid out per expert); torch ops on any device."""
    return reference.grouped_experts(x, topk_weights, topk_ids, run_expert)


def quantized_linear(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    return _impl(x.device).quantized_linear(x, weight, bias)


def dequantize(weight: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    return _impl(weight.data.device).dequantize(weight, dtype)


# Weights re-laid out once for the CPU's native kernels; None where those do not run.


def _runs_native(device: torch.device) -> bool:
    return device.type == "cpu" and kernel_backend(device) == "native"


@cache
def _native_quantized() -> ModuleType:
    from kernels.native import quantized

    return quantized


def pack_bf16_weight(weight: torch.Tensor) -> PackedLinear | None:
    """A bf16 weight in the native kernel's streaming layout, where the CPU has
    AVX512-BF16 dot products."""
    if weight.dtype != torch.bfloat16 or weight.shape[1] % 2 or not _runs_native(weight.device):
        return None
    from kernels.native import linear

    if not linear.bf16_linear_available():
        return None
    packed = linear.PackedBf16Weight(weight)
    return lambda x, bias: linear.bf16_linear(x, packed, bias)


def pack_quantized_weight(weight: QuantizedWeight) -> "PackedWeight | None":
    """``weight``'s blocks in the native kernel's groups of 8 rows, for the formats it
    takes so (Q4_0, Q4_1, Q8_0)."""
    if not _runs_native(weight.data.device):
        return None
    native = _native_quantized()
    return native.PackedWeight(weight) if weight.ggml_type in native.PACKED_TYPES else None


def packed_quantized_linear(
    x: torch.Tensor,
    weight: "PackedWeight",
    bias: torch.Tensor | None,
    matmul_from_rows: int | None = None,
) -> torch.Tensor:
    """``quantized_linear`` over re-laid-out blocks; from ``matmul_from_rows`` rows the
    blocks are de-quantized a tile at a time and multiplied as floats."""
    return _native_quantized().packed_linear(x, weight, bias, matmul_from_rows)


# The decoder's layers, then its final norm, in one call: (embedded rows, positions,
# slot mapping, block tables, sequence lengths, query starts) -> normed hidden rows.
DecoderChain = Callable[..., torch.Tensor]


def decoder_chain(
    shape: "ChainShape", layers: "list[ChainLayer]", final_norm: torch.Tensor
) -> DecoderChain | None:
    """The plan's layers as one native call (``kernels/native/decoder_chain.cpp``), where
    the native CPU kernels run in float32 or bfloat16; None elsewhere."""
    if final_norm.dtype not in (torch.float32, torch.bfloat16) or not _runs_native(
        final_norm.device
    ):
        return None
    from kernels.native.chain import DecoderChain as NativeChain

    return NativeChain(shape, layers, final_norm)
