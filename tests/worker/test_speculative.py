"""n-gram speculative decoding: proposals, and greedy output identical to decoding one
token at a time (the parity tests' tiny models and scheduling scenarios)."""

import random

import pytest
import torch

from tests.conftest import build_tiny_model
from tests.worker.test_parity import SCENARIOS, TINY_VOCAB
from worker import LLM, SamplingParams
from worker.config import EngineConfig, SpeculativeConfig
from worker.speculative import SpecDecodeStats, accepted_drafts, propose_ngram

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}


def test_the_longest_latest_match_proposes_what_followed_it() -> None:
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # Suffix [2, 3] (n=2) last occurred at 5..6, followed by 7, 8, 5.
    assert propose_ngram(tokens, 3, 1, 2) == [7, 8, 5]
    # With n up to 3, [5, 2, 3] has no earlier occurrence; [2, 3] still decides.
    assert propose_ngram(tokens, 2, 1, 3) == [7, 8]
    assert propose_ngram([4, 5, 6], 3, 1, 3) == []  # nothing repeats
    assert propose_ngram([4, 5, 4], 3, 2, 3) == []  # only n=1 would match
    assert propose_ngram([4, 5, 4], 3, 1, 3) == [5, 4]  # the match runs into the suffix


def test_drafts_are_accepted_up_to_the_first_disagreement() -> None:
    assert accepted_drafts([5, 6, 7], [5, 6, 7, 8]) == 3
    assert accepted_drafts([5, 6, 7], [5, 9, 7, 8]) == 1
    assert accepted_drafts([5, 6, 7], [4, 6, 7, 8]) == 0
    stats = SpecDecodeStats()
    stats.record(3, 1)
    stats.record(4, 4)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (2, 7, 5)
    assert stats.accepted_per_position == [2, 1, 1, 1]


def test_a_lookup_range_upside_down_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_min=4, prompt_lookup_max=2)
    assert EngineConfig(speculative_config=NGRAM).speculative_config.num_speculative_tokens == 4


def _copying_prompts(seed: int) -> list[list[int]]:
    """Prompts that repeat themselves, so that proposals are found; and plain ones."""
    rng = random.Random(seed)
    prompts = []
    for n in (3, 8, 12, 20):
        chunk = [rng.randrange(3, TINY_VOCAB) for _ in range(n)]
        prompts.append(chunk * 3)
    return prompts + [[rng.randrange(3, TINY_VOCAB) for _ in range(n)] for n in (1, 17, 64)]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_output_is_identical_with_speculation(tiny_models, scenario) -> None:
    folder, _ = tiny_models["llama-untied"]
    prompts = _copying_prompts(seed=3)
    requests = [{"prompt_token_ids": p} for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    knobs = {"max_num_seqs": 8, **SCENARIOS[scenario]}
    expected = LLM(str(folder), **knobs).generate(requests, params)
    llm = LLM(str(folder), speculative_config=NGRAM, **knobs)

    outputs = llm.generate(requests, params)

    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in expected]
    engine = llm.engine
    assert engine.spec_stats.num_drafts > 0 and engine.spec_stats.num_accepted_tokens > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    if scenario == "preemption":
        assert engine.scheduler.num_preemptions > 0


def test_stops_inside_a_drafted_run_end_where_they_would_without_one(tiny_models) -> None:
    """max_tokens, a stop token id, and EOS-like ends landing among accepted drafts."""
    folder, _ = tiny_models["llama-tied"]
    prompts = _copying_prompts(seed=5)
    requests = [{"prompt_token_ids": p} for p in prompts]
    plain = LLM(str(folder), max_num_seqs=8)
    spec = LLM(str(folder), max_num_seqs=8, speculative_config=NGRAM)
    reference = plain.generate(
        requests, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    )
    for index, output in enumerate(reference):
        tokens = output.outputs[0].token_ids
        stop_id = tokens[7]  # whatever the model says 8th: a stop there (or earlier)
        for params in (
            SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
            SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop_id], ignore_eos=True),
        ):
            request = [requests[index]]
            expected = plain.generate(request, params)[0].outputs[0]
            actual = spec.generate(request, params)[0].outputs[0]
            assert actual.token_ids == expected.token_ids
            assert actual.finish_reason == expected.finish_reason
    assert spec.engine.spec_stats.num_accepted_tokens > 0


