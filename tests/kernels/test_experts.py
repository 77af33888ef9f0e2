"""Routed experts: the reference's grouping (rows sorted by expert, one pair of
matmuls per active expert) against a loop over every token's every choice; the
native and Triton backends against the reference; the router's top-k."""

import pytest
import torch

from kernels import grouped_experts, native, reference
from kernels.dispatch import _native_builds
from worker.models.moe import route
from worker.models.traits import MoETraits

EXPERTS, HIDDEN, INTER, TOKENS, TOP_K = 6, 32, 24, 11, 2


def _case(dtype: torch.dtype, tokens: int = TOKENS) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(tokens, HIDDEN, generator=gen)
    gate_up = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) / HIDDEN**0.5
    down = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) / INTER**0.5
    logits = torch.randn(tokens, EXPERTS, generator=gen)
    logits[:, 5] = -1e9  # an expert no token chooses
    weights, ids = torch.topk(torch.softmax(logits, -1), TOP_K)
    return x.to(dtype), gate_up.to(dtype), down.to(dtype), weights, ids


def _one_by_one(x, gate_up, down, weights, ids, activation) -> torch.Tensor:
    act = {
        "silu": torch.nn.functional.silu,
        "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
    }[activation]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            out[t] += weights[t, j] * (down[e] @ (act(gate) * up))
    return out


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_grouped_experts_equal_a_loop_over_every_choice(activation) -> None:
    case = _case(torch.float32)
    expected = _one_by_one(*case, activation)
    torch.testing.assert_close(reference.fused_experts(*case, activation), expected)


@pytest.mark.skipif(not _native_builds(), reason="no C++ compiler builds the native kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_experts_equal_the_reference(dtype) -> None:
    case = _case(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    actual, expected = native.fused_experts(*case, "silu"), reference.fused_experts(*case, "silu")
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


def test_the_router_keeps_or_rescales_the_top_k_and_ties_share_alike() -> None:
    moe = MoETraits(experts=4, top_k=2, intermediate=8, sparse_layers=frozenset())
    logits = torch.tensor([[2.0, 2.0, 0.0, -1.0], [0.0, 3.0, 1.0, 1.0]])
    weights, ids = route(logits, moe)
    assert sorted(ids[0].tolist()) == [0, 1] and torch.equal(weights[0], torch.tensor([0.5, 0.5]))
    assert ids[1, 0] == 1 and ids[1, 1] in (2, 3)  # the tie for second: either, once
    torch.testing.assert_close(weights.sum(-1), torch.ones(2))
    kept, _ = route(logits, MoETraits(4, 2, 8, frozenset(), renormalize=False))
    torch.testing.assert_close(kept[1], torch.softmax(logits[1], -1)[[1, 2]])


@pytest.mark.parametrize("tokens", [1, TOKENS])
def test_experts_run_per_expert_equal_the_stacked_ones(tokens) -> None:
    """``grouped_experts`` over per-expert projections (how a model runs experts
    re-laid out for the host's linear) on one token (its own path) and on many."""
    x, gate_up, down, weights, ids = _case(torch.float32)
    x, weights, ids = x[:tokens], weights[:tokens], ids[:tokens]

    def run(e: int, rows: torch.Tensor) -> torch.Tensor:
        return reference.silu_and_mul(rows @ gate_up[e].t()) @ down[e].t()

    expected = _one_by_one(x, gate_up, down, weights, ids, "silu")
    torch.testing.assert_close(grouped_experts(x, weights, ids, run), expected)


def _deepseek_router(version: int) -> tuple[torch.nn.Module, MoETraits]:
    """transformers' router of DeepSeek V2 (softmax, group-limited greedy) or V3
    (sigmoid, a correction bias, groups scored by their best two), random weights."""
    from transformers import DeepseekV2Config, DeepseekV3Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    common = {"hidden_size": HIDDEN, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3}
    if version == 2:
        config = DeepseekV2Config(**common, n_routed_experts=16, routed_scaling_factor=1.5,
                                  topk_method="group_limited_greedy")  # fmt: skip
        router = DeepseekV2TopkRouter(config)
    else:
        config = DeepseekV3Config(**common, n_routed_experts=16, routed_scaling_factor=2.5)
        router = DeepseekV3TopkRouter(config)
        router.e_score_correction_bias.normal_(std=0.1, generator=torch.Generator().manual_seed(1))
    router.weight.data.normal_(std=0.1, generator=torch.Generator().manual_seed(2))
    moe = MoETraits(
        experts=16, top_k=3, intermediate=8, sparse_layers=frozenset(),
        renormalize=version == 3, scoring="sigmoid" if version == 3 else "softmax",
        groups=4, top_groups=2, group_score="top2_sum" if version == 3 else "max",
        routed_scaling=config.routed_scaling_factor,
    )  # fmt: skip
    return router, moe


@pytest.mark.parametrize("version", [2, 3])
def test_deepseek_group_limited_routing_picks_and_weighs_as_transformers(version) -> None:
    router, moe = _deepseek_router(version)
    x = torch.randn(400, HIDDEN, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, expected_weights, expected_ids = router(x)
    bias = getattr(router, "e_score_correction_bias", None)
    weights, ids = route(logits, moe, bias)
    order, expected_order = ids.argsort(-1), expected_ids.argsort(-1)
    assert torch.equal(ids.gather(1, order), expected_ids.gather(1, expected_order))
    torch.testing.assert_close(weights.gather(1, order), expected_weights.gather(1, expected_order))
    groups = ids // (16 // 4)  # every pick inside the token's two open groups
    assert all(len(set(row)) <= 2 for row in groups.tolist())
