"""The plan of a whole pre-norm decoder for ``kernels.decoder_chain``: per layer its
norms' weights, projections (GGUF blocks re-laid out), cache views and rotary table."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kernels.native.quantized import PackedWeight

# What a step's time is split into where it asks for a profile (in this order); the
# attention's part holds q/k norms, rotary and the cache write.
CHAIN_PARTS = ("norms", "projections", "attention", "activation")


@dataclass
class ChainProjection:
    blocks: "PackedWeight"
    bias: torch.Tensor | None


@dataclass
class ChainLayer:
    """One layer's part of the plan: its norms' weights, projections, cache views
    ([blocks, block_size, KV heads, head size], contiguous) and rotary table (None:
    no rotary in this layer)."""

    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    qkv: ChainProjection
    o: ChainProjection
    gate_up: ChainProjection
    down: ChainProjection
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    cos_sin: torch.Tensor | None
    sliding_window: int
    # Per-head RMSNorm weights of q and k before rotary (Qwen3); None: none.
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None


@dataclass
class ChainShape:
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    eps: float
    scale: float
    logit_softcap: float
    is_neox: bool
