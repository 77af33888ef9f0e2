"""n-gram speculative decoding: proposals, and greedy output identical to decoding one
token at a time (the parity tests' tiny models and scheduling scenarios)."""

import random

import pytest
import torch

from queue_schemas.sampling import SamplingOptions
from tests.conftest import build_tiny_model
from tests.worker.models.test_parity import SCENARIOS, TINY_VOCAB
from worker import LLM, SamplingParams
from worker.config import EngineConfig, SpeculativeConfig
from worker.engine.sequence import Sequence
from worker.spec_decode.proposers import propose_ngram
from worker.spec_decode.verification import SpecDecodeStats, accepted_drafts, verify

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
    draft = SpeculativeConfig(model="folder", num_speculative_tokens=2)
    assert draft.method == "draft_model"  # a model given: vLLM's default method for it
    with pytest.raises(ValueError, match='needs "model"'):
        SpeculativeConfig(method="draft_model", num_speculative_tokens=2)
    with pytest.raises(ValueError, match='takes no "model"'):
        SpeculativeConfig(method="ngram", model="folder", num_speculative_tokens=2)


def _copying_prompts(seed: int) -> list[list[int]]:
    """Prompts that repeat themselves, so that proposals are found; and plain ones."""
    rng = random.Random(seed)
    prompts = []
    for n in (3, 8, 12, 20):
        chunk = [rng.randrange(3, TINY_VOCAB) for _ in range(n)]
        prompts.append(chunk * 3)
    return prompts + [[rng.randrange(3, TINY_VOCAB) for _ in range(n)] for n in (1, 17, 64)]


def _proposer(name: str, tiny_models) -> dict:
    """The speculative config of a proposer: n-gram lookup; the target itself as its
    own draft model (all drafts right); another model of the vocabulary (most wrong)."""
    if name == "ngram":
        return NGRAM
    draft = {"draft-self": "llama-untied", "draft-other": "mistral"}[name]
    return {"model": str(tiny_models[draft][0]), "num_speculative_tokens": 3}


# Every scheduling scenario with n-gram drafts and with the target as its own draft
# model (all drafts right: the draft cache must follow the target's through
# preemption, chunks and cached prefixes); another model's drafts in the plain one.
CASES = [
    *((scenario, proposer) for scenario in SCENARIOS for proposer in ("ngram", "draft-self")),
    ("default", "draft-other"),
]


@pytest.mark.parametrize(("scenario", "proposer"), CASES)
def test_greedy_output_is_identical_with_speculation(tiny_models, scenario, proposer) -> None:
    folder, _ = tiny_models["llama-untied"]
    prompts = _copying_prompts(seed=3)
    requests = [{"prompt_token_ids": p} for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    knobs = {"max_num_seqs": 8, **SCENARIOS[scenario]}
    expected = LLM(str(folder), **knobs).generate(requests, params)
    llm = LLM(str(folder), speculative_config=_proposer(proposer, tiny_models), **knobs)

    outputs = llm.generate(requests, params)

    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in expected]
    engine = llm.engine
    stats = engine.spec_stats
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    if proposer == "draft-self":  # the draft is the target: every draft is its choice
        assert stats.num_accepted_tokens == stats.num_draft_tokens
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


def test_penalties_logprobs_and_min_tokens_verify_as_they_decode(tiny_models) -> None:
    """Each verifying position scored as a one-token step there: penalties counting the
    drafts before it, the target's logprobs of each kept token, ``min_tokens`` holding
    back a stop id that a draft reaches early."""
    folder, _ = tiny_models["llama-untied"]
    prompts = _copying_prompts(seed=11)
    requests = [{"prompt_token_ids": p} for p in prompts]
    plain = LLM(str(folder), max_num_seqs=8)
    spec = LLM(str(folder), max_num_seqs=8, speculative_config=NGRAM)
    greedy = {"temperature": 0, "max_tokens": 20, "ignore_eos": True}
    reference = plain.generate(requests, SamplingParams(**greedy))
    early_stop = reference[0].outputs[0].token_ids[2]
    cases = [
        SamplingParams(**greedy, repetition_penalty=1.05),
        SamplingParams(**greedy, presence_penalty=0.1, frequency_penalty=0.05),
        SamplingParams(**greedy, logprobs=3),
        SamplingParams(**greedy, min_tokens=12, stop_token_ids=[early_stop]),
    ]
    for params in cases:
        expected = plain.generate(requests, params)
        before = spec.engine.spec_stats.num_accepted_tokens
        outputs = spec.generate(requests, params)
        assert spec.engine.spec_stats.num_accepted_tokens > before, params
        for out, ref in zip(outputs, expected, strict=True):
            got, want = out.outputs[0], ref.outputs[0]
            assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason)
            if params.logprobs is None:
                continue
            assert len(got.logprobs) == len(want.logprobs)
            for mine, theirs in zip(got.logprobs, want.logprobs, strict=True):
                assert mine.keys() == theirs.keys()
                for token in theirs:
                    assert mine[token] == pytest.approx(theirs[token], abs=1e-4)


