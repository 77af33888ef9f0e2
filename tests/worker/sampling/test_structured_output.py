"""Constrained decoding in the engine, with SmolLM2: outputs follow their constraint,
unconstrained rows are untouched, and sampling, batching and preemption keep their
promises."""

import json
import os
import re
import threading
from pathlib import Path

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from queue_schemas import StructuredOutputs
from tests.conftest import hf_greedy
from tests.strategies import json_schemas, json_values
from worker import LLM, LLMEngine, SamplingParams
from worker.sampling.structured_output import apply_masks

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "status": {"enum": ["active", "retired"]},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "status", "skills"],
}
PEOPLE = [
    "Maria Lopez, 34, a nurse from Madrid who speaks Spanish and English.",
    "Bob Stone is 71 and retired; he was a carpenter.",
    "Aiko, 28, software engineer in Osaka, knows Rust and Go.",
]


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> LLM:
    return LLM(str(smollm2_path), max_num_seqs=8)


def _chat(llm: LLM, text: str, ask: str = "Extract the person as JSON: ") -> list[int]:
    tokenizer = llm.get_tokenizer()
    assert tokenizer is not None
    messages = [{"role": "user", "content": ask + text}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _greedy(constraint: dict | None, max_tokens: int = 96, **fields) -> SamplingParams:
    return SamplingParams(
        temperature=0, max_tokens=max_tokens, structured_outputs=constraint, **fields
    )


def _valid_person(text: str) -> bool:
    person = json.loads(text)
    jsonschema.validate(person, PERSON)
    return list(person) == list(PERSON["properties"])  # in the schema's order


def test_every_kind_of_constraint_shapes_the_output(llm: LLM) -> None:
    cases = [
        ({"json": PERSON}, "Extract the person as JSON: ", _valid_person),
        ({"json_object": True}, "Reply with a JSON object with the keys name and age: ",
         lambda text: isinstance(json.loads(text), dict)),
        ({"regex": r"\d{4}-\d{2}-\d{2}"}, "When was this person born? ",
         lambda text: re.fullmatch(r"\d{4}-\d{2}-\d{2}", text)),
        ({"choice": ["nurse", "carpenter", "engineer"]}, "What is the job? ",
         lambda text: text in ("nurse", "carpenter", "engineer")),
        ({"grammar": 'root ::= "name: " [A-Za-z ]+ "."'}, "Who is it? ",
         lambda text: re.fullmatch(r"name: [A-Za-z ]+\.", text)),
    ]  # fmt: skip
    for constraint, ask, check in cases:
        prompts = [_chat(llm, text, ask) for text in PEOPLE]
        outputs = llm.generate(prompts, _greedy(constraint, max_tokens=160))
        for out in outputs:
            completion = out.outputs[0]
            assert completion.finish_reason == "stop", (constraint, completion.text)
            assert check(completion.text), (constraint, completion.text)


def test_unconstrained_rows_in_a_constrained_batch_are_greedy_as_alone(
    llm: LLM, smollm2_hf: torch.nn.Module
) -> None:
    free = [_chat(llm, text) for text in PEOPLE[:2]]
    constrained = [_chat(llm, text) for text in PEOPLE[1:]]
    params = [_greedy(None, 24, ignore_eos=True)] * 2 + [_greedy({"json": PERSON}, 24)] * 2
    outputs = llm.generate(free + constrained, params)
    for prompt, out in zip(free, outputs[:2], strict=True):
        assert out.outputs[0].token_ids == hf_greedy(smollm2_hf, prompt, 24)


def test_a_seeded_constrained_request_draws_the_same_alone_and_in_a_batch(llm: LLM) -> None:
    prompt = _chat(llm, PEOPLE[2])
    seeded = SamplingParams(
        temperature=0.9, top_p=0.95, seed=11, max_tokens=120, structured_outputs={"json": PERSON}
    )
    alone = llm.generate([prompt], seeded)[0].outputs[0]
    others = [_chat(llm, text) for text in PEOPLE[:2]]
    batch = llm.generate(
        [*others, prompt], [_greedy({"regex": "[a-z]{3,9}"}), _greedy(None, 40), seeded]
    )
    assert batch[2].outputs[0].text == alone.text
    assert _valid_person(alone.text)


def test_a_preempted_constrained_request_ends_as_it_would_without_preemption(
    smollm2_path: Path,
) -> None:
    def run(num_blocks: int) -> tuple[list[int], int]:
        engine = LLMEngine.from_kwargs(
            model=str(smollm2_path), num_gpu_blocks_override=num_blocks, watermark=0.0
        )
        prompt = [1, *range(200, 289)]  # 90 tokens: 6 blocks of 16
        engine.add_request("long", prompt, _greedy(None, 30, ignore_eos=True))
        engine.add_request("json", prompt[:20], _greedy({"json": PERSON}, 80))
        seq = engine.requests["json"]
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for delta in engine.step():
                if delta.request_id == "json":
                    tokens += delta.new_token_ids
        return tokens, seq.num_preemptions

    roomy, never = run(64)
    # 8 blocks: both prompts fill them; the first block "json" needs preempts it.
    tight, preempted = run(8)
    assert never == 0 and preempted >= 1 and len(roomy) > 10
    assert tight == roomy


def test_an_invalid_grammar_is_refused_by_name_and_the_engine_serves_on(llm: LLM) -> None:
    engine = llm.engine
    for constraint, reason in [
        ({"regex": "(unclosed"}, "cannot compile the regex: .*parenthesis"),
        ({"grammar": "root ::= "}, "cannot compile the grammar"),
        ({"grammar": 'start ::= "a"'}, "cannot compile the grammar"),
    ]:
        with pytest.raises(ValueError, match=reason):
            engine.add_request("bad", [1, 2, 3], _greedy(constraint))
        assert engine.requests == {}
    out = llm.generate([[1, 2, 3]], _greedy({"choice": ["ok"]}))[0].outputs[0]
    assert out.text == "ok"


def test_stop_tokens_are_allowed_only_where_the_grammar_may_end(llm: LLM) -> None:
    grammars = llm.engine.grammars
    assert grammars is not None
    (eos,) = llm.engine.eos_token_ids
    tokenizer = llm.get_tokenizer()
    state = grammars.state(StructuredOutputs(choice=["yes", "yesterday"]))
    bitmask = torch.zeros(1, (llm.engine.vocab_size + 31) // 32, dtype=torch.int32)

    def allowed(token: int) -> bool:
        state.fill_mask(bitmask, 0)
        return bool((bitmask[0, token // 32] >> (token % 32)) & 1)

    assert not allowed(eos)
    for token in tokenizer.encode("yes", add_special_tokens=False):
        assert state.accept(token)
    assert allowed(eos)  # "yes" may end here, or go on to "yesterday"
    assert state.accept(eos) and state.terminated


def test_drafts_are_cut_to_what_the_grammar_takes_short_of_its_end(llm: LLM) -> None:
    grammars = llm.engine.grammars
    assert grammars is not None
    (eos,) = llm.engine.eos_token_ids
    yes = llm.get_tokenizer().encode("yes", add_special_tokens=False)
    state = grammars.state(StructuredOutputs(choice=["yes", "yesterday"]))
    assert state.accepted_prefix([*yes, eos, *yes]) == len(yes)  # the end is not drafted
    assert state.accepted_prefix([eos]) == 0  # outside the grammar
    assert all(state.accept(token) for token in yes)  # the state stood where it was


def test_constrained_requests_speculate_under_their_grammar(llm: LLM, chat_model: Path) -> None:
    """n-gram drafts verified under each position's mask (the tiny chat model: fast
    steps, SmolLM2's tokenizer): greedy output identical to decoding without drafts;
    seeded sampling valid."""
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}
    plain = LLM(str(chat_model), max_num_seqs=8)
    spec = LLM(str(chat_model), max_num_seqs=8, speculative_config=ngram)
    prompt = _chat(llm, PEOPLE[1])
    greedy = _greedy({"json": PERSON}, 120)
    expected = plain.generate([prompt], greedy)[0].outputs[0].text
    assert spec.generate([prompt], greedy)[0].outputs[0].text == expected
    assert spec.engine.spec_stats.num_accepted_tokens > 0
    seeded = SamplingParams(
        temperature=0.9, seed=5, max_tokens=120, structured_outputs={"json": PERSON}
    )
    out = spec.generate([prompt], seeded)[0].outputs[0]
    assert out.finish_reason == "stop" and _valid_person(out.text)


def test_a_batch_without_constraints_is_not_touched() -> None:
    class Row:
        constraint = None

    logits = torch.randn(3, 50)
    assert apply_masks(logits, [Row(), Row(), Row()]) is logits


def test_a_constraint_compiles_once_and_a_failure_is_remembered(llm: LLM, monkeypatch) -> None:
    grammars = llm.engine.grammars
    assert grammars is not None
    builds: list[str] = []
    build = grammars._build
    monkeypatch.setattr(grammars, "_build", lambda c: builds.append(c.kind) or build(c))
    good, bad = StructuredOutputs(regex="[0-9]{2}x"), StructuredOutputs(regex="[0-9")
    for _ in range(3):
        grammars.compile(good)
        with pytest.raises(ValueError):
            grammars.compile(bad)
    assert builds == ["regex", "regex"]
    assert grammars.is_cached(good) and grammars.is_cached(bad)


def test_background_compiles_run_at_the_lowest_cpu_priority(llm: LLM, monkeypatch) -> None:
    grammars = llm.engine.grammars
    assert grammars is not None
    seen: list[int] = []
    build = grammars._build

    def recording_build(constraint):
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return build(constraint)

    monkeypatch.setattr(grammars, "_build", recording_build)
    grammars.compile_in_background(StructuredOutputs(regex="[a-f]{7}")).result(30)
    assert seen == [19]


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    value=json_schemas | json_values, kind=st.sampled_from(["json", "regex", "grammar", "choice"])
)
def test_any_constraint_a_producer_sends_is_refused_or_compiled_never_a_crash(
    llm: LLM, value: object, kind: str
) -> None:
    """What the wire accepts, the compiler either compiles or refuses with a ValueError:
    an exception of another kind (or a crash) here would take down every worker in turn."""
    try:
        constraint = StructuredOutputs.model_validate({kind: value})
    except ValidationError:
        return
    grammars = llm.engine.grammars
    assert grammars is not None
    try:
        grammars.compile(constraint)
    except ValueError as error:
        assert str(error).startswith(f"cannot compile the {kind}")
