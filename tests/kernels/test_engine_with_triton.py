"""The engine on Triton kernels (interpreter on CPU) generates what it does on the references."""

import random

import pytest

from tests.conftest import TINY_VOCAB, build_model
from tests.worker.models.families import FAMILY_MODELS
from worker import LLM, SamplingParams

pytest.importorskip("triton")


def test_triton_kernels_give_the_same_greedy_tokens(tiny_models, monkeypatch) -> None:
    rng = random.Random(5)
    # Different lengths, one over a block boundary, a chunked prefill and a prefix hit.
    shared = [rng.randrange(3, TINY_VOCAB) for _ in range(9)]
    prompts = [shared + [rng.randrange(3, TINY_VOCAB) for _ in range(n)] for n in (1, 4, 11)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine_args = {"block_size": 8, "max_num_batched_tokens": 16, "max_num_seqs": 2}
    folder = tiny_models["qwen2-bias"][0]

    monkeypatch.setenv("GENFLEET_KERNELS", "torch")
    expected = [
        o.outputs[0].token_ids for o in LLM(folder, **engine_args).generate(prompts, params)
    ]
    monkeypatch.setenv("GENFLEET_KERNELS", "triton")
    llm = LLM(folder, **engine_args)
    actual = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]

    assert actual == expected
    assert llm.engine.block_manager.prefix_cache_hits > 0


def test_triton_kernels_give_deepseek_s_greedy_tokens(tmp_path, monkeypatch) -> None:
    """Latent attention's rows (values read in place from the key rows) and the
    experts, chunked and preempted, on Triton as on the references."""
    build_model(FAMILY_MODELS["deepseek-v3"], tmp_path)
    rng = random.Random(6)
    prompts = [[rng.randrange(3, TINY_VOCAB) for _ in range(n)] for n in (5, 23)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine_args = {"block_size": 8, "max_num_batched_tokens": 16, "max_num_seqs": 2}
    outputs = {}
    for kernels in ("torch", "triton"):
        monkeypatch.setenv("GENFLEET_KERNELS", kernels)
        with LLM(str(tmp_path), **engine_args) as llm:
            outputs[kernels] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert outputs["triton"] == outputs["torch"]


def test_triton_on_cpu_without_the_interpreter_is_a_clear_error(monkeypatch) -> None:
    import torch

    from kernels import silu_and_mul

    monkeypatch.setenv("GENFLEET_KERNELS", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        silu_and_mul(torch.ones(1, 4))
