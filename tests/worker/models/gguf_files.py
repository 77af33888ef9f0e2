"""GGUF files written here, as llama.cpp's converter writes them, from tiny random models."""

from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType

BLOCK = 32


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary row order for a q or k projection."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(
    model: torch.nn.Module,
    path: Path,
    ggml_type: GGMLQuantizationType,
    embedding_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
    formats: Mapping[str, GGMLQuantizationType] | None = None,
) -> Path:
    """``model`` (a transformers Llama) as a GGUF file: 2-D weights in ``ggml_type`` (the
    token embedding in ``embedding_type``, any tensor named in ``formats`` in its own),
    norms in F32."""
    path.parent.mkdir(parents=True, exist_ok=True)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        values = tensor.float().numpy()
        if name.endswith("q_proj.weight"):
            values = llama_cpp_permute(values, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            values = llama_cpp_permute(values, config.num_key_value_heads)
        kind = embedding_type if name == "model.embed_tokens.weight" else ggml_type
        kind = (formats or {}).get(name, kind)
        if values.ndim == 2 and kind != GGMLQuantizationType.F32:
            writer.add_tensor(target, gguf.quants.quantize(values, kind), raw_dtype=kind)
        else:
            writer.add_tensor(target, np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
