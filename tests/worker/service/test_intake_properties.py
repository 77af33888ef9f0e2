"""Property tests: whatever a Kafka record or an OpenAI body holds, the worker's path
from bytes to engine either refuses it with a reason or serves it, and the engine
goes on serving the next request."""

import json
import os
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st
from pydantic import ValidationError

from genfleet.chaos.records import EXTREME_FLOATS, EXTREME_INTS, EXTREME_STRINGS
from producer_api.auth import Tenant
from producer_api.openai_routes import _jobs
from producer_api.openai_schema import ChatCompletionRequest, CompletionRequest
from queue_schemas import JobRequest
from queue_schemas.bounds import MAX_RECORD_BYTES
from worker import SamplingParams
from worker.config import EngineConfig
from worker.engine import LLMEngine
from worker.service.intake import (
    Rejected,
    engine_prompt,
    longest_token_bytes,
    parse_job,
    sampling_params,
)

SLOW = os.environ.get("GENFLEET_SLOW_TESTS") == "1"
SETTINGS = hypothesis.settings(
    max_examples=400 if SLOW else 150,
    deadline=None,
    database=None,
    derandomize=not SLOW,  # CI sees the same examples every run
    suppress_health_check=list(hypothesis.HealthCheck),
)
STEPS = 3  # engine steps per example: prefill and a couple of tokens

# Any JSON value, scalars from the extreme pools included.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(EXTREME_INTS),
    st.integers(),
    st.sampled_from(EXTREME_FLOATS),
    st.floats(),
    st.sampled_from(EXTREME_STRINGS),
    st.text(max_size=40),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=12,
)
extremes = st.one_of(
    st.sampled_from(EXTREME_INTS),
    st.sampled_from(EXTREME_FLOATS),
    st.sampled_from(EXTREME_STRINGS),
    st.lists(st.sampled_from(EXTREME_INTS), max_size=4),
    st.lists(st.sampled_from(EXTREME_STRINGS), max_size=4),
    st.just([f"s{i}" for i in range(1000)]),
    json_values,
)

# Valid values of every field: the base a few corruptions are made to.
token_ids = st.lists(st.integers(0, 400), min_size=1, max_size=8)
texts = st.text(max_size=60) | st.just("word " * 2000)  # the latter: over the context
chats = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": texts}
    ),
    min_size=1,
    max_size=3,
)
VALID_SAMPLING: dict[str, st.SearchStrategy[Any]] = {
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 500),
    "min_p": st.floats(0, 1),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.5, 2),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "min_tokens": st.integers(0, 2),
    "stop": st.lists(st.text(min_size=1, max_size=5), max_size=3),
    "stop_token_ids": st.lists(st.integers(0, 400), max_size=3),
    "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(),
}
sampling = st.fixed_dictionaries(
    {"max_tokens": st.integers(3, 8)},
    optional={**VALID_SAMPLING, "logprobs": st.integers(0, 5)},
)
valid_jobs = st.fixed_dictionaries(
    {
        "job_id": st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
        "sampling": sampling,
    },
    optional={
        "tenant": st.from_regex(r"[a-z]{1,8}", fullmatch=True),
        "priority": st.integers(-5, 5),
        "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    },
).flatmap(
    lambda job: st.one_of(
        texts.map(lambda text: {**job, "prompt": text}),
        token_ids.map(lambda ids: {**job, "prompt_token_ids": ids}),
        chats.map(lambda chat: {**job, "messages": chat}),
    )
)
TOP_FIELDS = (
    "job_id", "tenant", "prompt", "prompt_token_ids", "messages", "priority", "deadline",
    "metadata", "schema_version", "sampling",
)  # fmt: skip
SAMPLING_FIELDS = (*VALID_SAMPLING, "max_tokens", "logprobs")


@st.composite
def corrupted(
    draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]], fields: tuple[str, ...]
) -> dict[str, Any]:
    """A valid document with up to two fields (``a.b``: nested) set to extreme values."""
    document = draw(base)
    for _ in range(draw(st.integers(0, 2))):
        *parents, name = draw(st.sampled_from(fields)).split(".")
        target = document
        for parent in parents:
            if not isinstance(target.get(parent), dict):
                target[parent] = {}
            target = target[parent]
        target[name] = draw(extremes)
    return document


