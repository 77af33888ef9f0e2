"""Build a model from a Hugging Face folder (config via transformers, weights via
safetensors) or from a GGUF file (``worker.models.gguf``)."""

import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, PretrainedConfig

from worker.models.attention import Attention
from worker.models.decoder import CausalLM
from worker.models.fused import FUSED_SHARDS, part_rows
from worker.models.gguf import is_gguf_file, load_gguf_config, load_gguf_model
from worker.models.int4 import SUFFIXES as INT4_SUFFIXES
from worker.models.int4 import int4_scheme, use_int4
from worker.models.linear import NEVER
from worker.models.registry import family_of
from worker.models.sharding import VOCAB_PARALLEL, TensorParallel

log = logging.getLogger("genfleet.engine")
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_config(folder: Path) -> PretrainedConfig:
    """The model's config; ``folder`` may also be a GGUF file."""
    if is_gguf_file(folder):
        return load_gguf_config(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"model folder {str(folder)!r} not found or has no config.json")
    return AutoConfig.from_pretrained(folder, local_files_only=True)


def safetensors_files(folder: Path) -> list[Path]:
    """The checkpoint files: the sharded index when there is one, else model.safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    raise ValueError(f"model folder {str(folder)!r} has no safetensors weights")


def _shard_sizes(model: CausalLM, fused: str, rows: int) -> list[int]:
    """The rows of each part of a fused parameter of ``rows`` rows: q, k and v, or
    gate and up (halves: a shared expert's MLP is not ``intermediate_size`` wide)."""
    if fused == "qkv_proj":
        attn = model.model.attentions()[0]
        assert isinstance(attn, Attention)
        return [attn.q_size, attn.kv_size, attn.kv_size]
    return [rows // 2, rows // 2]


def _target(
    model: CausalLM, params: Mapping[str, torch.Tensor], name: str
) -> tuple[str, torch.Tensor] | None:
    """The parameter (or the slice of a fused one) that checkpoint tensor ``name`` fills."""
    if name.endswith(IGNORED_SUFFIXES):
        return None
    if name == "lm_head.weight" and model.tie_word_embeddings:
        return None
    parts = name.split(".")
    if _beyond_the_layers(model, parts):
        return None
    expert = _expert_target(params, parts)
    if expert is not None:
        return expert
    for i, part in enumerate(parts):
        if part not in FUSED_SHARDS:
            continue
        fused, shard = FUSED_SHARDS[part]
        fused_name = ".".join([*parts[:i], fused, *parts[i + 1 :]])
        if fused_name not in params:  # a part the model keeps as it is (MLA's q_proj)
            continue
        sizes = _shard_sizes(model, fused, params[fused_name].shape[0])
        start = sum(sizes[:shard])
        return fused_name, params[fused_name][start : start + sizes[shard]]
    if name not in params:
        raise ValueError(f"checkpoint tensor {name!r} has no place in the model")
    if len(parts) > 1 and parts[-2] in VOCAB_PARALLEL:  # this rank's rows, not the padding
        _, _, real = model.tp.vocab_rows(model.config.vocab_size)
        return name, params[name][:real]
    return name, params[name]


def _beyond_the_layers(model: CausalLM, parts: list[str]) -> bool:
    """A tensor of a layer past ``num_hidden_layers``: DeepSeek V3's multi-token
    prediction layer, which the engine does not run."""
    if parts[:2] != ["model", "layers"] or len(parts) < 3 or not parts[2].isdigit():
        return False
    return int(parts[2]) >= model.config.num_hidden_layers


def _expert_target(
    params: Mapping[str, torch.Tensor], parts: list[str]
) -> tuple[str, torch.Tensor] | None:
    """Expert e's projection (``...experts.{e}.gate_proj.weight``): its place in the
    experts' stacked parameter, gate and up fused; None for any other tensor."""
    if "experts" not in parts:
        return None
    i = parts.index("experts")
    if i + 2 >= len(parts) or not parts[i + 1].isdigit():
        return None
    expert, projection = int(parts[i + 1]), parts[i + 2]
    fused, shard = FUSED_SHARDS.get(projection, (projection, 0))
    stacked = ".".join([*parts[: i + 1], fused])
    if stacked not in params:
        raise ValueError(f"checkpoint tensor {'.'.join(parts)!r} has no place in the model")
    rows = params[stacked][expert]
    if fused == "gate_up_proj":
        size = rows.shape[0] // 2
        rows = rows[shard * size : (shard + 1) * size]
    return stacked, rows


def _vocab_padding(model: CausalLM) -> dict[str, torch.Tensor]:
    """The rows of the vocabulary-split parameters that hold no token on this rank."""
    _, rows, real = model.tp.vocab_rows(model.config.vocab_size)
    names = ["model.embed_tokens.weight"]
    if not model.tie_word_embeddings:
        names.append("lm_head.weight")
    params = dict(model.named_parameters())
    return {name: params[name][real:] for name in names if real < rows}


def _safetensors_tensors(
    folder: Path, tp: TensorParallel, config: PretrainedConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors by the engine's names, or this rank's slices of them
    (read as slices: a rank never holds a whole split tensor)."""
    family = family_of(config)
    for path in safetensors_files(folder):
        with safe_open(path, framework="pt") as checkpoint:
            for stored in checkpoint.keys():  # noqa: SIM118 (safe_open has no __iter__)
                name = family.engine_name(stored)
                module, _, suffix = name.rpartition(".")
                # GPTQ/AWQ's packed tensors are split once re-packed (use_int4).
                packed = name.endswith(INT4_SUFFIXES)
                parts = [] if packed else part_rows(module, config)
                if parts:  # stored fused (Phi-3): its parts, each as if stored apart
                    whole = checkpoint.get_tensor(stored)
                    for part, rows in parts:
                        yield from _rank_parts({f"{part}.{suffix}": whole[rows]}, tp, config)
                    continue
                view = checkpoint.get_slice(stored)
                split = None if packed else tp.split_of(name, view.get_shape(), config)
                yield name, checkpoint.get_tensor(stored) if split is None else split.take(view)


def _rank_parts(
    tensors: Mapping[str, torch.Tensor], tp: TensorParallel, config: PretrainedConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's part of each whole tensor (GGUF's de-quantized ones)."""
    for name, tensor in tensors.items():
        split = tp.split_of(name, list(tensor.shape), config)
        yield name, tensor if split is None else split.take(tensor)


def _fill(model: CausalLM, tensors: Iterator[tuple[str, torch.Tensor]], path: Path) -> None:
    """Every parameter from the checkpoint's tensors; ValueError naming what is missing."""
    params = dict(model.named_parameters())
    filled = dict.fromkeys(params, 0)  # elements written per parameter
    with torch.no_grad():
        for name, padding in _vocab_padding(model).items():
            padding.zero_()  # rows past the vocabulary on the last rank: never read
            filled[name] = padding.numel()
    with torch.no_grad():
        for name, tensor in tensors:
            target = _target(model, params, name)
            if target is None:
                continue
            param_name, dest = target
            dest.copy_(tensor)
            filled[param_name] += dest.numel()
    missing = [name for name, count in filled.items() if count < params[name].numel()]
    if missing:
        raise ValueError(f"checkpoint in {str(path)!r} lacks weights: {missing[:5]}")


def load_model(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    tp: TensorParallel | None = None,
    dense_weights_bytes: int = 0,
) -> CausalLM:
    """The model of a Hugging Face folder or a GGUF file, ready to run on ``device``;
    with ``tp``, this rank's shard of it; on a CPU, quantized projections also
    de-quantized within ``dense_weights_bytes`` where that is faster for many rows."""
    path = Path(path)
    tp = tp or TensorParallel()
    tensors: Iterator[tuple[str, torch.Tensor]]
    if is_gguf_file(path):
        model, float_tensors = load_gguf_model(path, dtype, device, tp)
        tensors = _rank_parts(float_tensors, tp, model.config)
    else:
        config = load_config(path)
        scheme = int4_scheme(config)  # a GPTQ / AWQ checkpoint, or None
        with torch.device("meta"):
            model = CausalLM(config, tp)
        tensors = _safetensors_tensors(path, tp, config)
        if scheme is not None:
            tensors = use_int4(model, scheme, tensors, device)
            log.info("%s: projections as Q4_1 blocks", scheme.name)
    model = model.to_empty(device=device).to(dtype)
    _fill(model, tensors, path)
    if not is_gguf_file(path):  # a GGUF's norms hold their offset already
        model.fold_norm_offsets()
    model.init_rope_cache(max_positions, device)
    for part, forms in model.pack_weights(dense_weights_bytes).items():
        if forms.block_layers:
            tiles = "never" if forms.tiles_from == NEVER else f"from {forms.tiles_from} rows"
            log.info("%s: blocks de-quantized a tile at a time per step %s", part, tiles)
        if forms.copies.layers:
            log.info(
                "%s: %d of %d layers also de-quantized (%.1f MiB), for steps from %d rows",
                part,
                forms.copies.layers,
                forms.block_layers,
                forms.copies.bytes / 2**20,
                forms.copies.from_rows,
            )
    return model.eval()
