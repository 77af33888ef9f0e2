"""Routed experts: each token's rows through its chosen experts' gated MLPs, weighted."""

from collections.abc import Callable

import torch

from kernels.reference.activation import gelu_tanh_and_mul, silu_and_mul

# An expert's gated MLP on its rows: (expert, rows [n, hidden]) -> [n, hidden].
RunExpert = Callable[[int, torch.Tensor], torch.Tensor]


def fused_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    """``sum_j w[t, j] * down[e] @ act(gate_up[e] @ x[t])`` over each token t's experts
    e = ids[t, j]. x: [tokens, hidden]; gate_up: [experts, 2 * inter, hidden]; down:
    [experts, hidden, inter]; topk_weights and topk_ids: [tokens, k]."""
    gated = {"silu": silu_and_mul, "gelu_tanh": gelu_tanh_and_mul}[activation]
    return stacked_experts(x, gate_up, down, topk_weights, topk_ids, gated)


def stacked_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_and_mul: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``fused_experts`` with a backend's own gated activation: each expert's stacked
    weights in torch's matmuls, grouped as ``grouped_experts`` groups them."""
    return grouped_experts(
        x, topk_weights, topk_ids, lambda e, rows: act_and_mul(rows @ gate_up[e].t()) @ down[e].t()
    )


def grouped_experts(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, run_expert: RunExpert
) -> torch.Tensor:
    """The weighted sum of each token's experts, ``run_expert`` running one expert on
    the rows that chose it.

    The (token, expert) pairs are sorted by expert, so each expert that has tokens
    runs once on all of its rows, however many tokens chose it. A single token (a
    batch-1 decode) runs its k experts in turn: nothing to sort."""
    tokens, k = topk_ids.shape
    if tokens == 1:
        chosen = sorted(zip(topk_ids[0].tolist(), topk_weights[0].tolist(), strict=True))
        out = chosen[0][1] * run_expert(chosen[0][0], x)
        for expert, weight in chosen[1:]:
            out.add_(run_expert(expert, x), alpha=weight)
        return out
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token_of = order // k
    counts = torch.bincount(flat).tolist()
    rows = x[token_of]
    out = torch.empty_like(rows)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            out[start : start + count] = run_expert(expert, rows[start : start + count])
            start += count
    weights = topk_weights.reshape(-1)[order].to(out.dtype)
    return torch.zeros_like(x).index_add_(0, token_of, out * weights[:, None])
