"""Paged attention in plain torch.

Layout of one step (``query_start_loc`` = [0, 3, 4, 5]):

    tokens:  | s0 s0 s0 | s1 | s2 |      s0: a prefill chunk of 3 tokens
    ctx:       s0 has seq_lens[0] tokens in cache, its last 3 are this chunk

Query token r of a sequence with q_len new tokens and ctx cached tokens (the
new ones included) sits at position ctx - q_len + r and sees keys 0..that.

With a sliding window of W, that query sees only the last W of those keys
(``position - W < key <= position``, as transformers masks Mistral's and Gemma's
local layers); a key before the window is never read, so its block may already
be back in the pool. With a logit soft-cap c, each scaled score s becomes
``c * tanh(s / c)`` before the softmax (Gemma 2).

Single-token decodes are gathered into one batched call; sequences with
several new tokens (prefill chunks) run one call each. The math runs in
fp32 whatever the cache dtype: it is the accuracy we want, and on CPUs
without native bf16 SDPA kernels it is also several times faster.
"""

import itertools

import torch
import torch.nn.functional as F


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """[n, num_blocks] block ids -> fp32 [n, num_kv_heads, num_blocks * block_size, head_size]
    (``cache`` may be a view: whole blocks are selected, then made contiguous)."""
    n, blocks = block_ids.shape
    _, block_size, kv_heads, head = cache.shape
    # index_select on whole blocks is several times faster than advanced indexing.
    # Convert while contiguous: a dtype change on the transposed view is a slow strided copy.
    gathered = cache.index_select(0, block_ids.reshape(-1)).float()
    return gathered.view(n, blocks * block_size, kv_heads, head).transpose(1, 2)


def _only_visible(
    k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V zeroed at the keys no query sees (``seen`` [n, 1, keys]): those before a
    sliding window may be in blocks already back in the pool, holding anything."""
    hidden = ~seen[..., None]
    return k.masked_fill(hidden, 0.0), v.masked_fill(hidden, 0.0)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
    logit_softcap: float,
) -> torch.Tensor:
    """Attention of q [n, heads, q_len, head] over k, v [n, kv_heads, keys, head] where
    ``visible`` [n, 1, q_len, keys] allows."""
    if not logit_softcap:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=visible, scale=scale, enable_gqa=True
        )
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) * scale
    scores = logit_softcap * torch.tanh(scores / logit_softcap)
    return scores.masked_fill(~visible, float("-inf")).softmax(dim=-1) @ v


def _decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int,
    logit_softcap: float,
) -> torch.Tensor:
    """One new token per sequence: a single batched call, [n, heads, head] out."""
    block_size = key_cache.shape[1]
    num_blocks = -(-int(seq_lens.max()) // block_size)
    block_ids = block_tables[:, :num_blocks].long()
    k = _gather(key_cache, block_ids)
    v = _gather(value_cache, block_ids)
    keys = torch.arange(num_blocks * block_size, device=query.device)
    visible = keys < seq_lens[:, None]
    if sliding_window:
        visible &= keys >= seq_lens[:, None] - sliding_window
        k, v = _only_visible(k, v, visible[:, None, :])
    q = query.unsqueeze(2).float()  # [n, heads, 1, head]
    o = _attend(q, k, v, visible[:, None, None, :], scale, logit_softcap)
    return o.squeeze(2).to(query.dtype)


def _prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    ctx_len: int,
    scale: float,
    sliding_window: int,
    logit_softcap: float,
) -> torch.Tensor:
    """Several new tokens of one sequence, the last ``q_len`` of its ``ctx_len``."""
    q_len = query.shape[0]
    num_blocks = -(-ctx_len // key_cache.shape[1])
    block_ids = block_table[None, :num_blocks].long()
    k = _gather(key_cache, block_ids)[:, :, :ctx_len]
    v = _gather(value_cache, block_ids)[:, :, :ctx_len]
    q = query.transpose(0, 1).unsqueeze(0).float()
    if ctx_len == q_len and not sliding_window and not logit_softcap:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        key_pos = torch.arange(ctx_len, device=query.device)
        query_pos = torch.arange(ctx_len - q_len, ctx_len, device=query.device)
        mask = key_pos[None, :] <= query_pos[:, None]
        if sliding_window:
            mask &= key_pos[None, :] > query_pos[:, None] - sliding_window
            k, v = _only_visible(k, v, mask.any(dim=0)[None, None])
        o = _attend(q, k, v, mask[None, None], scale, logit_softcap)
    return o.squeeze(0).transpose(0, 1).to(query.dtype)


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
    """Causal attention of each sequence's new tokens over its paged context.

    query: [num_tokens, num_heads, head_size]
    key_cache: [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: [num_blocks, block_size, num_kv_heads, value_size]: a cache of its own,
        or a view of the keys' first ``value_size`` features (multi-head latent
        attention keeps one latent row per token, read as key and as value)
    block_tables: [num_seqs, max_blocks_per_seq] block ids (int32)
    seq_lens: [num_seqs] cached tokens per sequence, this step's included
    query_start_loc: [num_seqs + 1] offsets of each sequence's tokens in query
    returns [num_tokens, num_heads, value_size]
    sliding_window: each token sees its last this many positions (0: all)
    logit_softcap: scores capped by c * tanh(s / c) (0: none)
    Every sequence has at least one new token.
    """
    limits = (sliding_window, logit_softcap)
    if query.shape[0] == block_tables.shape[0]:  # one token per sequence: a pure decode step
        return _decode(query, key_cache, value_cache, block_tables, seq_lens, scale, *limits)
    out = query.new_empty(*query.shape[:2], value_cache.shape[-1])
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    q_lens = [b - a for a, b in itertools.pairwise(starts)]
    decodes = [i for i, q_len in enumerate(q_lens) if q_len == 1]
    if decodes:
        rows = torch.tensor(decodes, dtype=torch.long, device=query.device)
        tokens = query_start_loc[rows].long()
        out[tokens] = _decode(
            query[tokens],
            key_cache,
            value_cache,
            block_tables[rows],
            seq_lens[rows],
            scale,
            *limits,
        )
    for i, q_len in enumerate(q_lens):
        if q_len > 1:
            out[starts[i] : starts[i + 1]] = _prefill(
                query[starts[i] : starts[i + 1]],
                key_cache,
                value_cache,
                block_tables[i],
                lens[i],
                scale,
                *limits,
            )
    return out
