"""Multi-head latent attention (DeepSeek V2/V3) over the paged KV cache.

The cache holds one row per token: the normed latent (``kv_lora_rank`` features),
then the rotated rotary key (``rope_dim``) that every head shares, as one KV head.
Keys and values are never expanded per head. Each head's q without rotary goes into
latent space through its W_UK (``kv_b_proj``'s key rows: the absorbed weights), so
that q . k = q_latent . latent + q_rope . k_rope is attention over the cached rows as
they are; the output, a weighted sum of latents (the rows' first ``kv_lora_rank``
features, read as values in place), leaves latent space through each head's W_UV
(``kv_b_proj``'s value rows). One path for prefills and decodes, so prefix caching,
chunked prefill and preemption work on these rows as on any other cache.

Under tensor parallelism each rank holds its heads' q, W_UK, W_UV and o_proj columns;
the latent projection and the cache rows are whole on every rank.
"""

import torch
from torch import nn
from transformers import PretrainedConfig

from kernels import paged_attention, rotary_embedding, write_kv_cache
from worker.models.attention_metadata import AttentionMetadata
from worker.models.layers import RMSNorm
from worker.models.linear import Linear
from worker.models.sharding import TensorParallel
from worker.models.traits import Traits

# DeepSeek's q and latent norms keep their own epsilon, not the config's rms_norm_eps.
LATENT_NORM_EPS = 1e-6


class LatentAttention(nn.Module):
    """This rank's heads of multi-head latent attention."""

    values_in_keys = True  # the cache has no value rows: values are the latents

    def __init__(
        self, config: PretrainedConfig, traits: Traits, index: int, tp: TensorParallel
    ) -> None:
        super().__init__()
        latent = traits.latent
        assert latent is not None
        self.tp = tp
        self.num_heads = tp.split(config.num_attention_heads, "attention heads")
        self.num_kv_heads = 1
        self.rank, self.nope_dim = latent.kv_lora_rank, latent.nope_dim
        self.rope_dim, self.value_dim = latent.rope_dim, latent.value_dim
        self.cache_width = self.rank + self.rope_dim
        self.scale = traits.scale
        self.rope = traits.layers[index].rope
        self.is_neox = not traits.interleaved_rope
        hidden = config.hidden_size
        q_width = self.num_heads * (self.nope_dim + self.rope_dim)
        self.q_lora_rank = latent.q_lora_rank
        if self.q_lora_rank:
            self.q_a_proj = Linear(hidden, self.q_lora_rank, traits.qkv_bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = Linear(self.q_lora_rank, q_width, bias=False)
        else:
            self.q_proj = Linear(hidden, q_width, bias=False)
        self.kv_a_proj_with_mqa = Linear(hidden, self.cache_width, traits.qkv_bias)
        self.kv_a_layernorm = RMSNorm(self.rank, LATENT_NORM_EPS)
        # Never run as a projection: per head, its key rows are W_UK and its value rows
        # W_UV, applied to q and to attention's output (a plain torch layer, so that it
        # is neither re-laid out nor quantized).
        self.kv_b_proj = nn.Linear(
            self.rank, self.num_heads * (self.nope_dim + self.value_dim), bias=False
        )
        self.o_proj = Linear(self.num_heads * self.value_dim, hidden, traits.o_bias)
        self.key_cache = torch.empty(0)  # set with the cache (bind_cache)
        self.value_cache = torch.empty(0)
        # An fp8 cache with a calculated scale holds row / k_scale (there is one row).
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None  # unused: values are the keys' rows
        self.calculate_scales = False

    def bind_cache(self, layer_cache: torch.Tensor) -> None:
        """Take this layer's rows of the cache ([1, blocks, block_size, 1, width]): the
        values are a view of their first ``kv_lora_rank`` features."""
        self.key_cache = layer_cache[0]
        self.value_cache = self.key_cache[..., : self.rank]

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        rope_tables: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        tokens, heads, nope = hidden.shape[0], self.num_heads, self.nope_dim
        q = self._query(hidden).view(tokens, heads, nope + self.rope_dim)
        latent, k_rope = self.kv_a_proj_with_mqa(hidden).split([self.rank, self.rope_dim], -1)
        latent, _ = self.kv_a_layernorm(latent)
        q_rope, k_rope = q[..., nope:].contiguous(), k_rope.contiguous()
        if self.rope is not None:
            table = rope_tables[self.rope]
            rotary_embedding(
                positions, q_rope.view(tokens, -1), k_rope, table, self.rope_dim, self.is_neox
            )
        weights = self.kv_b_proj.weight.view(heads, nope + self.value_dim, self.rank)
        # [heads, tokens, nope] @ [heads, nope, rank]: each head's q in latent space.
        q_latent = torch.bmm(q[..., :nope].transpose(0, 1), weights[:, :nope])
        query = torch.cat((q_latent.transpose(0, 1), q_rope), dim=-1)
        row = torch.cat((latent, k_rope), dim=-1).view(tokens, 1, self.cache_width)
        if self.k_scale is not None:
            query, row = self._scaled(query, row, self.k_scale)
        # The row is the value too: written once as key and once, in place, as value.
        write_kv_cache(row, row, self.key_cache, self.key_cache, meta.slot_mapping)
        out = paged_attention(
            query,
            self.key_cache,
            self.value_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            self.scale,
        )  # [tokens, heads, rank]
        if self.k_scale is not None:
            out = out * self.k_scale
        # [heads, tokens, rank] @ [heads, rank, value_dim]: out of latent space per head.
        values = torch.bmm(out.transpose(0, 1), weights[:, nope:].transpose(1, 2))
        flat = values.transpose(0, 1).reshape(tokens, heads * self.value_dim)
        return self.tp.all_reduce(self.o_proj(flat))

    def _query(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.q_lora_rank:
            return self.q_proj(hidden)
        compressed, _ = self.q_a_layernorm(self.q_a_proj(hidden))
        return self.q_b_proj(compressed)

    def _scaled(
        self, query: torch.Tensor, row: torch.Tensor, k_scale: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What an fp8 cache stores (row / k_scale) and q times k_scale, so that q . k
        comes out of the cache unchanged (the output is multiplied back by k_scale)."""
        if self.calculate_scales:  # as for keys elsewhere: max |x| of the first prefill / 200
            k_scale.copy_((row.abs().amax() / 200).clamp(min=1e-8))
            self.calculate_scales = False
        return query * k_scale, row / k_scale
