"""A mixture-of-experts layer: experts re-laid out per expert for the host's linear
(what a CPU engine runs) give the stacked weights' output."""

import pytest
import torch

from worker.models.moe import SparseMoE
from worker.models.sharding import TensorParallel
from worker.models.traits import MoETraits

MOE = MoETraits(
    experts=8, top_k=2, intermediate=64, sparse_layers=frozenset(),
    shared_intermediate=32, shared_gate=True,
)  # fmt: skip
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 9])
def test_re_laid_out_experts_give_the_stacked_experts_output(tokens, dtype) -> None:
    torch.manual_seed(0)
    layer = SparseMoE(64, MOE, "silu", TensorParallel())
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(std=0.2)
    layer = layer.to(dtype)
    x = torch.randn(tokens, 64).to(dtype)
    with torch.no_grad():
        stacked = layer(x)
        layer.experts.pack()
        if layer.experts.packed is None:
            pytest.skip(f"this host re-lays out no {dtype} linear")
        packed = layer(x)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(packed.float(), stacked.float(), atol=tol, rtol=tol)
