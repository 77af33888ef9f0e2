"""Serve a GGUF file as llama.cpp writes it, its weights kept in their blocks.

The config and tokenizer come from the file as transformers reads them (vLLM
takes a ``.gguf`` path the same way), or, for a file inside a model folder (as
``genfleet model fetch`` leaves the default model), from that folder's
``config.json`` and tokenizer files: vLLM's ``--hf-config-path`` and
``--tokenizer`` pointed there, and seconds faster than parsing them again.

Every projection whose tensors are in a format the kernels take
(``kernels.quantized_weight.LINEAR_TYPES``) keeps its blocks, fused as the
engine fuses q/k/v and gate/up when their formats agree;
the token embedding too (rows de-quantized as they are looked up, and the
output layer of a tied model). Everything else (norms, other formats) is
de-quantized with the ``gguf`` package into the engine's dtype.
"""

import logging
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import torch
from gguf import (
    GGML_QUANT_SIZES,
    MODEL_ARCH_NAMES,
    GGMLQuantizationType,
    GGUFReader,
    ReaderTensor,
    dequantize,
    get_tensor_name_map,
)
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from kernels.quantized_weight import LINEAR_TYPES, QuantizedWeight
from worker.models.decoder import CausalLM
from worker.models.fused import checkpoint_parts, part_rows
from worker.models.layers import Embedding
from worker.models.linear import Linear
from worker.models.moe import Experts
from worker.models.sharding import VOCAB_PARALLEL, TensorParallel

log = logging.getLogger("genfleet.engine")

# Unfused checkpoint names of the engine's fused projections, in fusing order.
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# llama.cpp stores these rows in its own rotary order for the architectures its
# converter writes as Llama's (its LlamaModel and subclasses).
PERMUTED_ROWS = {
    "self_attn.q_proj": "num_attention_heads",
    "self_attn.k_proj": "num_key_value_heads",
}
PERMUTING_ARCHITECTURES = ("llama", "mistral", "granite", "smollm3")
# The engine's stacked experts' parameters and the checkpoint projections they hold.
STACKED_EXPERTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def is_gguf_file(path: Path) -> bool:
    return path.suffix == ".gguf" and path.is_file()


def load_gguf_config(path: Path) -> PretrainedConfig:
    if (path.parent / "config.json").is_file():
        return AutoConfig.from_pretrained(path.parent, local_files_only=True)
    try:
        return AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    except ValueError as error:  # an architecture transformers reads no GGUF config of
        raise ValueError(
            f"{path.name}: the model's config cannot be read from the file ({error}); "
            "put the model's config.json beside it"
        ) from error


@cache
def read_gguf(path: Path) -> GGUFReader:
    """The file's metadata and tensors (memory-mapped); parsed once per process."""
    return GGUFReader(path)


def load_gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase | None:
    """The file's tokenizer (or its folder's), or None when it carries none (token-id
    prompts only)."""
    if (path.parent / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(path.parent, local_files_only=True)
    if "tokenizer.ggml.model" not in read_gguf(path).fields:
        return None
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)


