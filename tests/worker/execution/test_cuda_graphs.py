"""CUDA graphs for decode on a real GPU (skipped elsewhere; scripts/gpu_check.py runs them)."""

import pytest
import torch

from worker import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("kind", ["llama-untied", "llama-tied", "qwen2-bias"])
def test_graphs_give_the_eager_tokens(tiny_models, kind) -> None:
    folder, _ = tiny_models[kind]
    prompts = [[(7 * i + j) % 300 + 2 for j in range(5 + 3 * i)] for i in range(11)]
    params = SamplingParams(temperature=0, max_tokens=24)
    outputs = {}
    for eager in (True, False):
        llm = LLM(str(folder), device="cuda", dtype="float32", enforce_eager=eager)
        assert (llm.engine.runner.graphs is None) == eager
        outputs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        del llm
    assert outputs[False] == outputs[True]


def test_a_replay_runs_only_for_decode_steps_within_the_ladder(tiny_models) -> None:
    folder, _ = tiny_models["llama-untied"]
    llm = LLM(str(folder), device="cuda", dtype="float32", max_num_seqs=8)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.sizes == [1, 2, 4, 8]
    replays: list[int] = []
    original = graphs.replay
    graphs.replay = lambda size: replays.append(size) or original(size)  # type: ignore[method-assign]
    llm.generate([[5, 6, 7]] * 3, SamplingParams(temperature=0, max_tokens=4))
    assert replays == [4, 4, 4]  # 3 sequences pad to 4; the prefill step ran eagerly