def test_a_stop_string_inside_a_drafted_run_ends_the_text_there(chat_model) -> None:
    """The tiny chat model (SmolLM2's tokenizer) as its own draft: every step is a run of
    kept drafts, and a stop string taken from the middle of the reply ends it where it
    would without speculation: text, tokens and stop reason."""
    plain = LLM(str(chat_model))
    spec = LLM(str(chat_model), speculative_config={"model": str(chat_model),
                                                    "num_speculative_tokens": 4})  # fmt: skip
    prompt = {"prompt": "one two three four five six seven eight nine ten " * 3}
    greedy = {"temperature": 0, "max_tokens": 30, "ignore_eos": True}
    reply = plain.generate([prompt], SamplingParams(**greedy))[0].outputs[0].text
    middle = len(reply) // 2
    params = SamplingParams(**greedy, stop=[reply[middle : middle + 3]])
    want = plain.generate([prompt], params)[0].outputs[0]
    got = spec.generate([prompt], params)[0].outputs[0]
    assert want.finish_reason == "stop" and len(want.text) <= middle
    assert got.text == want.text and got.token_ids == want.token_ids
    assert got.stop_reason == want.stop_reason
    assert spec.engine.spec_stats.num_accepted_tokens >= len(want.token_ids) // 2


def test_aborting_a_request_that_holds_drafts_frees_its_blocks(tiny_models) -> None:
    folder, _ = tiny_models["llama-untied"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = _copying_prompts(seed=3)[:4]
    expected = LLM(str(folder)).generate([{"prompt_token_ids": p} for p in prompts], params)
    engine = LLM(str(folder), speculative_config=_proposer("draft-self", tiny_models)).engine
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    while not engine.requests["0"].draft_token_ids:
        engine.step()
    assert engine.abort_request("0")
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for delta in engine.step():
            tokens.setdefault(delta.request_id, []).extend(delta.new_token_ids)
    assert "0" not in engine.requests and tokens["0"] == []
    for i in range(1, 4):  # the others go on as they would have
        assert expected[i].outputs[0].token_ids[-len(tokens[str(i)]) :] == tokens[str(i)]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_penalty_counts_the_drafts_before_each_position() -> None:
    """Token 2 leads token 3 by 0.1 at every position; a frequency penalty of 0.5 drops
    it behind once one 2 precedes the position: the first draft 2 is kept, the second
    is not (scored without the first, it would be)."""
    params = SamplingOptions(temperature=0, frequency_penalty=0.5, max_tokens=8)
    seq = Sequence("a", [0, 1], params, arrival_index=0)
    seq.draft_token_ids = [2, 2]
    logits = torch.tensor([[0.0, 0.0, 2.0, 1.9, 0.0]] * 3)
    tokens, logprobs = verify(logits, seq, logits.argmax(dim=-1).tolist(), set())
    assert tokens == [2, 3] and logprobs == [None, None]


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


@pytest.mark.parametrize("proposer", ["ngram", "draft_model"])
def test_sampled_tokens_follow_the_target_distribution(tmp_path, proposer) -> None:
    """Many seeds on a 16-token vocabulary: the second token (the first a verification
    decides: it always has a draft here) is distributed as the model says, within a
    total-variation bound that a rule keeping every draft breaks many times over."""
    model = build_tiny_model(
        "llama-tied", tmp_path / "tiny16", vocab_size=16, initializer_range=0.05
    )
    prompt = list(range(16)) * 2  # whatever comes first has occurred: a draft follows it
    temperature, n = 1.0, 3000
    exact = _exact_second_token(model, prompt, temperature)
    spec: dict = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}
    if proposer == "draft_model":  # another model: its greedy drafts are often wrong
        build_tiny_model("mistral", tmp_path / "draft16", vocab_size=16)
        spec = {"model": str(tmp_path / "draft16"), "num_speculative_tokens": 2}
    llm = LLM(str(tmp_path / "tiny16"), max_num_seqs=256, speculative_config=spec)
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


def test_a_draft_model_shares_the_kv_budget_and_the_vocabulary(tiny_models, tmp_path) -> None:
    folder, _ = tiny_models["llama-untied"]
    budget = {"kv_cache_memory_gib": 0.001}
    alone = LLM(str(folder), **budget).engine.block_manager.num_blocks
    self_draft = {"model": str(folder), "num_speculative_tokens": 2}
    shared = LLM(str(folder), speculative_config=self_draft, **budget).engine
    # The same K/V size per block twice over: half the blocks, on one block table.
    assert shared.block_manager.num_blocks == alone // 2
    assert shared.proposer.runner.kv_cache.shape[2] == shared.runner.kv_cache.shape[2]
    build_tiny_model("llama-tied", tmp_path / "other-vocab", vocab_size=TINY_VOCAB + 8)
    other = {"model": str(tmp_path / "other-vocab"), "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="vocabulary of 392 tokens, the target's 384"):
        LLM(str(folder), speculative_config=other)


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
