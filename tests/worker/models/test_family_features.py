"""The engine's features on every family: speculative decoding with the model as its
own draft (every draft right, output equal to transformers'), and, on the dense
families, an fp8 KV cache whose greedy choices exact attention ranks near its best."""

from pathlib import Path

import pytest
import torch

from tests.conftest import hf_greedy
from tests.worker.models.families import FAMILY_KINDS, MOE_KINDS
from tests.worker.models.test_families import _prompts
from tests.worker.models.test_fp8_kv import _gaps
from tests.worker.spec_decode.test_speculative import _copying_prompts
from worker import LLM, SamplingParams

MAX_TOKENS = 16
# The Llama bound of test_fp8_kv (0.6 for logits spread 1.2) as a share of each model's
# spread: measured worst gaps 0.31 of spreads from 1.06 to 2.4; a token picked at
# random falls about three spreads short.
FP8_SHARE_OF_SPREAD = 0.5
PARAMS = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.mark.parametrize("kind", FAMILY_KINDS)
def test_the_model_as_its_own_draft_has_every_draft_accepted(family_models, kind) -> None:
    folder, hf_model = family_models(kind)
    prompts = _copying_prompts(seed=3)
    draft = {"model": str(folder), "num_speculative_tokens": 3}
    with LLM(str(folder), max_num_seqs=8, speculative_config=draft) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)
        stats = llm.engine.spec_stats
    assert stats.num_drafts > 0 and stats.num_accepted_tokens == stats.num_draft_tokens
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.outputs[0].token_ids == hf_greedy(hf_model, prompt, MAX_TOKENS)


# A router's top-k is discontinuous: where two experts' scores nearly tie, fp8's rounding
# of the keys and values before it can flip the choice and move the logits by units
# (2.5 measured on the tiny Qwen3-MoE), past any bound a smooth model keeps.
DENSE_KINDS = tuple(kind for kind in FAMILY_KINDS if kind not in MOE_KINDS)


def assert_fp8_picks_near_best(folder: Path, hf_model: torch.nn.Module) -> None:
    """The model with an fp8 cache picks tokens exact attention ranks within
    ``FP8_SHARE_OF_SPREAD`` of its logit spread of its best."""
    prompts = _prompts()
    with LLM(str(folder), max_num_seqs=8, kv_cache_dtype="fp8") as llm:
        assert llm.engine.runner.kv_cache.element_size() == 1
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)
    replies = [o.outputs[0].token_ids for o in outputs]
    with torch.no_grad():
        spread = hf_model(torch.tensor([prompts[-1]])).logits.std().item()
    assert _gaps(hf_model, prompts, replies) <= FP8_SHARE_OF_SPREAD * spread


@pytest.mark.parametrize("kind", DENSE_KINDS)
def test_an_fp8_cache_picks_what_exact_attention_ranks_near_best(family_models, kind) -> None:
    assert_fp8_picks_near_best(*family_models(kind))


def test_a_mixture_of_experts_counts_the_experts_a_token_reads(family_models) -> None:
    """Four experts, two per token: half of the stacked experts' bytes are idle."""
    folder, _ = family_models("mixtral")
    with LLM(str(folder)) as llm:
        model, weights = llm.engine.runner.model, llm.engine.weights
    stacked = sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n
    )
    assert weights.bytes - weights.active_bytes == stacked // 2
    assert "active per token" in weights.describe()
