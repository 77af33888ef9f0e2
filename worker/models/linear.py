"""Linear layers whose weights are re-laid out once for the CPU.

On CPU hosts the small-batch matmuls of decoding are a stream over the
weights, and the plain row-major weight is not the fastest way to read them:
- bf16 on a CPU with AVX512-BF16: the native kernel's streaming layout
  (``kernels.native.linear``): 2.4x oneDNN at one row, about equal at 512;
- otherwise oneDNN's blocked layout, 1.5x (bf16) to 2x (fp32) ``F.linear``.
The packed copy is made after the weights are loaded; on other devices, or
where neither applies, the layer is a plain ``nn.Linear``. A layer loaded from
GGUF blocks (``use_quantized``) holds only those and runs ``quantized_linear``;
on CPU hosts its blocks are re-laid out for the native kernel that advances 8
rows at once (2.4x the blocks as stored, at one row), and the stored form is
dropped.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kernels import kernel_backend, quantized_linear
from kernels.quantized_weight import QuantizedWeight

if TYPE_CHECKING:
    from kernels.native.quantized import PackedWeight

# oneDNN picks its blocking for this batch size; decode batches are about this big.
PACK_BATCH_HINT = 32

PackedLinear = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


def _native_bf16(weight: torch.Tensor) -> PackedLinear | None:
    if weight.dtype != torch.bfloat16 or weight.shape[1] % 2:
        return None
    from kernels.native.linear import PackedBf16Weight, bf16_linear, bf16_linear_available

    if not bf16_linear_available():
        return None
    packed = PackedBf16Weight(weight)
    return lambda x, bias: bf16_linear(x, packed, bias)


def _onednn(weight: torch.Tensor) -> PackedLinear | None:
    if not torch.backends.mkldnn.is_available():
        return None
    if weight.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None  # oneDNN refuses bf16 without AVX-512 (or AVX-NE-CONVERT): F.linear

    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)
    return lambda x, bias: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack_quantized(weight: QuantizedWeight) -> "PackedWeight | None":
    """``weight`` re-laid out for the native kernel's 8-row groups, where that runs."""
    from kernels.native.quantized import PACKED_TYPES, PackedWeight

    if weight.data.device.type != "cpu" or kernel_backend(weight.data.device) != "native":
        return None
    return PackedWeight(weight) if weight.ggml_type in PACKED_TYPES else None


def packed_layer(packed: "PackedWeight") -> PackedLinear:
    from kernels.native.quantized import packed_linear

    return lambda x, bias: packed_linear(x, packed, bias)


def pack_for_cpu(weight: torch.Tensor) -> PackedLinear | None:
    """The fastest re-laid-out form of ``weight`` for this host, or None (use ``F.linear``)."""
    if weight.device.type != "cpu":
        return None
    if kernel_backend(weight.device) == "native":
        packed = _native_bf16(weight)
        if packed is not None:
            return packed
    return _onednn(weight)


class Linear(nn.Linear):
    packed: PackedLinear | None = None
    quantized: QuantizedWeight | None = None
    # How the weight is held when not as a parameter: GGML format name and bytes.
    stored_as: tuple[str, int] | None = None

    def use_quantized(self, weight: QuantizedWeight) -> None:
        """Serve from ``weight``'s blocks; the float weight is dropped."""
        self.quantized = weight
        self.stored_as = (weight.ggml_type.name, weight.nbytes)
        self.register_parameter("weight", None)

    def pack(self) -> None:
        if self.quantized is None:
            self.packed = pack_for_cpu(self.weight)
            return
        packed = pack_quantized(self.quantized)
        if packed is not None:
            self.packed = packed_layer(packed)
            self.quantized = None  # the packed copy holds the same bytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            return quantized_linear(x, self.quantized, self.bias)
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return self.packed(x, self.bias)
