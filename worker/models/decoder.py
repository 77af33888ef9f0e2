"""The decoder every family is built from, over the paged KV cache.

Tokens of all sequences of a step arrive flattened as one [num_tokens] batch;
attention is the only op that needs to know where one sequence ends, and it
learns that from the AttentionMetadata passed down the forward call. What sets a
family apart (norm placement, q/k norms, windows, multipliers, soft-caps) comes from
its traits (``worker.models.traits``), read once from its config by the registry.
"""

from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import PretrainedConfig

from worker.models.attention import Attention
from worker.models.attention_metadata import AttentionMetadata
from worker.models.chain import ChainedDecoder, chained_decoder
from worker.models.latent_attention import LatentAttention
from worker.models.layers import MLP, Embedding, RMSNorm
from worker.models.linear import BlockForms, Linear, choose_block_forms
from worker.models.moe import Experts, SparseMoE
from worker.models.registry import family_of
from worker.models.rotary import cos_sin_cache
from worker.models.sharding import TensorParallel
from worker.models.traits import Traits

if TYPE_CHECKING:
    from collections.abc import Iterator


class DecoderLayer(nn.Module):
    def __init__(
        self, config: PretrainedConfig, traits: Traits, index: int, tp: TensorParallel
    ) -> None:
        super().__init__()
        self.self_attn: Attention | LatentAttention
        if traits.latent is None:
            self.self_attn = Attention(config, traits, index, tp)
        else:
            self.self_attn = LatentAttention(config, traits, index, tp)
        mlp_bias, activation, moe = traits.mlp_bias, traits.activation, traits.moe
        self.mlp: MLP | SparseMoE
        if moe is not None and index in moe.sparse_layers:
            self.mlp = SparseMoE(config.hidden_size, moe, activation, tp)
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size, mlp_bias, activation, tp)
        self.norms = traits.norms
        size, eps = config.hidden_size, config.rms_norm_eps
        # Named as the checkpoints name them. Llama's post_attention_layernorm is the
        # norm before the MLP; Gemma's and OLMo's stands after attention.
        if traits.norms != "post":
            self.input_layernorm = RMSNorm(size, eps)
        self.post_attention_layernorm = RMSNorm(size, eps)
        if traits.norms == "sandwich":
            self.pre_feedforward_layernorm = RMSNorm(size, eps)
        if traits.norms != "pre":
            self.post_feedforward_layernorm = RMSNorm(size, eps)
        self.residual_scale = traits.residual_scale

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        meta: AttentionMetadata,
        rope_tables: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output as (hidden, residual): the stream is their sum, left
        unadded so that the next norm fuses the add."""
        if self.norms == "post":  # OLMo 2: the stream itself goes in
            stream = hidden if residual is None else hidden + residual
            attended, _ = self.post_attention_layernorm(
                self.self_attn(positions, stream, meta, rope_tables)
            )
            stream = stream + attended
            out, _ = self.post_feedforward_layernorm(self.mlp(stream))
            return out, stream
        if residual is None:
            residual = hidden
            hidden, _ = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, meta, rope_tables)
        if self.norms == "sandwich":  # Gemma: normed after attention and after the MLP
            hidden, _ = self.post_attention_layernorm(hidden)
            hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
            hidden, _ = self.post_feedforward_layernorm(self.mlp(hidden))
            return hidden, residual
        hidden, residual = self.post_attention_layernorm(self._scaled(hidden), residual)
        return self._scaled(self.mlp(hidden)), residual

    def _scaled(self, branch: torch.Tensor) -> torch.Tensor:
        """A residual branch times Granite's multiplier; untouched (no copy) elsewhere."""
        return branch if self.residual_scale == 1.0 else branch * self.residual_scale


