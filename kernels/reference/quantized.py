"""Quantized linear layers in plain torch: de-quantize the blocks, then ``F.linear``."""

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType

from kernels.quantized_weight import QuantizedWeight


def _halves(blocks: torch.Tensor, first: int) -> torch.Tensor:
    """The fp16 stored at byte ``first`` of each block, as float32 [..., 1]."""
    return blocks[..., first : first + 2].contiguous().view(torch.float16).float()


def dequantize(weight: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """The ``[out_features, in_features]`` weights in ``dtype``."""
    blocks = weight.data.view(weight.out_features, -1, weight.block_bytes)
    scale = _halves(blocks, 0)
    if weight.ggml_type == GGMLQuantizationType.Q8_0:
        values = scale * blocks[..., 2:].contiguous().view(torch.int8).float()
    else:
        nibbles = (
            blocks[..., 4:] if weight.ggml_type == GGMLQuantizationType.Q4_1 else blocks[..., 2:]
        )
        quants = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).float()
        if weight.ggml_type == GGMLQuantizationType.Q4_1:
            values = scale * quants + _halves(blocks, 2)
        else:
            values = scale * (quants - 8)
    return values.reshape(weight.out_features, weight.in_features).to(dtype)


def quantized_linear(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ W.T + bias`` with W the de-quantized weight, in x's dtype."""
    return F.linear(x, dequantize(weight, x.dtype), bias)
