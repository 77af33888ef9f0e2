"""The model's sampling defaults (``--generation-config``) as vLLM applies them: to the
fields a request leaves unset, never over a value the request gives."""

import json
import shutil
from pathlib import Path

import pytest

from worker import LLM, SamplingParams
from worker.engine.generation_config import sampling_defaults

PROMPT = [5, 6, 7, 8]


def _folder(tiny_models, tmp_path: Path, generation: dict | None) -> Path:
    """The tiny model's folder with this generation config (none: none at all)."""
    source, _ = tiny_models["llama-untied"]
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    (folder / "generation_config.json").unlink(missing_ok=True)
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def _llm(folder: Path, **kwargs) -> LLM:
    return LLM(model=str(folder), max_model_len=64, num_gpu_blocks_override=32, **kwargs)


def _only(llm: LLM, params: SamplingParams | None = None):
    (output,) = llm.generate([PROMPT], params)
    request = output.outputs[0]
    return request, llm.engine


GENERATION = {"temperature": 0.0, "top_k": 7, "max_new_tokens": 5, "bos_token_id": 1}


def test_a_request_with_nothing_set_runs_with_the_models_defaults(tiny_models, tmp_path) -> None:
    llm = _llm(_folder(tiny_models, tmp_path, GENERATION))
    defaults = llm.get_default_sampling_params()
    assert defaults.model_fields_set == {"temperature", "top_k", "max_tokens"}
    (first,) = llm.generate([PROMPT])
    assert len(first.outputs[0].token_ids) == 5 and first.outputs[0].finish_reason == "length"
    (greedy,) = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=5))
    assert first.outputs[0].token_ids == greedy.outputs[0].token_ids  # temperature 0 applied


def test_an_explicit_value_always_wins(tiny_models, tmp_path) -> None:
    llm = _llm(_folder(tiny_models, tmp_path, GENERATION))
    llm.engine.add_request("r", PROMPT, SamplingParams(max_tokens=9, temperature=0.5))
    applied = llm.engine.requests["r"].params
    assert (applied.max_tokens, applied.temperature, applied.top_k) == (9, 0.5, 7)
    assert (applied.top_p, applied.min_p, applied.repetition_penalty) == (1.0, 0.0, 1.0)


def test_vllm_means_the_neutral_values_and_an_override_lies_over_either(
    tiny_models, tmp_path
) -> None:
    folder = _folder(tiny_models, tmp_path, GENERATION)
    neutral = sampling_defaults(folder, "vllm")
    assert neutral.model_fields_set == set()
    override = {"max_new_tokens": 3, "top_p": 0.5}
    over_model = sampling_defaults(folder, "auto", override)
    assert (over_model.max_tokens, over_model.top_p, over_model.top_k) == (3, 0.5, 7)
    over_neutral = sampling_defaults(folder, "vllm", override)
    assert over_neutral.model_fields_set == {"max_tokens", "top_p"}
    llm = _llm(folder, generation_config="vllm")
    (output,) = llm.generate([PROMPT])  # no max_tokens anywhere: up to the context
    assert len(output.outputs[0].token_ids) == 64 - len(PROMPT)


def test_a_folder_of_its_own_may_give_the_defaults(tiny_models, tmp_path) -> None:
    folder = _folder(tiny_models, tmp_path, None)
    other = tmp_path / "sampling"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"max_new_tokens": 2}))
    assert sampling_defaults(folder, "auto").model_fields_set == set()  # none in the model
    assert sampling_defaults(folder, str(other)).max_tokens == 2
    with pytest.raises(ValueError, match="auto, vllm or a folder"):
        sampling_defaults(folder, str(tmp_path / "missing"))


def test_a_generation_config_a_request_could_not_carry_stops_the_engine_with_its_reason(
    tiny_models, tmp_path
) -> None:
    folder = _folder(tiny_models, tmp_path, {"temperature": 7.0})
    with pytest.raises(ValueError, match="--generation-config vllm"):
        _llm(folder)


def test_an_explicit_max_tokens_past_the_context_is_refused_a_default_one_is_cut(
    tiny_models, tmp_path
) -> None:
    llm = _llm(_folder(tiny_models, tmp_path, {"max_new_tokens": 500}))
    with pytest.raises(ValueError, match=r"maximum context length is 64 tokens.*requested 65"):
        llm.generate([PROMPT], SamplingParams(max_tokens=61))
    (output,) = llm.generate([PROMPT], SamplingParams(max_tokens=60))  # fits exactly
    assert len(output.outputs[0].token_ids) == 60
    llm.engine.add_request("cut", PROMPT, SamplingParams())
    assert llm.engine.requests["cut"].params.max_tokens == 60  # 500 would not fit
