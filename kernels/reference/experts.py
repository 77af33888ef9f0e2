"""Routed experts: each token's rows through its chosen experts' gated MLPs, weighted."""

from collections.abc import Callable

import torch

from kernels.reference.activation import gelu_tanh_and_mul, silu_and_mul


def fused_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    gated = {"silu": silu_and_mul, "gelu_tanh": gelu_tanh_and_mul}[activation]
    return grouped_experts(x, gate_up, down, topk_weights, topk_ids, gated)


def grouped_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_and_mul: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``sum_j w[t, j] * down[e] @ act(gate_up[e] @ x[t])`` over each token t's experts
    e = ids[t, j], with ``act_and_mul`` the backend's gated activation. x: [tokens,
    hidden]; gate_up: [experts, 2 * inter, hidden]; down: [experts, hidden, inter];
    topk_weights and topk_ids: [tokens, k].

    The (token, expert) pairs are sorted by expert, so each expert that has tokens
    multiplies all of its rows at once: one pair of matmuls per active expert,
    however many tokens chose it."""
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token_of = order // k
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    rows = x[token_of]
    out = torch.empty_like(rows)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        part = rows[start : start + count]
        hidden = act_and_mul(part @ gate_up[expert].t())
        out[start : start + count] = hidden @ down[expert].t()
        start += count
    weights = topk_weights.reshape(-1)[order].to(out.dtype)
    result = torch.zeros_like(x)
    return result.index_add_(0, token_of, out * weights[:, None])
