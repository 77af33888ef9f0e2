"""Tensor parallelism on this CPU (gloo): two ranks, one process each, give the greedy
output of transformers for every model config the engine tests use; each rank
holds half the weights; layouts that do not split are refused before any rank
starts; a rank that dies ends the engine at its next step."""

import os
import random
import signal
import time

import pytest
from gguf import GGMLQuantizationType

from tests.conftest import TINY_KINDS, TINY_VOCAB, build_tiny_model, hf_greedy
from tests.worker.models.gguf_files import write_gguf
from tests.worker.models.int4_files import write_int4
from tests.worker.models.test_parity import SCENARIOS
from worker import LLM, EngineConfig, SamplingParams
from worker.models.footprint import weight_footprint

# Each test starts processes of the fleet's engine (tensor-parallel ranks).
pytestmark = pytest.mark.integration

MAX_TOKENS = 16
Q4_1, Q8_0 = GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0


def _prompts() -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(n)] for n in (1, 5, 17, 31, 48, 90)]


def _greedy_parity(llm: LLM, hf_model) -> None:
    prompts = _prompts()
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.outputs[0].token_ids == hf_greedy(hf_model, prompt, MAX_TOKENS)


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_two_ranks_decode_as_transformers_does(tiny_models, kind: str) -> None:
    """GQA, one KV head for four query heads (replicated on both ranks) with tied
    embeddings, Qwen2's biases, Mistral; the last under a tiny KV budget, so that
    requests are preempted and prefills chunked across both ranks."""
    folder, hf_model = tiny_models[kind]
    tight = {**SCENARIOS["preemption"], **SCENARIOS["chunked"]} if kind == "mistral" else {}
    llm = LLM(str(folder), device="cpu", tensor_parallel_size=2, max_num_seqs=8, **tight)
    try:
        _greedy_parity(llm, hf_model)
        if tight:
            assert llm.engine.scheduler.num_preemptions > 0
        if kind == "llama-untied":  # two KV heads: every projection splits
            whole = weight_footprint(LLM(str(folder), device="cpu").engine.runner.model).bytes
            share = weight_footprint(llm.engine.runner.model).bytes / whole
            assert 0.49 < share < 0.52  # the norms are replicated
    finally:
        llm.close()


def test_head_size_128_with_one_kv_head_and_a_dead_rank_ends_the_engine(tmp_path) -> None:
    """Head size 128 with one KV head (replicated on both ranks): parity; then rank 1
    is killed and the next step fails, naming it."""
    folder = tmp_path / "head128"
    hf_model = build_tiny_model(
        "llama-untied", folder, hidden_size=256, num_attention_heads=2, num_key_value_heads=1
    )
    llm = LLM(str(folder), device="cpu", tensor_parallel_size=2, max_num_seqs=8)
    engine = llm.engine
    try:
        _greedy_parity(llm, hf_model)
        assert engine.runner.kv_cache.shape[-2:] == (1, 128)  # the one KV head, on each rank

        assert engine.ranks is not None
        follower = engine.ranks.followers[0]
        os.kill(follower.pid, signal.SIGKILL)
        follower.wait(timeout=10)
        engine.add_request("after", [5, 6, 7], SamplingParams(max_tokens=4))
        began = time.monotonic()
        with pytest.raises(RuntimeError, match="rank 1"):
            engine.step()
        assert time.monotonic() - began < 10
    finally:
        engine.close()


def test_a_gguf_file_splits_by_whole_blocks(tmp_path, monkeypatch) -> None:
    """Q4_1 projections with a Q8_0 tied embedding (intermediate 128: 64 features, two
    blocks, per rank in down_proj): with the torch kernels (the blocks de-quantized
    exactly) two ranks decode as one does (``test_gguf``: one, as transformers), each
    holding about half the blocks; 96 features (48 per rank) would cut a block."""
    monkeypatch.setenv("GENFLEET_KERNELS", "torch")  # the followers inherit it
    model = build_tiny_model("llama-tied", tmp_path / "source", intermediate_size=128)
    path = write_gguf(model, tmp_path / "split" / "model.gguf", Q4_1, Q8_0)
    prompts = [{"prompt_token_ids": p} for p in _prompts()]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    alone = LLM(str(path), device="cpu")
    expected = [o.outputs[0].token_ids for o in alone.generate(prompts, params)]
    whole = weight_footprint(alone.engine.runner.model).bytes
    llm = LLM(str(path), device="cpu", tensor_parallel_size=2, max_num_seqs=8)
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
        share = weight_footprint(llm.engine.runner.model).bytes / whole
        assert 0.5 < share < 0.6  # the one KV head's k and v are on both ranks
    finally:
        llm.close()
    odd = write_gguf(build_tiny_model("llama-untied", tmp_path / "odd-source"),
                     tmp_path / "odd" / "model.gguf", Q8_0, Q8_0)  # fmt: skip
    with pytest.raises(ValueError, match="do not split into whole blocks of 32"):
        LLM(str(odd), device="cpu", tensor_parallel_size=2)


