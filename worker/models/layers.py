"""Layers every model family is built from: norms, gated MLPs and token embeddings."""

from typing import TYPE_CHECKING

import torch
from torch import nn

from kernels import dequantize, gelu_tanh_and_mul, rms_norm, silu_and_mul
from kernels.quantized_weight import QuantizedWeight
from worker.models.linear import Linear
from worker.models.sharding import TensorParallel
from worker.models.traits import Activation

if TYPE_CHECKING:
    from kernels import PackedWeight


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return rms_norm(x, self.weight, self.eps, residual)


GATED_ACTIVATIONS = {"silu": silu_and_mul, "gelu_tanh": gelu_tanh_and_mul}


class MLP(nn.Module):
    """The gated MLP: down(act(gate(x)) * up(x)), gate and up fused in one projection."""

    def __init__(
        self, hidden: int, intermediate: int, bias: bool, activation: Activation, tp: TensorParallel
    ) -> None:
        super().__init__()
        self.tp = tp
        size = tp.split(intermediate, "intermediate features")
        self.gate_up_proj = Linear(hidden, 2 * size, bias)
        self.down_proj = Linear(size, hidden, bias)
        self.act_and_mul = GATED_ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.partial(x))

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share of the output, before the ranks' shares are summed."""
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


class Embedding(nn.Embedding):
    """Token embeddings; from GGUF blocks (``use_quantized``) only the looked-up rows
    are de-quantized. Under tensor parallelism each rank holds a range of the
    vocabulary: ids outside it look up zeros, and the ranks' rows are summed."""

    quantized: QuantizedWeight | None = None
    packed: "PackedWeight | None" = None
    stored_as: tuple[str, int] | None = None  # as Linear.stored_as
    compute_dtype = torch.float32

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        self.first_row, rows, _ = tp.vocab_rows(vocab_size)
        super().__init__(rows, hidden_size)
        self.tp = tp

    def use_quantized(self, weight: QuantizedWeight, dtype: torch.dtype) -> None:
        self.quantized = weight
        self.stored_as = (weight.ggml_type.name, weight.nbytes)
        self.compute_dtype = dtype
        self.register_parameter("weight", None)

    def as_output_layer(self) -> Linear:
        """A layer over this embedding's blocks or weight, not copied: the tied output."""
        layer = Linear(self.embedding_dim, self.num_embeddings, bias=False, device="meta")
        if self.quantized is None:
            layer.weight = self.weight
        else:
            layer.register_parameter("weight", None)
            layer.quantized = self.quantized  # not ``use_quantized``: counted here only
        return layer

    def use_packed(self, packed: "PackedWeight") -> None:
        """Look rows up in ``packed`` (the native re-laid-out form of the same blocks,
        which the tied output layer runs on); the stored form is dropped."""
        self.packed = packed
        self.quantized = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self._lookup(ids)
        local = ids - self.first_row
        outside = (local < 0) | (local >= self.num_embeddings)
        rows = self._lookup(local.masked_fill(outside, 0))
        return self.tp.all_reduce(rows.masked_fill(outside[..., None], 0.0))

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            rows = self.packed.rows(ids.reshape(-1), self.compute_dtype)
            return rows.view(*ids.shape, self.packed.in_features)
        if self.quantized is None:
            return super().forward(ids)
        rows = dequantize(self.quantized.rows(ids.reshape(-1)), self.compute_dtype)
        return rows.view(*ids.shape, self.quantized.in_features)
