"""A GGUF file of each family llama.cpp writes (its tensor names, q/k row order and
Gemma's stored norm offsets) loads with its projections in blocks and decodes as
transformers does with the same de-quantized weights, greedy and fp32."""

import copy
import shutil

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType

from tests.conftest import build_model, hf_greedy
from tests.worker.models.families import FAMILY_MODELS
from tests.worker.models.gguf_files import F32_TENSORS, write_gguf
from tests.worker.models.test_families import _prompts
from worker import LLM, SamplingParams
from worker.models.linear import Linear
from worker.models.moe import Experts

Q8_0 = GGMLQuantizationType.Q8_0
GGUF_FAMILIES = (
    "qwen3", "gemma2", "gemma3", "phi3", "olmo2", "granite", "smollm3",
    "mixtral", "qwen2-moe", "qwen3-moe", "deepseek-v2", "deepseek-v3",
)  # fmt: skip
MAX_TOKENS = 12
# llama.cpp's qwen2moe has no dense MLP tensors: its files have experts on every layer.
NO_DENSE_LAYERS = {"qwen2-moe": {"mlp_only_layers": []}}


def _dequantized_twin(model: torch.nn.Module, kind: GGMLQuantizationType) -> torch.nn.Module:
    """``model`` with each matrix as the file holds it: quantized to ``kind`` and back."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in twin.named_parameters():
            if param.ndim >= 2 and not name.endswith(F32_TENSORS):
                blocks = gguf.quants.quantize(param.numpy(), kind)
                param.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, kind)))
    return twin


@pytest.mark.parametrize("kind", GGUF_FAMILIES)
def test_each_family_s_gguf_decodes_as_its_dequantized_twin(
    family_models, kind: str, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("GENFLEET_KERNELS", "torch")  # exact with the de-quantized weights
    folder, hf_model = family_models(kind)
    if kind in NO_DENSE_LAYERS:
        folder = tmp_path / "hf"
        hf_model = build_model(FAMILY_MODELS[kind], folder, **NO_DENSE_LAYERS[kind])
    path = write_gguf(hf_model, tmp_path / "model.gguf", Q8_0)
    shutil.copy(folder / "config.json", tmp_path)  # families transformers cannot read a GGUF of
    twin = _dequantized_twin(hf_model, Q8_0)
    prompts = _prompts()
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(str(path), max_num_seqs=8) as llm:
        model = llm.engine.runner.model
        linears = [m for m in model.modules() if isinstance(m, Linear)]
        in_f32 = [m for name, m in model.named_modules() if f"{name}.weight".endswith(F32_TENSORS)]
        assert all(m.quantized is not None for m in linears if m not in in_f32)
        experts = [m for m in model.modules() if isinstance(m, Experts)]
        assert all(len(m.gate_up_blocks) == len(m.down_blocks) > 0 for m in experts)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.outputs[0].token_ids == hf_greedy(twin, prompt, MAX_TOKENS)


def test_a_bare_gguf_whose_config_transformers_cannot_read_asks_for_config_json(
    family_models, tmp_path
) -> None:
    _, hf_model = family_models("olmo2")
    path = write_gguf(hf_model, tmp_path / "model.gguf", Q8_0)
    with pytest.raises(ValueError, match=r"put the model.s config\.json beside it"):
        LLM(str(path))