def _unpermute(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's rotary permutation of a q or k projection."""
    permuted = torch.arange(rows).view(heads, 2, rows // heads // 2).transpose(1, 2).reshape(-1)
    return torch.argsort(permuted)


class _Checkpoint:
    """The file's tensors by the engine's (Hugging Face) names, in Hugging Face row order."""

    def __init__(self, reader: GGUFReader, config: PretrainedConfig, tp: TensorParallel) -> None:
        architecture = str(reader.fields["general.architecture"].contents())
        arch = next((a for a, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
        if arch is None:
            raise ValueError(
                f"GGUF architecture {architecture!r} is not one the gguf package knows"
            )
        self.names = get_tensor_name_map(arch, config.num_hidden_layers)
        self.tensors = {tensor.name: tensor for tensor in reader.tensors}
        self.permutes = architecture in PERMUTING_ARCHITECTURES
        self.config = config
        self.tp = tp
        self.used: set[str] = set()
        self.wholes: dict[str, torch.Tensor] = {}  # de-quantized tensors, by file name

    def tensor(self, module: str, suffix: str) -> ReaderTensor | None:
        name = self.names.get_name(module)
        return None if name is None else self.tensors.get(f"{name}.{suffix}")

    def sources(self, module: str, suffix: str) -> list[tuple[str, ReaderTensor, slice | None]]:
        """Where engine module ``module``'s checkpoint parts are in the file: each
        part's own tensor, or rows of one fused tensor (Phi-3's ``attn_qkv``, and
        ``ffn_up`` holding gate and up); [] when the file lacks any part."""
        parts = checkpoint_parts(module)
        found = [(part, self.tensor(part, suffix)) for part in parts]
        own: list[tuple[str, ReaderTensor, slice | None]] = [
            (part, tensor, None) for part, tensor in found if tensor is not None
        ]
        if len(own) == len(parts):
            return own
        fused = self.tensor(module, suffix)
        rows = part_rows(module, self.config)
        if fused is None or not rows or rows[-1][1].stop != int(fused.shape[-1]):
            return []
        return [(part, fused, part_slice) for part, part_slice in rows]

    def _row_order(self, module: str, rows: int) -> torch.Tensor | None:
        if not self.permutes:
            return None
        heads = next((h for part, h in PERMUTED_ROWS.items() if module.endswith(part)), None)
        return None if heads is None else _unpermute(rows, getattr(self.config, heads))

    def _rows(self, module: str, data: torch.Tensor, rows: slice | None) -> torch.Tensor:
        """``module``'s rows of ``data`` (a part of a fused tensor), in Hugging Face order."""
        data = data if rows is None else data[rows]
        order = self._row_order(module, data.shape[0])
        return data if order is None else data[order]

    def quantized(self, module: str) -> QuantizedWeight | None:
        """``module``'s weight (fused from its parts) in blocks, if all parts allow it."""
        sources = self.sources(module, "weight")
        kinds = {tensor.tensor_type for _, tensor, _ in sources}
        if not sources or len(kinds) != 1 or kinds.pop() not in LINEAR_TYPES:
            return None
        pieces = []
        for part, tensor, part_slice in sources:
            data = self._rows(part, torch.from_numpy(np.array(tensor.data)), part_slice)
            pieces.append((part, data))
            self.used.add(tensor.name)
        weight = self._blocks(sources[0][1], pieces)
        if module.split(".")[-1] not in VOCAB_PARALLEL:
            return weight
        # The last rank's rows past the vocabulary.
        _, padded, _ = self.tp.vocab_rows(self.config.vocab_size)
        data = weight.data
        data = torch.cat([data, data.new_zeros(padded - data.shape[0], data.shape[1])])
        return QuantizedWeight(weight.ggml_type, data, padded, weight.in_features)

    def expert_tensors(self, module: str) -> dict[str, ReaderTensor] | None:
        """The 3-D tensors (``ffn_gate_exps``, ``ffn_up_exps``, ``ffn_down_exps``: every
        expert's rows) of the experts ``module``, by projection; None if it has none."""
        found = {part: self.tensor(f"{module}.{part}", "weight") for part in EXPERT_PROJECTIONS}
        tensors = {part: tensor for part, tensor in found.items() if tensor is not None}
        return tensors if len(tensors) == len(found) else None

    def quantized_experts(
        self, module: str
    ) -> tuple[list[QuantizedWeight], list[QuantizedWeight]] | None:
        """Each expert's gate/up (fused) and down weights in blocks, if the formats allow."""
        tensors = self.expert_tensors(module)
        if tensors is None:
            return None
        kinds = [tensor.tensor_type for tensor in tensors.values()]
        if any(kind not in LINEAR_TYPES for kind in kinds) or kinds[0] != kinds[1]:
            return None  # gate and up fuse only in one format
        data = {part: torch.from_numpy(np.array(t.data)) for part, t in tensors.items()}
        self.used.update(tensor.name for tensor in tensors.values())

        def expert(e: int, parts: tuple[str, ...]) -> QuantizedWeight:
            pieces = [(f"{module}.{e}.{part}", data[part][e]) for part in parts]
            return self._blocks(tensors[parts[0]], pieces)

        count = data["down_proj"].shape[0]
        gate_up = [expert(e, ("gate_proj", "up_proj")) for e in range(count)]
        return gate_up, [expert(e, ("down_proj",)) for e in range(count)]

    def _blocks(
        self, tensor: ReaderTensor, pieces: list[tuple[str, torch.Tensor]]
    ) -> QuantizedWeight:
        """The blocks of ``pieces`` ((checkpoint module, [rows, row bytes]) in ``tensor``'s
        format), each cut to this rank's part, fused in order."""
        ggml_type = GGMLQuantizationType(tensor.tensor_type)
        block_size, block_bytes = GGML_QUANT_SIZES[ggml_type]
        in_features = int(tensor.shape[0])
        blocks = []
        for part, data in pieces:
            # This rank's rows, or whole blocks of each row (tensor parallelism).
            split = self.tp.split_of(f"{part}.weight", [data.shape[0], in_features], self.config)
            blocks.append(
                data if split is None else split.take_blocks(data, block_size, block_bytes)
            )
        data = torch.cat(blocks)
        return QuantizedWeight(
            ggml_type, data, data.shape[0], data.shape[1] // block_bytes * block_size
        )

    def float_tensors(self, model: CausalLM) -> dict[str, torch.Tensor]:
        """Every tensor of ``model``'s checkpoint not kept in blocks, de-quantized, by its
        Hugging Face name (a fused one's parts by theirs; stacked experts' by each
        expert's, as a safetensors checkpoint names them)."""
        out = {}
        for name, _ in model.named_parameters():
            module, _, suffix = name.rpartition(".")
            experts = self.expert_tensors(module) if suffix in STACKED_EXPERTS else None
            if experts is not None:
                for part in STACKED_EXPERTS[suffix]:
                    for e, rows in enumerate(self._dequantized(experts[part])):
                        out[f"{module}.{e}.{part}.weight"] = rows
                continue
            latent = self._latent_tensor(module, suffix)
            if latent is not None:
                out[name] = latent
                continue
            for part, tensor, rows in self.sources(module, suffix):
                if tensor.name not in self.used:
                    out[f"{part}.{suffix}"] = self._rows(part, self._dequantized(tensor), rows)
        return out

    def _latent_tensor(self, module: str, suffix: str) -> torch.Tensor | None:
        """DeepSeek's tensors that llama.cpp stores otherwise than their module: the
        router's correction bias as ``exp_probs_b.bias``, and ``kv_b_proj`` split per
        head into ``attn_k_b`` ([heads, latent, key], each head's W_UK transposed) and
        ``attn_v_b`` ([heads, value, latent]), as its converter has written it since it
        runs latent attention (older files keep ``attn_kv_b``, read as it is)."""
        if suffix == "e_score_correction_bias":
            tensor = self.tensor(f"{module}.e_score_correction", "bias")
            return None if tensor is None else self._dequantized(tensor)
        if not module.endswith("kv_b_proj") or self.tensor(module, suffix) is not None:
            return None
        attention = module.rpartition(".")[0]
        k_b = self.tensor(f"{attention}.k_b_proj", suffix)
        v_b = self.tensor(f"{attention}.v_b_proj", suffix)
        if k_b is None or v_b is None:
            return None
        keys = self._dequantized(k_b).transpose(1, 2)  # [heads, key, latent]
        heads_rows = torch.cat([keys, self._dequantized(v_b)], dim=1)
        return heads_rows.reshape(-1, heads_rows.shape[-1])

    def _dequantized(self, tensor: ReaderTensor) -> torch.Tensor:
        """``tensor`` in float32 (once: a fused tensor serves all its parts)."""
        if tensor.name not in self.wholes:
            values = dequantize(tensor.data, tensor.tensor_type)
            shape = [int(size) for size in reversed(tensor.shape)]
            value = torch.from_numpy(np.array(values, dtype=np.float32))  # writable
            self.wholes[tensor.name] = value.reshape(shape)
        return self.wholes[tensor.name]

    def formats(self) -> str:
        counts = Counter(GGMLQuantizationType(t.tensor_type).name for t in self.tensors.values())
        return ", ".join(f"{count} {name}" for name, count in counts.most_common())


def load_gguf_model(
    path: Path, dtype: torch.dtype, device: torch.device, tp: TensorParallel
) -> tuple[CausalLM, dict[str, torch.Tensor]]:
    """The model (this rank's shard of it) with its quantized projections in place, and
    the float tensors that remain to be copied in (by the caller, as from a
    safetensors checkpoint; whole: the caller takes this rank's part)."""
    config = load_gguf_config(path)
    with torch.device("meta"):
        model = CausalLM(config, tp)  # an unsupported architecture stops here
    checkpoint = _Checkpoint(read_gguf(path), config, tp)
    for name, module in list(model.named_modules()):  # experts add block layers
        if isinstance(module, Experts):
            experts = checkpoint.quantized_experts(name)
            if experts is not None:
                module.use_quantized(*([w.to(device) for w in weights] for weights in experts))
        elif isinstance(module, Linear):
            weight = checkpoint.quantized(name)
            if weight is not None:
                module.use_quantized(weight.to(device))
        elif isinstance(module, Embedding):
            weight = checkpoint.quantized(name)
            if weight is not None:
                module.use_quantized(weight.to(device), dtype)
    log.info("GGUF %s: %s", path.name, checkpoint.formats())
    return model, checkpoint.float_tensors(model)
