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
from worker.models.fused import checkpoint_parts
from worker.models.layers import Embedding
from worker.models.linear import Linear
from worker.models.sharding import VOCAB_PARALLEL, TensorParallel

log = logging.getLogger("genfleet.engine")

# Unfused checkpoint names of the engine's fused projections, in fusing order.
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# llama.cpp stores these rows in its own rotary order for these architectures.
PERMUTED_ROWS = {
    "self_attn.q_proj": "num_attention_heads",
    "self_attn.k_proj": "num_key_value_heads",
}
PERMUTING_ARCHITECTURES = ("llama", "mistral")


def is_gguf_file(path: Path) -> bool:
    return path.suffix == ".gguf" and path.is_file()


def load_gguf_config(path: Path) -> PretrainedConfig:
    if (path.parent / "config.json").is_file():
        return AutoConfig.from_pretrained(path.parent, local_files_only=True)
    return AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)


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

    def tensor(self, module: str, suffix: str) -> ReaderTensor | None:
        name = self.names.get_name(module)
        return None if name is None else self.tensors.get(f"{name}.{suffix}")

    def _row_order(self, module: str, rows: int) -> torch.Tensor | None:
        if not self.permutes:
            return None
        heads = next((h for part, h in PERMUTED_ROWS.items() if module.endswith(part)), None)
        return None if heads is None else _unpermute(rows, getattr(self.config, heads))

    def quantized(self, module: str) -> QuantizedWeight | None:
        """``module``'s weight (fused from its parts) in blocks, if all parts allow it."""
        parts = checkpoint_parts(module)
        found = [self.tensor(part, "weight") for part in parts]
        tensors = [tensor for tensor in found if tensor is not None]
        kinds = {tensor.tensor_type for tensor in tensors}
        if len(tensors) != len(parts) or len(kinds) != 1 or kinds.pop() not in LINEAR_TYPES:
            return None
        ggml_type = GGMLQuantizationType(tensors[0].tensor_type)
        block_size, block_bytes = GGML_QUANT_SIZES[ggml_type]
        in_features = int(tensors[0].shape[0])
        blocks = []
        for part, tensor in zip(parts, tensors, strict=True):
            data = torch.from_numpy(np.array(tensor.data))
            order = self._row_order(part, data.shape[0])
            data = data if order is None else data[order]
            # This rank's rows, or whole blocks of each row (tensor parallelism).
            split = self.tp.split_of(f"{part}.weight", [data.shape[0], in_features], self.config)
            if split is not None:
                data = split.take_blocks(data, block_size, block_bytes)
            blocks.append(data)
            self.used.add(tensor.name)
        data = torch.cat(blocks)
        if module.split(".")[-1] in VOCAB_PARALLEL:  # the last rank's rows past the vocabulary
            _, rows, _ = self.tp.vocab_rows(self.config.vocab_size)
            data = torch.cat([data, data.new_zeros(rows - data.shape[0], data.shape[1])])
        in_local = data.shape[1] // block_bytes * block_size
        return QuantizedWeight(ggml_type, data, data.shape[0], in_local)

    def float_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor not kept in blocks, de-quantized, by its Hugging Face name."""
        out = {}
        for module in _checkpoint_modules(self.config):
            for suffix in ("weight", "bias"):
                tensor = self.tensor(module, suffix)
                if tensor is None or tensor.name in self.used:
                    continue
                values = dequantize(tensor.data, tensor.tensor_type)
                shape = [int(size) for size in reversed(tensor.shape)]
                value = torch.from_numpy(np.array(values, dtype=np.float32))  # a writable copy
                value = value.reshape(shape)
                order = self._row_order(module, shape[0])
                out[f"{module}.{suffix}"] = value if order is None else value[order]
        return out

    def formats(self) -> str:
        counts = Counter(GGMLQuantizationType(t.tensor_type).name for t in self.tensors.values())
        return ", ".join(f"{count} {name}" for name, count in counts.most_common())


def _checkpoint_modules(config: PretrainedConfig) -> list[str]:
    """The Hugging Face module names a Llama-family checkpoint holds."""
    layer = [
        "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
        "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    ]  # fmt: skip
    layers = [f"model.layers.{i}.{name}" for i in range(config.num_hidden_layers) for name in layer]
    return ["model.embed_tokens", *layers, "model.norm", "lm_head"]


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
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            weight = checkpoint.quantized(name)
            if weight is not None:
                module.use_quantized(weight.to(device))
        elif isinstance(module, Embedding):
            weight = checkpoint.quantized(name)
            if weight is not None:
                module.use_quantized(weight.to(device), dtype)
    log.info("GGUF %s: %s", path.name, checkpoint.formats())
    return model, checkpoint.float_tensors()
