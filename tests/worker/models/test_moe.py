"""A mixture-of-experts layer: experts re-laid out per expert for the host's linear
(what a CPU engine runs), and experts kept in GGUF blocks, give the stacked weights'
output."""

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType

from kernels import dequantize, kernel_backend, reference
from kernels.quantized_weight import QuantizedWeight
from worker.models.moe import SparseMoE, route
from worker.models.sharding import TensorParallel
from worker.models.traits import MoETraits

MOE = MoETraits(
    experts=8, top_k=2, intermediate=64, sparse_layers=frozenset(),
    shared_intermediate=32, shared_gate=True,
)  # fmt: skip
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
Q8_0 = GGMLQuantizationType.Q8_0


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
        if layer.experts.per_expert is None:
            pytest.skip(f"this host re-lays out no {dtype} linear")
        packed = layer(x)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(packed.float(), stacked.float(), atol=tol, rtol=tol)


def _in_blocks(weight: torch.Tensor, kind: GGMLQuantizationType) -> QuantizedWeight:
    blocks = gguf.quants.quantize(weight.numpy(), kind)
    return QuantizedWeight(kind, torch.from_numpy(blocks), *weight.shape)


# Each format's bound on the largest output error, as a share of the largest output:
# the native kernels quantize the activations to 8 bits as llama.cpp's do (measured
# 1.0-1.6%); the torch kernels multiply the de-quantized weights (float rounding only).
BLOCK_ERROR = {"native": 0.03, "torch": 1e-5}


@pytest.mark.parametrize("kernels", ["native", "torch"])
@pytest.mark.parametrize("kind", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, Q8_0])
@pytest.mark.parametrize("tokens", [1, 9])
def test_experts_in_blocks_give_the_de_quantized_experts_output(
    monkeypatch, kernels, kind, tokens
) -> None:
    """A GGUF's experts, each expert's rows in their blocks (as the engine loads them),
    against the reference over the stacked weights those blocks de-quantize to."""
    monkeypatch.setenv("GENFLEET_KERNELS", kernels)
    if kernel_backend(torch.device("cpu")) != kernels:
        pytest.skip("no native kernels on this host")
    torch.manual_seed(0)
    layer = SparseMoE(64, MOE, "silu", TensorParallel())
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(std=0.2)
    experts = layer.experts
    gate_up = [_in_blocks(w, kind) for w in experts.gate_up_proj.detach()]
    down = [_in_blocks(w, kind) for w in experts.down_proj.detach()]
    stacked = [
        torch.stack([dequantize(w, torch.float32) for w in weights]) for weights in (gate_up, down)
    ]
    x = torch.randn(tokens, 64)
    with torch.no_grad():
        weights, ids = route(layer.gate(x), MOE)
        expected = reference.fused_experts(x, *stacked, weights, ids, "silu")
        experts.use_quantized(gate_up, down)
        for block_layer in [*experts.gate_up_blocks, *experts.down_blocks]:
            block_layer.pack()
        experts.pack()
        shared = layer.shared_expert.partial(x) * torch.sigmoid(layer.shared_expert_gate(x))
        actual = layer(x) - shared
    error = (actual - expected).abs().max() / expected.abs().max()
    assert error <= BLOCK_ERROR[kernels]
