"""Every supported family decodes as transformers' own implementation does, greedy and
fp32, token for token: plainly, and under a KV budget so tight that requests are
preempted and prefills chunked. Sliding windows shorter than the prompts, and shown
to matter."""

import json
import random
import shutil
from pathlib import Path

import pytest
from transformers import AutoConfig

from tests.conftest import TINY_VOCAB, build_tiny_model, hf_greedy
from tests.worker.models.families import FAMILY_KINDS, WINDOW
from worker import LLM, SamplingParams
from worker.models.decoder import CausalLM
from worker.models.registry import SUPPORTED_ARCHITECTURES
from worker.models.sharding import TensorParallel

PROMPT_LENGTHS = (3, 17, 40, 64, 90)
MAX_TOKENS = 16
TIGHT = {
    "num_gpu_blocks_override": 28,
    "block_size": 4,
    "watermark": 0.0,
    "max_num_batched_tokens": 16,
}


def _prompts() -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(n)] for n in PROMPT_LENGTHS]


def _greedy(folder: Path, prompts: list[list[int]], **settings: object) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(str(folder), max_num_seqs=8, **settings) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        if settings:
            assert llm.engine.scheduler.num_preemptions > 0
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("kind", FAMILY_KINDS)
def test_each_family_decodes_as_transformers_does(family_models, kind: str) -> None:
    folder, hf_model = family_models(kind)
    prompts = _prompts()
    expected = [hf_greedy(hf_model, prompt, MAX_TOKENS) for prompt in prompts]
    assert _greedy(folder, prompts) == expected
    assert _greedy(folder, prompts, **TIGHT) == expected


@pytest.mark.parametrize("kind", ["mistral-window", "gemma2"])
def test_the_sliding_window_changes_the_tokens(family_models, kind: str, tmp_path) -> None:
    """The same weights with the window taken out of the config decode otherwise past
    the window: the parity above holds because the window is applied."""
    folder, hf_model = family_models(kind)
    unwindowed = tmp_path / "unwindowed"
    shutil.copytree(folder, unwindowed)
    config = json.loads((unwindowed / "config.json").read_text())
    config["sliding_window"] = None
    config.pop("layer_types", None)
    (unwindowed / "config.json").write_text(json.dumps(config))
    prompts = [p for p in _prompts() if len(p) > WINDOW]
    expected = [hf_greedy(hf_model, prompt, MAX_TOKENS) for prompt in prompts]
    assert _greedy(unwindowed, prompts) != expected


def test_an_unknown_architecture_is_refused_with_the_supported_list() -> None:
    config = AutoConfig.for_model("gpt2")
    config.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError, match="GPT2LMHeadModel is not supported") as refused:
        CausalLM(config)
    for architecture in ("Qwen3ForCausalLM", "Gemma2ForCausalLM", "Olmo2ForCausalLM"):
        assert architecture in str(refused.value)
    assert len(SUPPORTED_ARCHITECTURES) == 15


def test_olmo2_refuses_tensor_parallelism_with_its_reason(family_models) -> None:
    folder, _ = family_models("olmo2")
    config = AutoConfig.from_pretrained(folder)
    with pytest.raises(ValueError, match="normalises q and k over all heads"):
        CausalLM(config, TensorParallel(0, 2))


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_blocks_before_the_window_go_back_to_the_pool(family_models, prefix_caching) -> None:
    """Every layer of this Mistral slides by 24 tokens: over a 150-token generation a
    sequence holds at most the blocks of its window (and the one being filled), the
    pool's free count stays up, and the tokens are still transformers'."""
    folder, hf_model = family_models("mistral-window")
    prompt = _prompts()[-1]  # 90 tokens
    expected = hf_greedy(hf_model, prompt, 150)
    settings = {"block_size": 4, "enable_prefix_caching": prefix_caching}
    params = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)
    with LLM(str(folder), **settings) as llm:
        engine = llm.engine
        engine.add_request("long", {"prompt_token_ids": prompt}, params)
        held, tokens = [], []
        while engine.has_unfinished_requests():
            for delta in engine.step():
                tokens += delta.new_token_ids
            seq = engine.requests.get("long")
            if seq is not None and seq.num_output_tokens > 0:
                held.append(len(seq.block_ids) - seq.num_released_blocks)
        assert tokens == expected
        window_blocks = WINDOW // 4
        assert max(held) <= window_blocks + 2
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


# Each scaling on the tiny Llama (head_dim 16, 512 positions), where it changes the
# rotation of the prompts' positions (up to 90 tokens plus the outputs).
ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    # Below its original context LongRoPE takes the short factors (and the attention
    # factor of the whole extension) in both; past it the two differ by design
    # (docs/models.md).
    "longrope": {
        "rope_type": "longrope", "original_max_position_embeddings": 256,
        "short_factor": [1.0, 1.5, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0],
        "long_factor": [2.0, 3.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0],
    },
}  # fmt: skip


@pytest.mark.parametrize("scaling", ROPE_SCALINGS)
def test_each_rope_scaling_decodes_as_transformers_does(scaling: str, tmp_path) -> None:
    rope = {"rope_theta": 10000.0, **ROPE_SCALINGS[scaling]}
    hf_model = build_tiny_model("llama-untied", tmp_path, rope_parameters=rope)
    prompts = [p for p in _prompts() if len(p) >= 40]  # the positions scalings move most
    expected = [hf_greedy(hf_model, prompt, MAX_TOKENS) for prompt in prompts]
    assert _greedy(tmp_path, prompts) == expected
