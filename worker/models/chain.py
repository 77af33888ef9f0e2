"""The decoder as one native call per step (``kernels.native.chain``), where a model
is the plain pre-norm kind it runs: GGUF blocks re-laid out on a CPU host, one rank.

At batch 1 a 30-layer model's Python loop (about ten op calls a layer) cost more
than reading its weights. The chain runs the same kernels in the same order, so its
output equals the loop's to the bit; it serves the steps whose rows every projection
would run on its blocks' integer kernel (fewer than ``ChainedDecoder.below_rows``),
and the loop serves the rest (long prefills, large batches) and every other model.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kernels import DecoderChain, decoder_chain
from kernels.chain_plan import ChainLayer, ChainProjection, ChainShape
from worker.models.attention import Attention
from worker.models.attention_metadata import AttentionMetadata
from worker.models.layers import MLP
from worker.models.linear import Linear

if TYPE_CHECKING:
    from worker.models.decoder import CausalLM, DecoderLayer


@dataclass
class ChainedDecoder:
    run: DecoderChain
    below_rows: int  # the steps it serves have fewer rows (tokens) than this
    # Where set (float64 [4]), each step adds the time of its ``CHAIN_PARTS`` to it.
    seconds: torch.Tensor | None = None

    def __call__(
        self, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        return self.run(hidden.contiguous(), positions, meta.slot_mapping, meta.block_tables,
                        meta.seq_lens, meta.query_start_loc, self.seconds)  # fmt: skip


def _why_not(model: "CausalLM") -> str | None:
    """Why the chain cannot run ``model`` (None: it can)."""
    traits = model.traits
    if model.tp.size > 1:
        return "tensor parallel"
    if traits.norms != "pre" or traits.qk_norm != "none" or traits.residual_scale != 1.0:
        return "norms or scales the chain does not apply"
    if traits.latent is not None or traits.moe is not None:
        return "latent attention or experts"
    if traits.activation != "silu":
        return "an MLP activation other than SiLU"
    dtype = model.model.norm.weight.dtype
    for attention in model.model.attentions():
        if not isinstance(attention, Attention) or attention.k_scale is not None:
            return "scaled fp8 cache"
        if attention.key_cache.dtype != dtype:
            return "a cache in another dtype"
    return None


def _projection(linear: Linear) -> ChainProjection | None:
    if linear.blocks is None:
        return None
    return ChainProjection(linear.blocks, linear.bias)


def _below_rows(linears: list[Linear]) -> int:
    """Rows from which some projection would leave its blocks' integer kernel."""
    return min(min(linear.tiles_from, linear.dense_from) for linear in linears)


def chained_decoder(model: "CausalLM") -> ChainedDecoder | None:
    """The chain over ``model``'s layers and bound caches, or None where it cannot run."""
    if _why_not(model) is not None:
        return None
    layers: list[ChainLayer] = []
    linears: list[Linear] = []
    for layer in model.model.layers:
        decoder_layer: DecoderLayer = layer  # type: ignore[assignment]
        attention, mlp = decoder_layer.self_attn, decoder_layer.mlp
        assert isinstance(attention, Attention) and isinstance(mlp, MLP)
        four = [attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj]
        projections = [_projection(linear) for linear in four]
        if any(p is None for p in projections):
            return None
        qkv, o, gate_up, down = projections
        assert qkv and o and gate_up and down
        linears += four
        rope = attention.rope
        layer_plan = ChainLayer(
            decoder_layer.input_layernorm.weight, decoder_layer.post_attention_layernorm.weight,
            qkv, o, gate_up, down, attention.key_cache, attention.value_cache,
            None if rope is None else model.rope_tables[rope], attention.sliding_window,
        )  # fmt: skip
        layers.append(layer_plan)
    first: Attention = model.model.attentions()[0]  # type: ignore[assignment]
    shape = ChainShape(
        hidden=model.config.hidden_size, num_heads=first.num_heads,
        num_kv_heads=first.num_kv_heads, head_size=first.head_dim,
        eps=model.model.norm.eps, scale=first.scale, logit_softcap=first.logit_softcap,
        is_neox=first.is_neox,
    )  # fmt: skip
    run = decoder_chain(shape, layers, model.model.norm.weight.detach())
    return None if run is None else ChainedDecoder(run, _below_rows(linears))
