"""One decoder layer's attention over the paged KV cache, as a family's traits shape it:
biases, a norm of q and k, rotary (or none), a sliding window, soft-capped scores."""

import torch
from torch import nn
from transformers import PretrainedConfig

from kernels import paged_attention, rotary_embedding, write_kv_cache
from worker.models.attention_metadata import AttentionMetadata
from worker.models.layers import RMSNorm
from worker.models.linear import Linear
from worker.models.sharding import TensorParallel
from worker.models.traits import Traits


class Attention(nn.Module):
    """This rank's attention heads (all of them without tensor parallelism)."""

    values_in_keys = False  # the cache holds key rows and value rows

    def __init__(
        self, config: PretrainedConfig, traits: Traits, index: int, tp: TensorParallel
    ) -> None:
        super().__init__()
        self.tp = tp
        self.num_heads = tp.split(config.num_attention_heads, "attention heads")
        self.num_kv_heads, _ = tp.kv_heads(config.num_key_value_heads)
        self.head_dim = self.cache_width = traits.head_dim
        self.scale = traits.scale
        layer = traits.layers[index]
        self.sliding_window = layer.sliding_window
        self.rope = layer.rope
        self.is_neox = not traits.interleaved_rope
        self.logit_softcap = traits.attn_logit_softcap
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        hidden = config.hidden_size
        self.qkv_proj = Linear(hidden, self.q_size + 2 * self.kv_size, traits.qkv_bias)
        self.o_proj = Linear(self.q_size, hidden, traits.o_bias)
        self.qk_norm = traits.qk_norm
        if traits.qk_norm != "none":
            whole = traits.qk_norm == "whole"
            eps = config.rms_norm_eps
            self.q_norm = RMSNorm(self.q_size if whole else self.head_dim, eps)
            self.k_norm = RMSNorm(self.kv_size if whole else self.head_dim, eps)
        # Views into the runner's cache tensors, set once the cache is allocated.
        self.key_cache = torch.empty(0)
        self.value_cache = torch.empty(0)
        # With calculated scales (calculate_kv_scales) an fp8 cache holds k / k_scale and
        # v / v_scale: 0-d tensors, so that CUDA graphs replay with the values the first
        # prefill sets. Without, there are none (scales of 1.0 cost nothing).
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        self.calculate_scales = False

    def bind_cache(self, layer_cache: torch.Tensor) -> None:
        """Take this layer's keys and values ([2, blocks, block_size, kv heads, head_dim])."""
        self.key_cache, self.value_cache = layer_cache[0], layer_cache[1]

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        rope_tables: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm != "none":
            q, k = self._normed(q, k)
        if self.rope is not None:
            rotary_embedding(positions, q, k, rope_tables[self.rope], self.head_dim, self.is_neox)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.k_scale is not None and self.v_scale is not None:
            q, k, v = self._scaled(q, k, v, self.k_scale, self.v_scale)
        write_kv_cache(k, v, self.key_cache, self.value_cache, meta.slot_mapping)
        out = paged_attention(
            q.view(num_tokens, self.num_heads, self.head_dim),
            self.key_cache,
            self.value_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            self.scale,
            self.sliding_window,
            self.logit_softcap,
        )
        if self.v_scale is not None:
            out = out * self.v_scale
        return self.tp.all_reduce(self.o_proj(out.view(num_tokens, self.q_size)))

    def _normed(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k through their norms: per head, or over the whole projection."""
        width = self.head_dim if self.qk_norm == "head" else None
        return _norm(self.q_norm, q, width), _norm(self.k_norm, k, width)

    def _scaled(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor,
        v_scale: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """What an fp8 cache stores (k / k_scale, v / v_scale), and q times k_scale, so
        that q . k comes out of the cache unchanged (v_scale is applied to the output)."""
        if self.calculate_scales:  # vLLM's: max |x| over the first prefill / 200 (K), 100 (V)
            k_scale.copy_((k.abs().amax() / 200).clamp(min=1e-8))
            v_scale.copy_((v.abs().amax() / 100).clamp(min=1e-8))
            self.calculate_scales = False
        return q * k_scale, k / k_scale, v / v_scale


def _norm(norm: RMSNorm, x: torch.Tensor, width: int | None) -> torch.Tensor:
    """``x`` [tokens, features] normalised over rows of ``width`` (None: whole rows)."""
    rows = x.reshape(-1, width) if width else x
    return norm(rows)[0].view(x.shape)
