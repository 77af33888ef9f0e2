"""Routed experts in Triton: two grouped matmuls over the (token, choice) pairs sorted by
expert, with no loop over experts on the host.

The pairs are sorted by expert and each expert's run padded to a multiple of BLOCK_M
rows (``_align``, torch ops on the device: no host sync), so that every program's
BLOCK_M rows belong to one expert. A program takes those rows and BLOCK_N output
features and multiplies them by its expert's weight, K in tiles of BLOCK_K, in fp32:

    gate/up:  rows of x by token (pair // k)  @ gate_up[e].T  -> [pairs, 2 * inter]
    gated activation                                          -> [pairs, inter]
    down:     rows by pair                    @ down[e].T * w -> [pairs, hidden]

and each token's k rows are summed. Padding rows (pair id = number of pairs) and
blocks past the last expert's run (expert -1) are skipped.
"""

import torch
import triton
import triton.language as tl

from kernels.triton_ops.activation import gelu_tanh_and_mul, silu_and_mul

BLOCK_M = 16  # tl.dot's least rows on GPUs
BLOCK_N = 32
BLOCK_K = 32


@triton.jit
def _expert_matmul_kernel(
    a_ptr,  # [rows, k]: x (rows by token) or the activations (rows by pair)
    w_ptr,  # [experts, n, k]
    out_ptr,  # [pairs, n]
    pairs_ptr,  # [slots] pair ids sorted by expert, runs padded with num_pairs
    block_experts_ptr,  # [slots // BLOCK_M] each block's expert, -1 past the runs
    weights_ptr,  # [pairs] routing weights (read where WEIGHTED)
    n, k, top_k, num_pairs,
    stride_a, stride_we, stride_wn, stride_out,
    ROWS_BY_TOKEN: tl.constexpr,
    WEIGHTED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block).to(tl.int64)
    if expert < 0:
        return
    pair = tl.load(pairs_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    valid = pair < num_pairs
    a_row = pair // top_k if ROWS_BY_TOKEN else pair
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, k, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < k
        a = tl.load(
            a_ptr + a_row[:, None] * stride_a + ks[None, :],
            mask=valid[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + expert * stride_we + cols[None, :] * stride_wn + ks[:, None],
            mask=k_ok[:, None] & col_ok[None, :],
            other=0.0,
        )  # [BLOCK_K, BLOCK_N]
        if DOT_FP32:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc += tl.dot(a, w, input_precision=DOT_PRECISION)
    if WEIGHTED:
        acc = acc * tl.load(weights_ptr + pair, mask=valid, other=0.0)[:, None]
    tl.store(
        out_ptr + pair[:, None] * stride_out + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=valid[:, None] & col_ok[None, :],
    )


def _align(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair ids sorted by expert, each expert's run padded to BLOCK_M rows; each
    block's expert), sized for the most padding any routing can need."""
    flat = topk_ids.reshape(-1)
    num_pairs = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    by_expert = flat[order]
    rank = (
        torch.arange(num_pairs, device=flat.device) - (torch.cumsum(counts, 0) - counts)[by_expert]
    )
    slots = triton.cdiv(num_pairs + num_experts * (BLOCK_M - 1), BLOCK_M) * BLOCK_M
    pairs = torch.full((slots,), num_pairs, dtype=torch.int64, device=flat.device)
    pairs[(ends - padded)[by_expert] + rank] = order
    block_starts = torch.arange(0, slots, BLOCK_M, device=flat.device)
    block_experts = torch.searchsorted(ends, block_starts, right=True)
    return pairs, torch.where(block_experts < num_experts, block_experts, -1)


def _expert_matmul(
    a: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    aligned: tuple[torch.Tensor, torch.Tensor],
    top_k: int,
    routing_weights: torch.Tensor | None,
) -> None:
    pairs, block_experts = aligned
    n, k = weight.shape[1:]
    grid = (block_experts.numel(), triton.cdiv(n, BLOCK_N))
    _expert_matmul_kernel[grid](
        a, weight, out, pairs, block_experts,
        routing_weights if routing_weights is not None else pairs,  # never read then
        n, k, top_k, out.shape[0],
        a.stride(0), weight.stride(0), weight.stride(1), out.stride(0),
        ROWS_BY_TOKEN=routing_weights is None,
        WEIGHTED=routing_weights is not None,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        # As the attention kernel: fp32 dots under the interpreter, which gets 16-bit
        # float arithmetic wrong; the weights' dtype with fp32 sums on a GPU.
        DOT_FP32=a.device.type == "cpu",
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
    )  # fmt: skip


def fused_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    """Same contract as ``kernels.reference.fused_experts``."""
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_pairs = tokens * top_k
    if num_pairs == 0:
        return torch.zeros_like(x)
    aligned = _align(topk_ids, gate_up.shape[0])
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    projected = x.new_empty(num_pairs, gate_up.shape[1])
    _expert_matmul(x, gate_up, projected, aligned, top_k, None)
    gated = {"silu": silu_and_mul, "gelu_tanh": gelu_tanh_and_mul}[activation](projected)
    out = x.new_empty(num_pairs, hidden)
    weights = topk_weights.reshape(-1).float().contiguous()
    _expert_matmul(gated, down, out, aligned, top_k, weights)
    return out.view(tokens, top_k, hidden).sum(dim=1)
