"""The decoder as one native call per step (``kernels.native.chain``), where a model
is the plain pre-norm kind it runs: GGUF blocks re-laid out on a CPU host, one rank.

At batch 1 a 30-layer model's Python loop (about ten op calls a layer) cost more
than reading its weights. The chain runs the same kernels in the same order, so its
output equals the loop's to the bit; it serves the steps whose rows every projection
would run on its blocks' integer kernel (fewer than ``ChainedDecoder.below_rows``),
and the loop serves the rest (long prefills, large batches) and every other model.
"""

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kernels import ChainLayer, ChainProjection, ChainShape, DecoderChain, decoder_chain
from worker.models.attention import Attention
from worker.models.attention_metadata import AttentionMetadata
from worker.models.layers import MLP, RMSNorm
from worker.models.linear import Linear

if TYPE_CHECKING:
    from torch import nn

    from worker.models.sharding import TensorParallel
    from worker.models.traits import Traits

log = logging.getLogger("genfleet.engine")


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


def _why_not(traits: "Traits", tp: "TensorParallel") -> str | None:
    """Why the chain cannot run a model of ``traits`` (None: it may, layers permitting)."""
    if tp.size > 1:
        return "tensor parallel"
    if traits.norms != "pre" or traits.qk_norm == "whole" or traits.residual_scale != 1.0:
        return "norms or scales the chain does not apply"
    if traits.latent is not None or traits.moe is not None:
        return "latent attention or experts"
    if traits.activation != "silu":
        return "an MLP activation other than SiLU"
    return None


def _projection(linear: Linear) -> ChainProjection | None:
    if linear.blocks is None:
        return None
    return ChainProjection(linear.blocks, linear.bias)


def _layer_plan(
    layer: "nn.Module", dtype: torch.dtype, rope_tables: dict[str, torch.Tensor]
) -> tuple[ChainLayer, list[Linear]] | None:
    """One decoder layer's plan and projections; None where the chain cannot run it
    (float weights, a scaled fp8 cache or one in another dtype)."""
    attention, mlp = layer.self_attn, layer.mlp
    assert isinstance(attention, Attention) and isinstance(mlp, MLP)
    if attention.k_scale is not None or attention.key_cache.dtype != dtype:
        return None
    four = [attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj]
    projections = [_projection(linear) for linear in four]
    if any(p is None for p in projections):
        return None
    qkv, o, gate_up, down = projections
    assert qkv and o and gate_up and down
    before_attention, before_mlp = layer.input_layernorm, layer.post_attention_layernorm
    assert isinstance(before_attention, RMSNorm) and isinstance(before_mlp, RMSNorm)
    rope = attention.rope
    plan = ChainLayer(
        before_attention.weight, before_mlp.weight, qkv, o, gate_up, down, attention.key_cache,
        attention.value_cache, None if rope is None else rope_tables[rope],
        attention.sliding_window, *_qk_norms(attention),
    )  # fmt: skip
    return plan, four


def _qk_norms(attention: Attention) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The per-head q and k norms' weights, where the layer has them."""
    if attention.qk_norm == "none":
        return None, None
    return attention.q_norm.weight, attention.k_norm.weight


def _below_rows(linears: list[Linear]) -> int:
    """Rows from which some projection would leave its blocks' integer kernel."""
    return min(min(linear.tiles_from, linear.dense_from) for linear in linears)


def chained_decoder(
    layers: "nn.ModuleList", norm: RMSNorm, traits: "Traits", tp: "TensorParallel",
    rope_tables: dict[str, torch.Tensor], hidden_size: int,
) -> ChainedDecoder | None:  # fmt: skip
    """The chain over a decoder's ``layers`` (caches bound) and final ``norm``, or None
    where it cannot run them."""
    reason = _why_not(traits, tp)
    if reason is not None:
        log.info("small steps run the layer loop, not the native decoder chain: %s", reason)
        return None
    plans: list[ChainLayer] = []
    linears: list[Linear] = []
    for layer in layers:
        planned = _layer_plan(layer, norm.weight.dtype, rope_tables)
        if planned is None:
            return None
        plans.append(planned[0])
        linears += planned[1]
    first = layers[0].self_attn
    assert isinstance(first, Attention)
    shape = ChainShape(
        hidden=hidden_size, num_heads=first.num_heads, num_kv_heads=first.num_kv_heads,
        head_size=first.head_dim, eps=norm.eps, scale=first.scale,
        logit_softcap=first.logit_softcap, is_neox=first.is_neox,
    )  # fmt: skip
    run = decoder_chain(shape, plans, norm.weight.detach())
    return None if run is None else ChainedDecoder(run, _below_rows(linears))