job_records = corrupted(
    valid_jobs, (*TOP_FIELDS, *(f"sampling.{name}" for name in SAMPLING_FIELDS))
)
OPENAI_FIELDS = (*SAMPLING_FIELDS, "n", "priority", "stream", "model", "user")
openai_common = st.fixed_dictionaries(
    {"max_tokens": st.integers(3, 8)},
    optional={**VALID_SAMPLING, "n": st.integers(1, 3), "priority": st.integers(-5, 5)},
)
chat_bodies = corrupted(
    st.tuples(openai_common, chats, st.booleans(), st.integers(0, 5)).map(
        lambda b: {
            **b[0],
            "messages": b[1],
            "logprobs": b[2],
            **({"top_logprobs": b[3]} if b[2] else {}),
        }
    ),
    (*OPENAI_FIELDS, "messages", "max_completion_tokens", "top_logprobs"),
)
completion_bodies = corrupted(
    st.tuples(openai_common, texts | token_ids | st.lists(token_ids, min_size=1, max_size=3)).map(
        lambda b: {**b[0], "prompt": b[1]}
    ),
    (*OPENAI_FIELDS, "prompt", "echo", "suffix"),
)


@pytest.fixture(scope="module")
def engine(chat_model: Path) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=str(chat_model), max_model_len=256, num_gpu_blocks_override=64)
    )


class Served:
    """The worker's path from a record to the engine, counting how each record ended."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.max_prompt_bytes = engine.max_model_len * longest_token_bytes(engine.tokenizer)
        self.ends: dict[str, int] = {}
        self._ids = 0

    def record(self, raw: bytes | None) -> None:
        job = parse_job(raw, MAX_RECORD_BYTES)
        if isinstance(job, Rejected):
            assert job.reason, "a dead letter needs a reason"
            self._count("dead letter")
            return
        self.job(job)

    def job(self, job: JobRequest) -> None:
        request_id = f"r{self._ids}"
        self._ids += 1
        try:
            prompt = engine_prompt(job, self.engine.tokenizer, self.max_prompt_bytes)
            self.engine.add_request(request_id, prompt, sampling_params(job), job.priority)
        except ValueError as refusal:  # the worker's dead letter and failed result
            assert str(refusal)
            self._count("refused")
            return
        for _ in range(STEPS):
            self.engine.step()
        self.engine.abort_request(request_id)
        self.engine.step()  # the abort's final delta; the engine is idle again
        assert not self.engine.has_unfinished_requests()
        self._count("served")

    def still_serves(self) -> None:
        self.engine.add_request("canary", "The sea is", SamplingParams(max_tokens=3, temperature=0))
        finished = []
        while self.engine.has_unfinished_requests():
            finished += [d for d in self.engine.step() if d.finished]
        assert [d.finish_reason for d in finished] == ["length"]

    def _count(self, end: str) -> None:
        self.ends[end] = self.ends.get(end, 0) + 1


def test_any_job_record_is_dead_lettered_refused_or_served(engine: LLMEngine) -> None:
    served = Served(engine)

    @SETTINGS
    @hypothesis.given(document=job_records | json_values)
    def attempt(document: object) -> None:
        served.record(json.dumps(document).encode())

    attempt()
    served.still_serves()
    # The strategies reach all three ends; a bound that rejected everything would fail here.
    assert set(served.ends) == {"dead letter", "refused", "served"}, served.ends


def _openai_jobs(model: type, body: dict[str, Any]) -> list[JobRequest] | None:
    """The API's translation of a body into jobs; None when it answers 422."""
    try:
        request = model.model_validate(body)
    except ValidationError:
        return None
    if isinstance(request, ChatCompletionRequest):
        prompts = [{"messages": [m.model_dump() for m in request.messages]}]
    else:
        prompts = [
            {"prompt": p} if isinstance(p, str) else {"prompt_token_ids": p}
            for p in request.prompts()
        ]
    return _jobs("run", Tenant(tenant="acme"), request, prompts)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_any_openai_body_is_a_422_or_jobs_the_worker_takes(engine: LLMEngine, kind: str) -> None:
    served = Served(engine)
    model, bodies = {
        "chat": (ChatCompletionRequest, chat_bodies),
        "completion": (CompletionRequest, completion_bodies),
    }[kind]
    outcomes = {"422": 0, "jobs": 0}

    @SETTINGS
    @hypothesis.given(body=bodies)
    def attempt(body: dict[str, Any]) -> None:
        jobs = _openai_jobs(model, body)  # a JobRequest it cannot build would be a 500
        if jobs is None:
            outcomes["422"] += 1
            return
        outcomes["jobs"] += 1
        for job in jobs[:2]:
            # As the worker reads it: through the record's bytes.
            served.record(job.model_dump_json().encode())

    attempt()
    served.still_serves()
    assert outcomes["422"] and outcomes["jobs"], outcomes
    assert served.ends.get("served"), served.ends
