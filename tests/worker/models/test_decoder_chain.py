"""The native decoder chain (``worker.models.chain``): the layer loop's kernels in one
call. It must give the loop's hidden states to the bit, for every step shape and
each thing a pre-norm model may have (biases, windows, layers without rotary, q/k
norms per head, either dtype), and leave the models it cannot run to the loop."""

import shutil

import pytest
import torch
from gguf import GGMLQuantizationType

from genfleet.bench.step_split import step_split_table
from kernels import CHAIN_PARTS
from tests.conftest import build_model, build_tiny_model
from tests.worker.models.families import FAMILY_MODELS
from tests.worker.models.gguf_files import write_gguf
from worker import LLM
from worker.execution.step_buffers import Query

Q4_0, Q4_1, Q8_0 = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0)
# name -> (model kind, what it overrides, projections' format, dtype)
CASES = {
    "llama-tied-q4_1-fp32": ("llama-tied", {}, Q4_1, "float32"),
    "qwen2-bias-q4_0-bf16": ("qwen2-bias", {}, Q4_0, "bfloat16"),
    "qwen2-window-q8_0-fp32": ("qwen2-window", {"sliding_window": 8}, Q8_0, "float32"),
    "smollm3-rope-less-q8_0-fp32": ("smollm3", {}, Q8_0, "float32"),
    "qwen3-qk-norms-q4_0-fp32": ("qwen3", {}, Q4_0, "float32"),
}


def _gguf(tmp_path, kind: str, overrides: dict, ggml_type: GGMLQuantizationType) -> str:
    source = tmp_path / "source"
    if kind in FAMILY_MODELS:
        model = build_model(FAMILY_MODELS[kind], source, **overrides)
    else:
        model = build_tiny_model(kind, source, **overrides)
    path = write_gguf(model, tmp_path / "gguf" / "model.gguf", ggml_type)
    shutil.copy(source / "config.json", path.parent)  # for families transformers cannot read
    return str(path)


def _steps() -> list[list[Query]]:
    """Prefills of several lengths in one step (one past the window), then decode
    steps of one token each that read what the prefills cached."""
    lengths = (1, 5, 19)
    blocks = [[2 * i, 2 * i + 1] for i in range(len(lengths))]
    prefill = [Query(list(range(3, 3 + n)), 0, blocks[i], 1) for i, n in enumerate(lengths)]
    decodes = [
        [Query([7 + step], n + step, blocks[i], 1) for i, n in enumerate(lengths)]
        for step in range(3)
    ]
    return [prefill, *decodes]


@pytest.mark.parametrize("name", CASES)
def test_the_chain_gives_the_layer_loop_s_hidden_states_to_the_bit(tmp_path, name) -> None:
    kind, overrides, ggml_type, dtype = CASES[name]
    with LLM(_gguf(tmp_path, kind, overrides, ggml_type), dtype=dtype) as llm:
        runner = llm.engine.runner
        model = runner.model
        chained = model.model.chained
        assert chained is not None
        attentions = model.model.attentions()
        if "window" in name:
            assert {attention.sliding_window for attention in attentions} == {0, 8}
        if "rope-less" in name:
            assert {attention.rope for attention in attentions} == {None, "default"}
        if "qk-norms" in name:
            assert all(attention.qk_norm == "head" for attention in attentions)
        for queries in _steps():
            inputs = runner.buffers.fill_queries(queries)
            outputs = []
            for chain in (chained, None):
                model.model.chained = chain
                with torch.inference_mode():
                    outputs.append(model(inputs.input_ids, inputs.positions, inputs.meta))
            assert outputs[0].dtype == getattr(torch, dtype)
            assert torch.equal(outputs[0], outputs[1])
            assert outputs[0].abs().sum() > 0


def test_steps_of_many_rows_go_through_the_loop(tmp_path) -> None:
    """From ``below_rows`` rows a step is the loop's (some projection would leave its
    blocks' integer kernel there); the profile counts only the chain's steps."""
    with LLM(_gguf(tmp_path, "llama-tied", {}, Q4_1)) as llm:
        runner = llm.engine.runner
        chained = runner.model.model.chained
        assert chained is not None
        chained.below_rows = 4
        chained.seconds = torch.zeros(4, dtype=torch.float64)
        for rows in (3, 4):
            inputs = runner.buffers.fill_queries([Query(list(range(3, 3 + rows)), 0, [0], 1)])
            with torch.inference_mode():
                runner.model(inputs.input_ids, inputs.positions, inputs.meta)
            if rows == 3:
                profiled = chained.seconds.clone()
                assert (profiled > 0).all()  # norms, projections, attention, activation
        assert torch.equal(chained.seconds, profiled)


@pytest.mark.parametrize(
    ("why", "kind", "ggml_type"),
    [
        ("sandwich norms and GeLU", "gemma2", Q8_0),
        ("post norms and q/k norms over the whole projection", "olmo2", Q8_0),
        ("experts", "mixtral", Q8_0),
        ("float weights", "llama-untied", None),
    ],
)
def test_models_the_chain_cannot_run_keep_the_loop(tmp_path, why, kind, ggml_type) -> None:
    if ggml_type is None:
        build_tiny_model(kind, tmp_path / "source")
        model_path = str(tmp_path / "source")
    else:
        model_path = _gguf(tmp_path, kind, {}, ggml_type)
    with LLM(model_path) as llm:
        assert llm.engine.runner.model.model.chained is None, why


def test_the_torch_kernels_keep_the_loop(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GENFLEET_KERNELS", "torch")
    with LLM(_gguf(tmp_path, "llama-tied", {}, Q4_1)) as llm:
        assert llm.engine.runner.model.model.chained is None


def test_the_step_split_profiles_both_ways_and_puts_the_engine_back(tmp_path) -> None:
    """``genfleet bench --vs-llama-cpp``'s split: each part in both columns, and the
    engine left with its chain and its own methods."""
    with LLM(_gguf(tmp_path, "llama-tied", {}, Q4_1)) as llm:
        engine = llm.engine
        chained = engine.runner.model.model.chained
        table = step_split_table(engine, list(range(3, 40)), 6)
        assert engine.runner.model.model.chained is chained and chained.seconds is None
        assert "execute" not in vars(engine.runner)
        assert "compute_logits" not in vars(engine.runner.model)
        parts, before, after = ([*column.cells] for column in table.columns)
        assert parts[: len(CHAIN_PARTS)] == list(CHAIN_PARTS) and parts[-1] == "step"
        assert float(before[-1]) > 0 and float(after[-1]) > 0  # ms per step
        # Measured parts (the Python row before the step's is a difference of them).
        assert all(float(cell) >= 0 for cell in before[:-2] + after[:-2])
