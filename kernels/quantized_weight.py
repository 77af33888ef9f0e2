"""A linear layer's weight kept in GGUF's quantized blocks, as the kernels read it."""

from dataclasses import dataclass

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# The block formats every implementation of ``quantized_linear`` takes.
LINEAR_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0)


@dataclass(frozen=True)
class QuantizedWeight:
    """``[out_features, in_features]`` weights as ``data`` ``[out_features, row bytes]``
    uint8: each row a run of blocks of ``block_size`` weights in GGUF's layout."""

    ggml_type: GGMLQuantizationType
    data: torch.Tensor
    out_features: int
    in_features: int

    def __post_init__(self) -> None:
        if self.ggml_type not in LINEAR_TYPES:
            raise ValueError(f"no kernel for {self.ggml_type.name} weights")
        block_size, block_bytes = GGML_QUANT_SIZES[self.ggml_type]
        row_bytes = self.in_features // block_size * block_bytes
        if self.in_features % block_size or self.data.shape != (self.out_features, row_bytes):
            raise ValueError(
                f"{self.ggml_type.name} data of shape {tuple(self.data.shape)} cannot hold "
                f"[{self.out_features}, {self.in_features}] weights"
            )

    @property
    def block_bytes(self) -> int:
        return GGML_QUANT_SIZES[self.ggml_type][1]

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def to(self, device: torch.device) -> "QuantizedWeight":
        return QuantizedWeight(
            self.ggml_type, self.data.to(device), self.out_features, self.in_features
        )

    def rows(self, index: torch.Tensor) -> "QuantizedWeight":
        """The weight rows at ``index`` (an embedding lookup, or a reordering)."""
        data = self.data.index_select(0, index)
        return QuantizedWeight(self.ggml_type, data, data.shape[0], self.in_features)
