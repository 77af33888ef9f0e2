"""Paged attention in Triton: one launch for a whole step.

Grid: (query blocks of all sequences, kv heads). A program takes BLOCK_Q
consecutive new tokens of one sequence and the G query heads that share one
KV head (GQA), so each K/V tile it loads serves G * BLOCK_Q query rows:

    rows of a program (G_PAD = 4, BLOCK_Q = 4):
      row m -> token  q_block * BLOCK_Q + m // G_PAD,  head  kv_head * G + m % G_PAD

Sequences are found by binary search over ``query_start_loc``; each sequence
owns ``cdiv(q_len, BLOCK_Q)`` consecutive program ids, which the search
recovers from ``query_start_loc[i] // BLOCK_Q + i``. K/V are read in tiles of
TILE_N positions through the block table, whatever the block size, with an
online softmax (running max and sum, no score matrix in memory) in fp32.
With a sliding window the walk starts at the first key the program's first token
sees (earlier blocks may be back in the pool); a logit soft-cap c turns each
scaled score s into c * tanh(s / c).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _find_seq(query_start_loc_ptr, program, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest i with query_start_loc[i] // BLOCK_Q + i <= program."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_program = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_program <= program:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _paged_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, value_size]
    query_ptr,  # [num_tokens, num_heads, head_size]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, value_size], any strides
    block_tables_ptr,  # [num_seqs, max_blocks] int32
    seq_lens_ptr,  # [num_seqs]
    query_start_loc_ptr,  # [num_seqs + 1]
    scale,
    num_seqs,
    stride_qt, stride_qh,
    stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    SLIDING_WINDOW: tl.constexpr,
    LOGIT_SOFTCAP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    VALUE_SIZE: tl.constexpr,
    VALUE_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_FP32: tl.constexpr,
    WIDEN_KV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    program = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_seq(query_start_loc_ptr, program, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block = program - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_before = seq_len - q_len

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    rows = tl.arange(0, BLOCK_M)
    q_index = q_block * BLOCK_Q + rows // GROUP_PAD  # within the sequence's new tokens
    head = kv_head * GROUP + rows % GROUP_PAD
    row_valid = (q_index < q_len) & (rows % GROUP_PAD < GROUP)
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD_SIZE
    value_dims = tl.arange(0, VALUE_PAD)
    value_dim_valid = value_dims < VALUE_SIZE

    q_ptrs = query_ptr + (q_start + q_index)[:, None] * stride_qt + head[:, None] * stride_qh
    q = tl.load(q_ptrs + dims[None, :], mask=row_valid[:, None] & dim_valid[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    q_pos = context_before + q_index  # absolute position of each row's token

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, VALUE_PAD], dtype=tl.float32)

    # The last row of this program sees keys up to its own position.
    last_q = tl.minimum(q_len, (q_block + 1) * BLOCK_Q) - 1
    kv_end = context_before + last_q + 1
    kv_start = 0
    if SLIDING_WINDOW > 0:  # the first key the program's first token sees, tile-aligned
        first_pos = context_before + q_block * BLOCK_Q
        kv_start = tl.maximum(first_pos - SLIDING_WINDOW + 1, 0) // TILE_N * TILE_N
    for tile_start in range(kv_start, kv_end, TILE_N):
        kv_pos = tile_start + tl.arange(0, TILE_N)
        kv_valid = kv_pos < kv_end
        if SLIDING_WINDOW > 0:
            kv_valid = kv_valid & (kv_pos > context_before + q_block * BLOCK_Q - SLIDING_WINDOW)
        block = tl.load(
            block_tables_ptr + seq * stride_bt + kv_pos // BLOCK_SIZE, mask=kv_valid, other=0
        ).to(tl.int64)
        slot = kv_pos % BLOCK_SIZE
        k_ptrs = (
            key_cache_ptr
            + block[None, :] * stride_kb
            + slot[None, :] * stride_ks
            + kv_head * stride_kh
            + dims[:, None]
        )
        k = tl.load(k_ptrs, mask=kv_valid[None, :] & dim_valid[:, None], other=0.0)  # [D, N]
        if DOT_FP32:
            k = k.to(tl.float32)
        elif WIDEN_KV:  # an fp8 cache: its values in the query's dtype for the dot
            k = k.to(q.dtype)
        scores = tl.dot(q, k, input_precision=DOT_PRECISION).to(tl.float32) * scale  # [M, N]
        if LOGIT_SOFTCAP > 0:  # c * tanh(s / c), tanh written with exp
            scores = LOGIT_SOFTCAP * (1.0 - 2.0 / (tl.exp(2.0 * scores / LOGIT_SOFTCAP) + 1.0))
        visible = (kv_pos[None, :] <= q_pos[:, None]) & kv_valid[None, :] & row_valid[:, None]
        if SLIDING_WINDOW > 0:
            visible = visible & (kv_pos[None, :] > q_pos[:, None] - SLIDING_WINDOW)
        scores = tl.where(visible, scores, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # Rows that have seen no visible key yet keep a finite reference point.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_ptrs = (
            value_cache_ptr
            + block[:, None] * stride_vb
            + slot[:, None] * stride_vs
            + kv_head * stride_vh
            + value_dims[None, :]
        )
        v = tl.load(v_ptrs, mask=kv_valid[:, None] & value_dim_valid[None, :], other=0.0)  # [N, V]
        if DOT_FP32:
            v = v.to(tl.float32)
        elif WIDEN_KV:
            v = v.to(q.dtype)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv.to(tl.float32)
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_ptrs = out_ptr + (q_start + q_index)[:, None] * stride_ot + head[:, None] * stride_oh
    tl.store(
        o_ptrs + value_dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None] & value_dim_valid[None, :],
    )


# Query rows per program: tl.dot needs at least 16 on GPUs.
MIN_ROWS = 16
TILE_N = 32


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int = 0,
    logit_softcap: float = 0.0,
) -> torch.Tensor:
    """Same contract as ``kernels.reference.paged_attention``."""
    num_tokens, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = block_tables.shape[0]
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_q = max(1, MIN_ROWS // group_pad)
    value_size = value_cache.shape[-1]
    out = query.new_empty(num_tokens, num_heads, value_size)
    # Each sequence may start a partial block of programs: at most one extra per sequence.
    num_programs = num_tokens // block_q + num_seqs
    _paged_attention_kernel[(num_programs, num_kv_heads)](
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        num_seqs,
        query.stride(0), query.stride(1),
        out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        SLIDING_WINDOW=sliding_window,
        LOGIT_SOFTCAP=float(logit_softcap),
        HEAD_SIZE=head_size,
        HEAD_PAD=triton.next_power_of_2(head_size),
        VALUE_SIZE=value_size,
        VALUE_PAD=triton.next_power_of_2(value_size),
        BLOCK_SIZE=block_size,
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        TILE_N=TILE_N,
        # Triton's interpreter gets 16-bit float arithmetic wrong; on GPUs the
        # dots stay in the cache dtype (tensor cores) with fp32 accumulation.
        DOT_FP32=query.device.type == "cpu",
        WIDEN_KV=key_cache.dtype != query.dtype,
        # fp32 in, fp32 products: a GPU would otherwise round the inputs to TF32.
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    return out
