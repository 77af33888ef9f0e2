"""What sets one decoder family apart from another, read from its config once: the
shared layers (``attention``, ``layers``, ``decoder``) are built from these traits, and
each family module (``worker/models/families/``) says how its config maps to them."""

from dataclasses import dataclass
from typing import Literal

from transformers import PretrainedConfig

Norms = Literal["pre", "sandwich", "post"]
QkNorm = Literal["none", "head", "whole"]
Activation = Literal["silu", "gelu_tanh"]


@dataclass(frozen=True)
class LayerTraits:
    # Each token sees its last this many positions (0: every earlier one).
    sliding_window: int = 0
    # The rotary table the layer rotates q and k with (a key of ``rope_tables``), or
    # None for a layer without rotary embeddings (SmolLM3's every fourth).
    rope: str | None = "default"


@dataclass(frozen=True)
class MoETraits:
    """A mixture of experts in place of the MLP on ``sparse_layers``."""

    experts: int
    top_k: int
    intermediate: int  # each routed expert's intermediate size
    sparse_layers: frozenset[int]
    # The top-k softmax weights scaled to sum to 1 (Mixtral, Qwen3-MoE) or kept as
    # the softmax over every expert gave them (Qwen2-MoE's default).
    renormalize: bool = True
    shared_intermediate: int = 0  # a shared expert every token also goes through (0: none)
    shared_gate: bool = False  # Qwen2-MoE: the shared output times sigmoid(gate(x))
    # DeepSeek's routers: sigmoid scores (V3) instead of a softmax; experts in ``groups``
    # of which each token may only use its ``top_groups`` best, a group scored by its
    # best expert (V2's group-limited greedy) or its best two summed (V3); the chosen
    # weights times ``routed_scaling``.
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    groups: int = 1
    top_groups: int = 1
    group_score: Literal["max", "top2_sum"] = "max"
    routed_scaling: float = 1.0
    # DeepSeek V3: a learned per-expert bias added to the scores that pick experts.
    correction_bias: bool = False


@dataclass(frozen=True)
class LatentTraits:
    """Multi-head latent attention (DeepSeek V2/V3): every head's keys and values come
    from one compressed latent of ``kv_lora_rank`` features per token, which the cache
    holds beside the ``rope_dim`` rotary key that all heads share."""

    kv_lora_rank: int
    q_lora_rank: int  # q through a low-rank projection and its norm (0: one projection)
    nope_dim: int  # each head's q/k features without rotary
    rope_dim: int  # each head's q/k features with rotary
    value_dim: int


@dataclass(frozen=True)
class Traits:
    layers: tuple[LayerTraits, ...]
    head_dim: int
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    # RMSNorm of q and k: per head (Qwen3, Gemma 3) or over the whole projection (OLMo 2).
    qk_norm: QkNorm = "none"
    # Where the layer's norms stand: before attention and MLP (Llama); before and after
    # both (Gemma 2/3); after both only (OLMo 2).
    norms: Norms = "pre"
    # Added to every RMSNorm weight at load: Gemma's norms multiply by (1 + w).
    norm_offset: float = 0.0
    activation: Activation = "silu"
    embedding_scale: float = 1.0
    # What attention and MLP outputs are multiplied by before the residual add (Granite).
    residual_scale: float = 1.0
    attention_scale: float | None = None  # None: head_dim ** -0.5
    logits_scale: float = 1.0
    attn_logit_softcap: float = 0.0
    final_logit_softcap: float = 0.0
    # Rotary tables by name: the config (and layer type) each is computed from.
    rope_tables: tuple[str, ...] = ("default",)
    # Rotary over interleaved pairs (x0, x1), (x2, x3)... (DeepSeek) instead of halves.
    interleaved_rope: bool = False
    moe: MoETraits | None = None
    latent: LatentTraits | None = None

    @property
    def scale(self) -> float:
        return self.attention_scale or self.head_dim**-0.5

    @property
    def sliding_everywhere(self) -> int:
        """The window when every layer slides by the same one, else 0."""
        windows = {layer.sliding_window for layer in self.layers}
        return windows.pop() if len(windows) == 1 else 0


def head_dim_of(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def sliding_windows(config: PretrainedConfig) -> list[int]:
    """Each layer's window: ``layer_types`` where the config has them (Qwen2/3, Gemma,
    SmolLM3), else ``sliding_window`` on every layer (Mistral, Phi-3) or none."""
    window = getattr(config, "sliding_window", None) or 0
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return [window] * config.num_hidden_layers
    return [window if kind == "sliding_attention" else 0 for kind in layer_types]


def plain_layers(config: PretrainedConfig) -> tuple[LayerTraits, ...]:
    return tuple(LayerTraits(sliding_window=w) for w in sliding_windows(config))


def llama_traits(config: PretrainedConfig) -> Traits:
    """Llama's decoder as its config describes it: the base the other families vary."""
    attention_bias = bool(getattr(config, "attention_bias", False))
    return Traits(
        layers=plain_layers(config),
        head_dim=head_dim_of(config),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
    )
