"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM2) over the paged KV cache.

Tokens of all sequences of a step arrive flattened as one [num_tokens] batch;
attention is the only op that needs to know where one sequence ends, and it
learns that from the AttentionMetadata passed down the forward call.
"""

from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import PretrainedConfig

from kernels import (
    paged_attention,
    rotary_embedding,
    silu_and_mul,
    write_kv_cache,
)
from worker.models.attention_metadata import AttentionMetadata
from worker.models.layers import Embedding, RMSNorm
from worker.models.linear import BlockForms, Linear, choose_block_forms
from worker.models.rotary import cos_sin_cache
from worker.models.sharding import TensorParallel

if TYPE_CHECKING:
    pass

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def head_dim_of(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class Attention(nn.Module):
    """This rank's attention heads (all of them without tensor parallelism)."""

    def __init__(self, config: PretrainedConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.num_heads = tp.split(config.num_attention_heads, "attention heads")
        self.num_kv_heads, _ = tp.kv_heads(config.num_key_value_heads)
        self.head_dim = head_dim_of(config)
        self.scale = self.head_dim**-0.5
        attention_bias = bool(getattr(config, "attention_bias", False))
        # Qwen2 has a bias on q, k and v but not on the output projection.
        qkv_bias = attention_bias or config.model_type == "qwen2"
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, qkv_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, attention_bias)
        # Views into the runner's cache tensors, set once the cache is allocated.
        self.key_cache = torch.empty(0)
        self.value_cache = torch.empty(0)
        # With calculated scales (calculate_kv_scales) an fp8 cache holds k / k_scale and
        # v / v_scale: 0-d tensors, so that CUDA graphs replay with the values the first
        # prefill sets. Without, there are none (scales of 1.0 cost nothing).
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        self.calculate_scales = False

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        rope_cache: torch.Tensor,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        rotary_embedding(positions, q, k, rope_cache, self.head_dim, True)
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
        )
        if self.v_scale is not None:
            out = out * self.v_scale
        return self.tp.all_reduce(self.o_proj(out.view(num_tokens, self.q_size)))

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


class MLP(nn.Module):
    def __init__(self, config: PretrainedConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        bias = bool(getattr(config, "mlp_bias", False))
        size = tp.split(config.intermediate_size, "intermediate features")
        self.gate_up_proj = Linear(config.hidden_size, 2 * size, bias)
        self.down_proj = Linear(size, config.hidden_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(silu_and_mul(self.gate_up_proj(x))))


class DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.self_attn = Attention(config, tp)
        self.mlp = MLP(config, tp)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        meta: AttentionMetadata,
        rope_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden, _ = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, meta, rope_cache)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: PretrainedConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(
            DecoderLayer(config, tp) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def attentions(self) -> list[Attention]:
        """Each decoder layer's attention, in order (``ModuleList`` items are untyped)."""
        return [layer.self_attn for layer in self.layers if isinstance(layer, DecoderLayer)]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        rope_cache: torch.Tensor,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, meta, rope_cache)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: PretrainedConfig, tp: TensorParallel | None = None) -> None:
        super().__init__()
        tp = tp or TensorParallel()
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model type {config.model_type!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        self.config = config
        self.tp = tp
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.model = LlamaModel(config, tp)
        if not self.tie_word_embeddings:
            _, rows, _ = tp.vocab_rows(config.vocab_size)
            self.lm_head = Linear(config.hidden_size, rows, bias=False)
        self.rope_cache = torch.empty(0)
        # The tied embedding as an output layer (``pack_weights``): over its blocks or
        # weight, which the embedding owns.
        self.tied_output: Linear | None = None

    def output_layer(self) -> Linear | None:
        return self.tied_output if self.tie_word_embeddings else self.lm_head

    def pack_weights(self, dense_bytes: int = 0) -> dict[str, BlockForms]:
        """Re-lay out every projection for the CPU matmul library (no-op elsewhere),
        time where block layers de-quantize tiles, and keep de-quantized copies of
        them within ``dense_bytes``: of the projections, then of the output layer,
        timed on its own (it sees only a step's sampled rows, and its shape is unlike
        theirs)."""
        if self.tie_word_embeddings:
            self.tied_output = self.model.embed_tokens.as_output_layer()
        linears = [module for module in self.modules() if isinstance(module, Linear)]
        for module in linears:
            module.pack()
        if self.tied_output is not None and self.tied_output.blocks is not None:
            self.model.embed_tokens.use_packed(self.tied_output.blocks)
        dtype = self.model.norm.weight.dtype
        output = self.output_layer()
        projections = [module for module in linears if module is not output]
        forms = {"projections": choose_block_forms(projections, dtype, dense_bytes)}
        left = dense_bytes - forms["projections"].copies.bytes
        forms["output layer"] = choose_block_forms([output] if output else [], dtype, left)
        return forms

    def init_rope_cache(self, max_positions: int, device: torch.device) -> None:
        """Build the cos/sin table; separate from __init__ since models are built on meta."""
        self.rope_cache = cos_sin_cache(self.config, head_dim_of(self.config), max_positions).to(
            device
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        return self.model(input_ids, positions, meta, self.rope_cache)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits for the given hidden states (only the positions that sample);
        under tensor parallelism every rank's vocabulary range, gathered."""
        if self.tp.size > 1:
            local = self._local_logits(hidden)
            return self.tp.all_gather(local)[:, : self.config.vocab_size].float()
        return self._local_logits(hidden).float()

    def _local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        output = self.output_layer()
        if output is None:  # tied, not packed (a model used without ``pack_weights``)
            return torch.nn.functional.linear(hidden, self.model.embed_tokens.weight)
        return output(hidden)
