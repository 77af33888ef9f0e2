"""GGUF files written here, as llama.cpp's converter writes them, from tiny random models."""

from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType

BLOCK = 32
# model_type -> llama.cpp's architecture name, where they differ (it writes Mixtral as Llama).
ARCHITECTURES = {
    "gemma3_text": "gemma3", "mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
    "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2",
}  # fmt: skip
# llama.cpp's converter permutes q and k rows for Llama and its subclasses.
PERMUTED = ("llama", "mistral", "granite", "smollm3")
# It keeps the routers (and Qwen2-MoE's shared-expert gate) in F32; so do these files
# DeepSeek's per-head attn_k_b / attn_v_b (kv_b_proj's parts), so that a de-quantized
# twin need not quantize kv_b_proj's rows in the per-head order they are stored in.
F32_TENSORS = (".mlp.gate.weight", ".mlp.shared_expert_gate.weight", "kv_b_proj.weight")
# It stores Gemma's (1 + w) norms with the 1 added.
NORMS_PLUS_ONE = ("gemma2", "gemma3")


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary row order for a q or k projection."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def _stored(name: str, values: np.ndarray, config: object, architecture: str) -> np.ndarray:
    """A tensor as llama.cpp's converter stores it for ``architecture``."""
    if architecture in PERMUTED and name.endswith("q_proj.weight"):
        return llama_cpp_permute(values, config.num_attention_heads)
    if architecture in PERMUTED and name.endswith("k_proj.weight"):
        return llama_cpp_permute(values, config.num_key_value_heads)
    if architecture in NORMS_PLUS_ONE and name.endswith("norm.weight"):
        return values + np.float32(1.0)
    return values


def _checkpoint_tensors(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's tensors as a checkpoint names them: stacked experts as each
    projection's [experts, rows, features] (llama.cpp's ``ffn_*_exps``)."""
    out = {}
    for name, tensor in model.state_dict().items():
        values = tensor.float().numpy()
        if name.endswith("experts.gate_up_proj"):
            gate, up = np.split(values, 2, axis=1)
            out[name.replace("gate_up_proj", "gate_proj.weight")] = gate
            out[name.replace("gate_up_proj", "up_proj.weight")] = up
        elif name.endswith("experts.down_proj"):
            out[f"{name}.weight"] = values
        elif name.endswith("kv_b_proj.weight"):  # per head: W_UK transposed, and W_UV
            heads = model.config.num_attention_heads
            per_head = values.reshape(heads, -1, values.shape[-1])
            keys, values = np.split(per_head, [model.config.qk_nope_head_dim], axis=1)
            out[name.replace("kv_b_proj", "k_b_proj")] = np.ascontiguousarray(keys.swapaxes(1, 2))
            out[name.replace("kv_b_proj", "v_b_proj")] = values
        elif name.endswith("e_score_correction_bias"):
            out[name.replace("e_score_correction_bias", "e_score_correction.bias")] = values
        else:
            out[name] = values
    return out


def write_gguf(
    model: torch.nn.Module,
    path: Path,
    ggml_type: GGMLQuantizationType,
    embedding_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
    formats: Mapping[str, GGMLQuantizationType] | None = None,
) -> Path:
    """``model`` (a transformers model of a family llama.cpp writes) as a GGUF file: 2-D
    weights in ``ggml_type`` (the token embedding in ``embedding_type``, any tensor
    named in ``formats`` in its own), norms in F32."""
    path.parent.mkdir(parents=True, exist_ok=True)
    config = model.config
    architecture = ARCHITECTURES.get(config.model_type, config.model_type)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope = config.rope_parameters
    rope = rope.get("full_attention", rope)  # Gemma 3: the global layers' parameters
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config.vocab_size)
    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture)
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    for name, values in _checkpoint_tensors(model).items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, f"{architecture}: no GGUF name for {name}"
        values = _stored(name, values, config, architecture)
        kind = embedding_type if name == "model.embed_tokens.weight" else ggml_type
        f32 = name.endswith(F32_TENSORS) or name.endswith(("k_b_proj.weight", "v_b_proj.weight"))
        kind = GGMLQuantizationType.F32 if f32 else kind
        kind = (formats or {}).get(name, kind)
        # Rows that do not divide into blocks stay F32, as the converter leaves them.
        if values.ndim >= 2 and values.shape[-1] % BLOCK == 0 and kind != GGMLQuantizationType.F32:
            writer.add_tensor(target, gguf.quants.quantize(values, kind), raw_dtype=kind)
        else:
            writer.add_tensor(target, np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
