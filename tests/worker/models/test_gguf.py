"""GGUF files served in their blocks: weights as transformers de-quantizes them, greedy
output equal to that de-quantized fp32 twin.

The torch kernels compute with the de-quantized weights exactly, so their greedy
output must equal the twin's token for token. The native kernels also round each
activation block to 8 bits (``tests/kernels/quantized_cases``): near-ties may then
go the other way, so their tokens are held to be ones the twin ranks within a
stated logit gap of its best.
"""

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from transformers import AutoModelForCausalLM

from kernels import dequantize
from tests.conftest import TINY_VOCAB, build_tiny_model, hf_greedy
from tests.worker.models.gguf_files import write_gguf
from tests.worker.models.test_parity import _prompts
from worker import LLM, SamplingParams
from worker.models.linear import Linear
from worker.models.loader import load_model

Q4_0, Q4_1, Q8_0 = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0)
# name -> (tiny kind, projections' format, embedding's format)
FILES = {
    "tied-q4_1": ("llama-tied", Q4_1, Q8_0),
    "untied-q4_0": ("llama-untied", Q4_0, Q4_0),
    "untied-q8_0": ("llama-untied", Q8_0, Q8_0),
}
MAX_TOKENS = 16
# The native kernels' 8-bit activations move the tiny models' logits (a few units
# apart at the top) by hundredths: measured gaps stay under 0.03. A kernel that
# misreads weights picks tokens whole units below the best.
NATIVE_LOGIT_GAP = 0.1


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """name -> (GGUF file, transformers' de-quantized fp32 twin of it)."""
    root = tmp_path_factory.mktemp("gguf")
    files = {}
    for name, (kind, projections, embedding) in FILES.items():
        model = build_tiny_model(kind, root / f"{name}-source")
        path = write_gguf(model, root / name / "model.gguf", projections, embedding)
        twin = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
        files[name] = (path, twin)
    return files


@pytest.mark.parametrize("name", FILES)
def test_projections_keep_their_blocks_and_equal_transformers_weights(
    gguf_files, monkeypatch, name
) -> None:
    monkeypatch.setenv("GENFLEET_KERNELS", "torch")  # the blocks as stored, not re-laid out
    path, twin = gguf_files[name]
    model = load_model(path, torch.float32, torch.device("cpu"), 512)
    expected = twin.state_dict()
    layer = model.model.layers[1]
    qkv = torch.cat([expected[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    gate_up = torch.cat([expected[f"model.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    for linear, weight in [
        (layer.self_attn.qkv_proj, qkv),
        (layer.mlp.gate_up_proj, gate_up),
        (layer.mlp.down_proj, expected["model.layers.1.mlp.down_proj.weight"]),
    ]:
        assert linear.weight is None and linear.quantized.ggml_type == FILES[name][1]
        assert torch.equal(dequantize(linear.quantized, torch.float32), weight)
    embedding = model.model.embed_tokens.quantized
    assert torch.equal(dequantize(embedding, torch.float32), expected["model.embed_tokens.weight"])
    assert torch.equal(
        layer.input_layernorm.weight, expected["model.layers.1.input_layernorm.weight"]
    )


def test_projections_whose_parts_differ_in_format_are_served_dequantized(tmp_path) -> None:
    """q and k in Q4_0 but v in Q8_0 cannot fuse in blocks: qkv is de-quantized, and the
    model still equals its twin."""
    model = build_tiny_model("llama-untied", tmp_path / "source")
    formats = {"model.layers.0.self_attn.v_proj.weight": Q8_0}
    mixed = write_gguf(model, tmp_path / "mixed" / "model.gguf", Q4_0, formats=formats)
    ours = load_model(mixed, torch.float32, torch.device("cpu"), 512)
    qkv = ours.model.layers[0].self_attn.qkv_proj
    assert qkv.quantized is None and qkv.weight is not None
    assert ours.model.layers[1].self_attn.qkv_proj.weight is None  # in blocks
    twin = AutoModelForCausalLM.from_pretrained(mixed.parent, gguf_file=mixed.name).eval()
    llm = LLM(str(mixed))
    prompt = _prompts(seed=3)[3]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt}], params)[0]
    assert out.outputs[0].token_ids == hf_greedy(twin, prompt, MAX_TOKENS)


@pytest.mark.parametrize("name", FILES)
def test_torch_kernels_greedy_equals_the_dequantized_twin(gguf_files, monkeypatch, name) -> None:
    monkeypatch.setenv("GENFLEET_KERNELS", "torch")
    path, twin = gguf_files[name]
    llm = LLM(str(path), max_num_seqs=8)
    assert all(
        module.quantized is not None
        for module in llm.engine.runner.model.modules()
        if isinstance(module, Linear)
    )
    prompts = _prompts(seed=11)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.outputs[0].token_ids == hf_greedy(twin, prompt, MAX_TOKENS)


@pytest.mark.parametrize("name", FILES)
def test_native_kernels_pick_tokens_the_twin_ranks_near_its_best(gguf_files, name) -> None:
    """Each token the native engine picks has, under the twin, a logit within
    NATIVE_LOGIT_GAP of the twin's best (teacher-forced on the native output)."""
    path, twin = gguf_files[name]
    llm = LLM(str(path), max_num_seqs=8)
    linears = [m for m in llm.engine.runner.model.modules() if isinstance(m, Linear)]
    # Every projection re-laid out for the 8-row kernel, the stored blocks dropped.
    assert all(m.quantized is None and m.packed is not None for m in linears)
    prompts = _prompts(seed=11)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    gaps = []
    for prompt, output in zip(prompts, outputs, strict=True):
        tokens = output.outputs[0].token_ids
        with torch.no_grad():
            logits = twin(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        chosen = logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]
        gaps.append((logits.max(dim=1).values - chosen).max().item())
    assert max(gaps) <= NATIVE_LOGIT_GAP


def test_a_file_without_a_tokenizer_takes_token_ids_only(gguf_files) -> None:
    path, _ = gguf_files["tied-q4_1"]
    llm = LLM(str(path))
    assert llm.engine.vocab_size == TINY_VOCAB
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate(["hello"], SamplingParams(max_tokens=2))
