"""A job taken over from a worker that died resumes from the tokens already streamed:
one prefill reads them, outputs go on from the next index, and the result is what an
uninterrupted run gives (greedy), stop strings across the seam, grammars and usage
included."""

import json

from worker import LLMEngine, SamplingParams
from worker.config import EngineConfig

PROMPT = "one two three four five six seven eight nine ten eleven twelve"
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _engine(chat_model) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(chat_model), max_num_batched_tokens=64))


def _run(engine: LLMEngine, request_id: str, params: SamplingParams, resumed=None):
    """(token ids by index, text, steps, last delta) of one request run alone."""
    engine.add_request(request_id, PROMPT, params, resumed_token_ids=resumed)
    tokens: dict[int, int] = {}
    text, steps, last = "", 0, None
    while engine.has_unfinished_requests():
        steps += 1
        for delta in engine.step():
            for offset, token in enumerate(delta.new_token_ids):
                tokens[delta.token_index + offset] = token
            text += delta.new_text
            last = delta
    return tokens, text, steps, last


def test_a_resumed_job_prefills_its_tokens_and_goes_on_as_if_uninterrupted(chat_model) -> None:
    engine = _engine(chat_model)
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    whole, _, whole_steps, _ = _run(engine, "whole", params)
    ids = [whole[i] for i in range(60)]

    tokens, _, steps, last = _run(engine, "resumed", params, resumed=ids[:30])

    assert sorted(tokens) == list(range(30, 60))  # from the next index on
    assert [tokens[i] for i in range(30, 60)] == ids[30:]
    # A prefill (chunks of 64 tokens) and one step per new token: the 30 resumed
    # tokens are read, never decoded again.
    assert steps <= 30 + 2 < whole_steps
    assert last is not None and last.usage.completion_tokens == 60
    assert last.usage.prompt_tokens == len(engine.admission.tokenize(PROMPT))


def test_a_stop_string_across_the_seam_ends_the_text_where_it_would(chat_model) -> None:
    engine = _engine(chat_model)
    greedy = {"temperature": 0, "max_tokens": 40, "ignore_eos": True}
    whole, _, _, _ = _run(engine, "plain", SamplingParams(**greedy))
    ids = [whole[i] for i in range(40)]
    tokenizer = engine.tokenizer
    assert tokenizer is not None
    before = tokenizer.decode(ids[:20])
    after = tokenizer.decode(ids[:21])
    stop = before[-2:] + after[len(before) :][:2]  # two characters each side of the seam
    params = SamplingParams(**greedy, stop=[stop])
    _, expected, _, ended = _run(engine, "stopped", params)
    assert ended is not None and ended.stop_reason == stop

    _, text, _, last = _run(engine, "resumed", params, resumed=ids[:20])

    # Readers hold what the first attempt streamed (all but the stop string's length
    # less one, held back); the resumed attempt's text completes it exactly.
    streamed = before[: len(before) - (len(stop) - 1)]
    assert last is not None and last.stop_reason == stop
    assert streamed + text == expected


def test_a_resumed_token_that_ended_the_job_is_produced_again(chat_model) -> None:
    engine = _engine(chat_model)
    greedy = {"temperature": 0, "max_tokens": 20, "ignore_eos": True}
    whole, _, _, _ = _run(engine, "plain", SamplingParams(**greedy))
    ids = [whole[i] for i in range(20)]
    params = SamplingParams(**greedy, stop_token_ids=[ids[9]])
    expected, _, _, _ = _run(engine, "stopped", params)
    assert max(expected) <= 9  # it stops at (or before) that token

    tokens, _, _, last = _run(engine, "resumed", params, resumed=ids)

    # Replayed, the stop token would have ended it: resumed up to it, it comes again.
    last_index = max(expected)
    assert last is not None and last.finish_reason == "stop"
    assert tokens == {last_index: expected[last_index]}


def test_a_structured_output_resumed_mid_json_still_parses(chat_model) -> None:
    engine = _engine(chat_model)
    params = SamplingParams(temperature=0, max_tokens=80, structured_outputs={"json": PERSON})
    whole, text, _, _ = _run(engine, "whole", params)
    ids = [whole[i] for i in sorted(whole)]
    half = len(ids) // 2

    tokens, _, _, last = _run(engine, "resumed", params, resumed=ids[:half])

    assert [tokens[i] for i in sorted(tokens)] == ids[half:]
    assert last is not None and last.finish_reason == "stop"
    assert set(json.loads(text)) == {"name", "age"}


def test_a_resumed_job_goes_ahead_of_jobs_that_have_not_started(chat_model) -> None:
    """One sequence at a time: a job taken over (its reader mid-stream) runs next, before
    jobs queued earlier with a better priority that have streamed nothing."""
    engine = LLMEngine(EngineConfig(model=str(chat_model), max_num_seqs=1))
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine.add_request("running", PROMPT, params)
    engine.step()
    engine.add_request("fresh", PROMPT, params, priority=-5)
    engine.add_request("taken-over", PROMPT, params, resumed_token_ids=[5, 6])
    order: list[str] = []
    while engine.has_unfinished_requests():
        for delta in engine.step():
            if delta.request_id not in order:
                order.append(delta.request_id)
    assert order == ["running", "taken-over", "fresh"]
