"""GPTQ and AWQ int4 checkpoints (made in the test by round-to-nearest into each
format's packing) load as Q4_1 blocks within the stated rounding of their exact
weights, and greedy decoding picks what their exact fp32 twin ranks at or near best."""

import json
from pathlib import Path

import pytest
import torch

from kernels import dequantize
from tests.conftest import build_tiny_model
from tests.worker.models.int4_files import write_int4
from tests.worker.models.test_parity import _prompts
from worker import LLM, SamplingParams
from worker.models.linear import Linear
from worker.models.loader import load_model

# Wide enough for groups of 128 inputs in every projection.
SHAPE = {"hidden_size": 128, "intermediate_size": 256}
CHECKPOINTS = [(method, group) for method in ("gptq", "awq") for group in (32, 64, 128)]
MAX_TOKENS = 16
# Measured worst gaps: torch kernels 0.002 (the min's fp16 rounding), native 0.46 with
# groups of 128 (its 8-bit activations, within their bound at every layer:
# tests/kernels); a misread weight moves logits by units.
LOGIT_GAP = {"torch": 0.05, "native": 0.75}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[tuple[str, int], tuple[Path, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("int4")
    model = build_tiny_model("llama-untied", root / "source", **SHAPE)
    return {
        (method, group): (
            root / f"{method}-{group}",
            write_int4(model, root / f"{method}-{group}", method, group),
        )
        for method, group in CHECKPOINTS
    }


@pytest.mark.parametrize(("method", "group"), CHECKPOINTS)
def test_projections_load_as_q4_1_within_the_min_rounding(
    checkpoints, monkeypatch, method, group
) -> None:
    monkeypatch.setenv("GENFLEET_KERNELS", "torch")  # the blocks as converted, not re-laid out
    folder, twin = checkpoints[(method, group)]
    model = load_model(folder, torch.float32, torch.device("cpu"), 512)
    expected = twin.state_dict()
    layer = model.model.layers[0]
    gate_up = torch.cat([expected[f"model.layers.0.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    for linear, weight in [
        (layer.mlp.gate_up_proj, gate_up),
        (layer.self_attn.o_proj, expected["model.layers.0.self_attn.o_proj.weight"]),
    ]:
        assert linear.weight is None and linear.quantized.ggml_type.name == "Q4_1"
        error = (dequantize(linear.quantized, torch.float32) - weight).abs()
        scale = linear.quantized.data.view(weight.shape[0], -1, 20)[..., :2]
        step = scale.contiguous().view(torch.float16)[..., 0].float().repeat_interleave(32, dim=1)
        assert (error <= 15 * step * 2**-11 + 1e-7).all()  # half an fp16 ulp of m = -s z
    assert torch.equal(model.lm_head.weight, expected["lm_head.weight"])  # not quantized


@pytest.mark.parametrize("kernels", ["torch", "native"])
@pytest.mark.parametrize(("method", "group"), [("gptq", 32), ("awq", 128)])
def test_greedy_picks_what_the_exact_twin_ranks_near_best(
    checkpoints, monkeypatch, kernels, method, group
) -> None:
    monkeypatch.setenv("GENFLEET_KERNELS", kernels)
    folder, twin = checkpoints[(method, group)]
    llm = LLM(str(folder), max_num_seqs=8)
    assert all(
        m.weight is None
        for m in llm.engine.runner.model.modules()
        if isinstance(m, Linear) and m is not llm.engine.runner.model.lm_head
    )
    prompts = _prompts(seed=5)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    worst = 0.0
    for prompt, output in zip(prompts, outputs, strict=True):
        reply = output.outputs[0].token_ids
        with torch.no_grad():
            logits = twin(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1 : -1]
        chosen = logits.gather(1, torch.tensor(reply)[:, None])[:, 0]
        worst = max(worst, (logits.max(dim=1).values - chosen).max().item())
    assert worst <= LOGIT_GAP[kernels]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"desc_act": True}, "desc_act"),
        ({"bits": 8}, "4 bits"),
        ({"group_size": 16}, "group_size"),
        ({"quant_method": "bitsandbytes"}, "not supported"),
    ],
)
def test_checkpoints_that_cannot_run_are_refused_with_the_reason(
    checkpoints, tmp_path, change, message
) -> None:
    folder, _ = checkpoints[("gptq", 32)]
    copy = tmp_path / "changed"
    copy.mkdir()
    (copy / "model.safetensors").symlink_to(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"].update(change)
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        load_model(copy, torch.float32, torch.device("cpu"), 512)