def test_seeded_sampled_requests_speculate_and_repeat_their_draws(tiny_models) -> None:
    folder, _ = tiny_models["llama-untied"]
    requests = [{"prompt_token_ids": p} for p in _copying_prompts(seed=9)]
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=16, ignore_eos=True)
        for i in range(len(requests))
    ]
    first = LLM(str(folder), max_num_seqs=8, speculative_config=NGRAM)
    again = LLM(str(folder), max_num_seqs=8, speculative_config=NGRAM)
    outputs = [o.outputs[0].token_ids for o in first.generate(requests, params)]
    assert outputs == [o.outputs[0].token_ids for o in again.generate(requests, params)]
    assert first.engine.spec_stats.num_drafts > 0


def _exact_second_token(model: torch.nn.Module, prompt: list[int], temperature: float):
    """P(second output token) of ``model`` sampling at ``temperature``: the sum over
    first tokens of P(first) P(second | first)."""
    with torch.no_grad():
        first = (model(torch.tensor([prompt])).logits[0, -1] / temperature).softmax(-1)
        follow = torch.tensor([[*prompt, t] for t in range(first.shape[0])])
        second = (model(follow).logits[:, -1] / temperature).softmax(-1)
    return first @ second


def test_sampled_tokens_follow_the_target_distribution(tmp_path) -> None:
    """Many seeds on a 16-token vocabulary: the second token (the first a verification
    decides: it always has a draft here) is distributed as the model says, within a
    total-variation bound that a rule keeping every draft breaks many times over."""
    model = build_tiny_model(
        "llama-tied", tmp_path / "tiny16", vocab_size=16, initializer_range=0.05
    )
    prompt = list(range(16)) * 2  # whatever comes first has occurred: a draft follows it
    temperature, n = 1.0, 3000
    exact = _exact_second_token(model, prompt, temperature)
    llm = LLM(str(tmp_path / "tiny16"), max_num_seqs=256, speculative_config={
        "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2,
        "prompt_lookup_min": 1})  # fmt: skip
    params = [
        SamplingParams(temperature=temperature, seed=i, max_tokens=3, ignore_eos=True)
        for i in range(n)
    ]
    outputs = llm.generate([{"prompt_token_ids": prompt}] * n, params)
    seconds = torch.tensor([o.outputs[0].token_ids[1] for o in outputs])
    counts = torch.bincount(seconds, minlength=16).float() / n
    distance = 0.5 * (counts - exact).abs().sum().item()
    assert llm.engine.spec_stats.num_drafts >= n  # every second token came out of a verification
    assert distance < 0.06  # sampling noise alone: about 0.03 at 3000 draws
    # What keeping every draft would do: the second token is the draft whenever one is
    # proposed, so its distribution is far from the model's.
    draft_share = llm.engine.spec_stats.num_accepted_tokens / n
    assert 0 < draft_share < 1


def test_no_speculation_above_the_batch_size_threshold(tiny_models) -> None:
    folder, _ = tiny_models["llama-untied"]
    requests = [{"prompt_token_ids": p} for p in _copying_prompts(seed=3)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    crowded = {**NGRAM, "disable_by_batch_size": 1}
    llm = LLM(str(folder), max_num_seqs=8, speculative_config=crowded)
    llm.generate(requests, params)
    assert llm.engine.spec_stats.num_drafts == 0  # seven requests ran together throughout
    llm.generate(requests[:1], params)
    assert llm.engine.spec_stats.num_drafts > 0  # alone, it speculates


def test_every_delta_carries_one_token_in_order(tiny_models) -> None:
    """Downstream (the worker's events, readers' de-duplication by index) a step's
    kept drafts arrive as consecutive one-token deltas, as without speculation."""
    folder, _ = tiny_models["llama-untied"]
    llm = LLM(str(folder), max_num_seqs=8, speculative_config=NGRAM)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    for i, prompt in enumerate(_copying_prompts(seed=3)):
        engine.add_request(str(i), prompt, params)
    indexes: dict[str, list[int]] = {}
    most_in_a_step = 0
    while engine.has_unfinished_requests():
        deltas = engine.step()
        per_request: dict[str, int] = {}
        for delta in deltas:
            assert len(delta.new_token_ids) == 1
            indexes.setdefault(delta.request_id, []).append(delta.token_index)
            per_request[delta.request_id] = per_request.get(delta.request_id, 0) + 1
        most_in_a_step = max([most_in_a_step, *per_request.values()])
    assert all(found == list(range(20)) for found in indexes.values())
    assert most_in_a_step > 1  # some step kept drafts
