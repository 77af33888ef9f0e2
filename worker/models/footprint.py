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
    formats: set[str] = set()
    total = 0
    for module in model.modules():
        stored = getattr(module, "stored_as", None)
        if stored is not None:
            formats.add(stored[0])
            total += stored[1]
        total += getattr(module, "dense_nbytes", 0)  # de-quantized copies (Linear.keep_dense)
    floats = {p.dtype for p in model.parameters()}
    total += sum(p.numel() * p.element_size() for p in model.parameters())
    names = sorted(formats) + sorted(dtype_name(dtype) for dtype in floats)
    return WeightFootprint("+".join(names), total, total - _idle_expert_bytes(model))


def _idle_expert_bytes(model: nn.Module) -> int:
    """The bytes of the experts a token's router leaves out, layer by layer."""
    idle = 0
    for module in model.modules():
        if isinstance(module, SparseMoE):
            moe = module.moe
            stacked = sum(p.numel() * p.element_size() for p in module.experts.parameters())
            idle += stacked * (moe.experts - moe.top_k) // moe.experts
    return idle
