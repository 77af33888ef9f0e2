"""Rotary position embedding tables, with every scaling the supported families use
(``default``, ``linear``, ``dynamic``, ``llama3``, ``yarn``, ``longrope``), a rope of
its own per layer type (Gemma 3's local layers) and rotary over part of a head
(``partial_rotary_factor``, Phi-4)."""

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def _keyed_type(config: PretrainedConfig, layer_type: str | None) -> str | None:
    """``layer_type`` where the config keeps its rope parameters per layer type
    (``{"sliding_attention": {...}, "full_attention": {...}}``), else None."""
    params = getattr(config, "rope_parameters", None) or {}
    return layer_type if isinstance(params.get(layer_type), dict) else None


def rope_parameters(config: PretrainedConfig, layer_type: str | None = None) -> dict:
    """The rope parameters of the config, or of one layer type where it keeps them so."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    params = dict(params or {})
    if (keyed := _keyed_type(config, layer_type)) is not None:
        params = dict(params[keyed])
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    return params


def inverse_frequencies(
    config: PretrainedConfig, head_dim: int, layer_type: str | None = None, **kwargs: object
) -> tuple[torch.Tensor, float]:
    """Per-pair inverse frequencies and the attention scaling the rope type asks for."""
    params = rope_parameters(config, layer_type)
    rope_type = params["rope_type"]
    if rope_type == "default":
        dim = int(head_dim * params["partial_rotary_factor"])
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (params["rope_theta"] ** exponents), 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope type {rope_type!r}")
    init = ROPE_INIT_FUNCTIONS[rope_type]
    inv_freq, scaling = init(
        config, torch.device("cpu"), layer_type=_keyed_type(config, layer_type), **kwargs
    )
    return inv_freq.float(), float(scaling)


def _table(inv_freq: torch.Tensor, scaling: float, positions: torch.Tensor) -> torch.Tensor:
    freqs = positions[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)


def cos_sin_cache(
    config: PretrainedConfig, head_dim: int, max_positions: int, layer_type: str | None = None
) -> torch.Tensor:
    """[max_positions, rotary_dim] float32 table: cos in the first half, sin in the
    second. LongRoPE takes its short factors below ``original_max_position_embeddings``
    and its long ones from there on, position by position (as vLLM does; transformers
    switches a whole sequence once it grows past that length)."""
    positions = torch.arange(max_positions, dtype=torch.float32)
    params = rope_parameters(config, layer_type)
    if params["rope_type"] != "longrope":
        return _table(*inverse_frequencies(config, head_dim, layer_type), positions)
    original = params.get("original_max_position_embeddings") or config.max_position_embeddings
    short = _table(*inverse_frequencies(config, head_dim, layer_type), positions)
    long = _table(
        *inverse_frequencies(config, head_dim, layer_type, seq_len=original + 1), positions
    )
    return torch.where(positions[:, None] < original, short, long)
