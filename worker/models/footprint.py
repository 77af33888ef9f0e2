"""What a loaded model's weights take: their formats and bytes (logs and metrics)."""

from dataclasses import dataclass

from torch import nn

from worker.device import dtype_name
from worker.models.moe import SparseMoE


@dataclass(frozen=True)
class WeightFootprint:
    formats: str  # "Q4_1+Q8_0+float32": quantized formats, then the float dtype
    bytes: int  # de-quantized copies of quantized layers included
    # What one token's forward reads: all but the experts its router does not pick.
    active_bytes: int

    def describe(self) -> str:
        text = f"weights: {self.formats}, {self.bytes / 2**20:.1f} MiB"
        if self.active_bytes < self.bytes:
            text += f", {self.active_bytes / 2**20:.1f} MiB active per token (experts)"
        return text


def weight_footprint(model: nn.Module) -> WeightFootprint:
    formats = {stored[0] for m in model.modules() if (stored := getattr(m, "stored_as", None))}
    names = sorted(formats) + sorted({dtype_name(p.dtype) for p in model.parameters()})
    total = held_bytes(model)
    return WeightFootprint("+".join(names), total, total - _idle_expert_bytes(model))


def held_bytes(module: nn.Module) -> int:
    """The bytes of ``module``'s weights: parameters, blocks, and de-quantized copies of
    block layers (``Linear.keep_dense``)."""
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    for layer in module.modules():
        stored = getattr(layer, "stored_as", None)
        total += 0 if stored is None else stored[1]
        total += getattr(layer, "dense_nbytes", 0)
    return total


def _idle_expert_bytes(model: nn.Module) -> int:
    """The bytes of the experts a token's router leaves out, layer by layer."""
    idle = 0
    for module in model.modules():
        if isinstance(module, SparseMoE):
            moe = module.moe
            idle += held_bytes(module.experts) * (moe.experts - moe.top_k) // moe.experts
    return idle
