"""Random paged-attention inputs and a dense loop-over-sequences answer for them."""

from dataclasses import dataclass

import torch


@dataclass
class PagedCase:
    query: torch.Tensor  # [num_tokens, heads, head]
    key_cache: torch.Tensor  # [blocks, block_size, kv_heads, head]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [seqs, max_blocks] int32
    seq_lens: torch.Tensor  # [seqs]
    query_start_loc: torch.Tensor  # [seqs + 1]
    keys: list[torch.Tensor]  # per sequence, dense [ctx, kv_heads, head]
    values: list[torch.Tensor]
    scale: float

    def kernel_tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensor arguments of ``paged_attention``, in order (``scale`` follows them)."""
        return (
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
        )


def make_case(
    shapes: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
    cache_dtype: torch.dtype | None = None,
    values_in_keys: int = 0,
) -> PagedCase:
    """shapes: (new tokens, total context) per sequence; blocks are scattered at random.
    The cache holds ``cache_dtype`` (default ``dtype``; fp8 for an fp8 cache).
    ``values_in_keys``: no value cache; the values are the keys' first this many
    features, a view (multi-head latent attention's one row per token)."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-ctx // block_size) for _, ctx in shapes]
    num_blocks = sum(blocks_per_seq) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    cache_shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.randn(cache_shape, generator=gen).to(cache_dtype or dtype)
    value_cache = torch.randn(cache_shape, generator=gen).to(cache_dtype or dtype)
    if values_in_keys:
        value_cache = key_cache[..., :values_in_keys]
    width = max(blocks_per_seq)
    tables, keys, values = [], [], []
    for n in blocks_per_seq:
        ids, order = order[:n], order[n:]
        tables.append(ids + [0] * (width - n))
    for (_, ctx), ids in zip(shapes, tables, strict=True):
        # Gathered in fp32 (exact for every cache dtype; torch cannot index fp8 on CPU).
        keys.append(key_cache.float()[ids].flatten(0, 1)[:ctx])
        values.append(value_cache.float()[ids].flatten(0, 1)[:ctx])
    q_lens = torch.tensor([q for q, _ in shapes])
    query_start_loc = torch.zeros(len(shapes) + 1, dtype=torch.int64)
    torch.cumsum(q_lens, 0, out=query_start_loc[1:])
    query = torch.randn(int(q_lens.sum()), num_heads, head_size, generator=gen).to(dtype)
    return PagedCase(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=torch.tensor(tables, dtype=torch.int32),
        seq_lens=torch.tensor([ctx for _, ctx in shapes], dtype=torch.int64),
        query_start_loc=query_start_loc,
        keys=keys,
        values=values,
        scale=head_size**-0.5,
    )


def dense_attention(
    case: PagedCase, sliding_window: int = 0, logit_softcap: float = 0.0
) -> torch.Tensor:
    """Each sequence's attention over its dense K/V, written out as transformers writes
    it: scaled scores, soft-capped, masked causally (and to the window), softmax."""
    out = case.query.new_empty(*case.query.shape[:2], case.value_cache.shape[-1])
    starts = case.query_start_loc.tolist()
    for i, (k, v) in enumerate(zip(case.keys, case.values, strict=True)):
        q = case.query[starts[i] : starts[i + 1]].float().transpose(0, 1)
        q_len, ctx = q.shape[1], k.shape[0]
        group = q.shape[0] // k.shape[1]
        k = k.float().transpose(0, 1).repeat_interleave(group, dim=0)
        v = v.float().transpose(0, 1).repeat_interleave(group, dim=0)
        scores = q @ k.transpose(-1, -2) * case.scale
        if logit_softcap:
            scores = logit_softcap * torch.tanh(scores / logit_softcap)
        key_pos, query_pos = torch.arange(ctx)[None, :], torch.arange(ctx - q_len, ctx)[:, None]
        mask = key_pos <= query_pos
        if sliding_window:
            mask &= key_pos > query_pos - sliding_window
        o = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        out[starts[i] : starts[i + 1]] = o.transpose(0, 1).to(out.dtype)
    return out


def poison_before_window(case: PagedCase, sliding_window: int) -> None:
    """NaN in every block of a sequence that lies wholly before the first key any of its
    new tokens sees: blocks a sliding window has given back to the pool."""
    block_size = case.key_cache.shape[1]
    q_lens = (case.query_start_loc[1:] - case.query_start_loc[:-1]).tolist()
    for seq, (q_len, ctx) in enumerate(zip(q_lens, case.seq_lens.tolist(), strict=True)):
        first_seen = max(0, ctx - q_len - sliding_window + 1)
        for block in case.block_tables[seq, : first_seen // block_size].tolist():
            case.key_cache[block] = float("nan")
            case.value_cache[block] = float("nan")