class DecoderModel(nn.Module):
    def __init__(self, config: PretrainedConfig, traits: Traits, tp: TensorParallel) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, tp)
        self.embedding_scale = traits.embedding_scale
        self.layers = nn.ModuleList(
            DecoderLayer(config, traits, i, tp) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # The layers as one native call for small steps (``bind_chain``), where it runs.
        self.chained: ChainedDecoder | None = None

    def attentions(self) -> list[Attention | LatentAttention]:
        """Each decoder layer's attention, in order (``ModuleList`` items are untyped)."""
        return [layer.self_attn for layer in self.layers if isinstance(layer, DecoderLayer)]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        rope_tables: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        if self.embedding_scale != 1.0:
            hidden = hidden * self.embedding_scale
        if self.chained is not None and input_ids.numel() < self.chained.below_rows:
            return self.chained(hidden, positions, meta)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, meta, rope_tables)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class CausalLM(nn.Module):
    """A decoder and its output layer, for any family the registry knows."""

    def __init__(self, config: PretrainedConfig, tp: TensorParallel | None = None) -> None:
        super().__init__()
        tp = tp or TensorParallel()
        self.family = family_of(config)
        self.traits = self.family.traits(config)
        if tp.size > 1 and self.family.no_tensor_parallel:
            raise ValueError(
                f"tensor parallelism is not supported for {self.family.name}: "
                f"{self.family.no_tensor_parallel}"
            )
        self.config = config
        self.tp = tp
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.model = DecoderModel(config, self.traits, tp)
        if not self.tie_word_embeddings:
            _, rows, _ = tp.vocab_rows(config.vocab_size)
            self.lm_head = Linear(config.hidden_size, rows, bias=False)
        self.rope_tables: dict[str, torch.Tensor] = {}
        # The tied embedding as an output layer (``pack_weights``): over its blocks or
        # weight, which the embedding owns.
        self.tied_output: Linear | None = None

    def output_layer(self) -> Linear | None:
        return self.tied_output if self.tie_word_embeddings else self.lm_head

    def norms(self) -> "Iterator[RMSNorm]":
        return (module for module in self.modules() if isinstance(module, RMSNorm))

    def fold_norm_offsets(self) -> None:
        """Gemma's norms multiply by (1 + w): the 1 goes into the weights once, as
        llama.cpp stores them in a GGUF (whose weights are folded already)."""
        if self.traits.norm_offset:
            with torch.no_grad():
                for norm in self.norms():
                    norm.weight.add_(self.traits.norm_offset)

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
        for experts in self.modules():
            if isinstance(experts, Experts):
                experts.pack()
        if self.tied_output is not None and self.tied_output.blocks is not None:
            self.model.embed_tokens.use_packed(self.tied_output.blocks)
        dtype = self.model.norm.weight.dtype
        output = self.output_layer()
        projections = [module for module in linears if module is not output]
        forms = {"projections": choose_block_forms(projections, dtype, dense_bytes)}
        left = dense_bytes - forms["projections"].copies.bytes
        forms["output layer"] = choose_block_forms([output] if output else [], dtype, left)
        return forms

    def bind_chain(self) -> None:
        """Run small steps through the native decoder chain where this model is its
        kind (``worker.models.chain``); called once the caches are bound."""
        decoder = self.model
        decoder.chained = chained_decoder(
            decoder.layers, decoder.norm, self.traits, self.tp, self.rope_tables,
            self.config.hidden_size,
        )  # fmt: skip

    def init_rope_cache(self, max_positions: int, device: torch.device) -> None:
        """Build the cos/sin tables; separate from __init__ since models are built on meta."""
        head_dim = self.traits.head_dim
        self.rope_tables = {
            name: cos_sin_cache(self.config, head_dim, max_positions, name).to(device)
            for name in self.traits.rope_tables
        }

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        return self.model(input_ids, positions, meta, self.rope_tables)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits for the given hidden states (only the positions that sample);
        under tensor parallelism every rank's vocabulary range, gathered."""
        if self.tp.size > 1:
            local = self._local_logits(hidden)
            logits = self.tp.all_gather(local)[:, : self.config.vocab_size].float()
        else:
            logits = self._local_logits(hidden).float()
        if self.traits.logits_scale != 1.0:
            logits = logits * self.traits.logits_scale
        if cap := self.traits.final_logit_softcap:
            logits = cap * torch.tanh(logits / cap)
        return logits

    def _local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        output = self.output_layer()
        if output is None:  # tied, not packed (a model used without ``pack_weights``)
            return torch.nn.functional.linear(hidden, self.model.embed_tokens.weight)
        return output(hidden)