def test_a_gptq_checkpoint_splits_once_re_packed(tmp_path, monkeypatch) -> None:
    """GPTQ with groups of 128, re-packed as Q4_1 and split by whole blocks (64 input
    features per rank in o_proj, half a group): two ranks decode as one does."""
    monkeypatch.setenv("GENFLEET_KERNELS", "torch")
    model = build_tiny_model("llama-untied", tmp_path / "source", hidden_size=128,
                             intermediate_size=256)  # fmt: skip
    write_int4(model, tmp_path / "gptq", "gptq", 128)
    prompts = [{"prompt_token_ids": p} for p in _prompts()]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    alone = LLM(str(tmp_path / "gptq"), device="cpu").generate(prompts, params)
    llm = LLM(str(tmp_path / "gptq"), device="cpu", tensor_parallel_size=2)
    try:
        split = llm.generate(prompts, params)
    finally:
        llm.close()
    assert [o.outputs[0].token_ids for o in split] == [o.outputs[0].token_ids for o in alone]


def test_layouts_that_do_not_split_are_refused_before_any_rank_starts(tiny_models) -> None:
    folder, _ = tiny_models["llama-untied"]  # 4 heads, 2 KV heads, 96 MLP features
    with pytest.raises(ValueError, match="does not divide the model's 4 attention heads"):
        LLM(str(folder), device="cpu", tensor_parallel_size=3)
    with pytest.raises(ValueError, match="draft model does not run under tensor parallel"):
        EngineConfig(
            tensor_parallel_size=2,
            speculative_config={"model": str(folder), "num_speculative_tokens": 2},
        )


def test_a_closed_engine_releases_its_ranks_and_a_second_one_starts(tiny_models) -> None:
    """``with LLM(...)``: on leaving, the follower processes have ended, the process
    group is gone and torch's thread count is as before; a second engine over two
    ranks then starts in the same process and decodes as transformers does."""
    import torch
    import torch.distributed as dist

    folder, hf_model = tiny_models["llama-untied"]
    threads = torch.get_num_threads()
    with LLM(str(folder), device="cpu", tensor_parallel_size=2) as first:
        ranks = first.engine.ranks
        assert ranks is not None and dist.is_initialized()
        followers = list(ranks.followers)
        two = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        output = first.generate({"prompt_token_ids": [5, 6, 7]}, two)[0].outputs[0]
        assert len(output.token_ids) == 2
    assert all(process.poll() is not None for process in followers)
    assert not dist.is_initialized()
    assert torch.get_num_threads() == threads
    first.close()  # a second close does nothing
    with LLM(str(folder), device="cpu", tensor_parallel_size=2) as second:
        _greedy_parity(second, hf_model)


# Families whose layers split otherwise than Llama's. Gemma 3, Qwen3, Granite, SmolLM3,
# Qwen3-MoE and DeepSeek V2 passed here too (2026-12-07) and are left out for CI's time:
# Gemma 3 splits per-head q/k norms as Qwen3 does, its local rope as Gemma 2's windows;
# multipliers and layers without rotary are the same on each rank; V2's attention splits
# as V3's.
@pytest.mark.parametrize("kind", ["gemma2", "phi3", "mixtral", "qwen2-moe", "deepseek-v3"])
def test_two_ranks_decode_other_families_as_transformers_does(family_models, kind) -> None:
    """Each rank's heads carry their layer's window, soft-cap and rotary (Gemma 2),
    Phi-3's fused checkpoint tensors split as their parts, and each
    rank holds every expert's share of its intermediate features (Mixtral; Qwen2-MoE
    with its shared expert and a dense layer; DeepSeek V3, whose ranks also hold their
    heads' share of latent attention over the whole latent rows)."""
    folder, hf_model = family_models(kind)
    with LLM(str(folder), device="cpu", tensor_parallel_size=2, max_num_seqs=8) as llm:
        _greedy_parity(llm, hf_model)
