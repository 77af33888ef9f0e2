"""The wire contract: validation rules, evolution rules, and the checked-in JSON Schemas."""

import subprocess
import sys
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from queue_schemas import (
    DeadLetter,
    JobRequest,
    JobResult,
    JobState,
    JobStatus,
    Names,
    TokenEvent,
    Usage,
)
from queue_schemas.export import SCHEMA_DIR, schemas


def test_checked_in_json_schemas_match_the_models() -> None:
    generated = schemas()
    on_disk = {path.name: path.read_text() for path in SCHEMA_DIR.glob("*.json")}
    assert on_disk == generated, "run `python -m queue_schemas.export` and commit the result"


def test_a_job_round_trips_through_json() -> None:
    job = JobRequest(
        job_id="etl-42",
        messages=[{"role": "user", "content": "Hello"}],
        sampling={"temperature": 0.2, "max_tokens": 32, "stop": ["\n\n"], "seed": 7},
        priority=-1,
        metadata={"batch": "nightly"},
        deadline=datetime(2030, 1, 1, tzinfo=UTC),
    )
    assert JobRequest.model_validate_json(job.model_dump_json()) == job


def test_a_reader_ignores_fields_it_does_not_know() -> None:
    raw = b'{"job_id": "a", "prompt": "hi", "future_field": {"x": 1}, "schema_version": 1}'
    assert JobRequest.model_validate_json(raw).prompt == "hi"


def test_an_unknown_version_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="schema_version 5 is not supported"):
        JobRequest.model_validate_json(b'{"job_id": "a", "prompt": "hi", "schema_version": 5}')


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"prompt": "a", "prompt_token_ids": [1]},
        {"prompt": "a", "messages": [{"role": "user", "content": "b"}]},
    ],
)
def test_exactly_one_kind_of_prompt(fields) -> None:
    with pytest.raises(ValidationError, match="exactly one of prompt"):
        JobRequest(job_id="a", **fields)


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_sampling_names_the_field(sampling, field) -> None:
    with pytest.raises(ValidationError, match=field):
        JobRequest(job_id="a", prompt="x", sampling=sampling)


@pytest.mark.parametrize("job_id", ["", "has space", "x" * 129, "a/b"])
def test_job_ids_are_safe_to_embed_in_keys(job_id: str) -> None:
    with pytest.raises(ValidationError, match="job_id"):
        JobRequest(job_id=job_id, prompt="x")


def test_result_and_events_round_trip() -> None:
    result = JobResult(
        job_id="a",
        status=JobStatus.COMPLETED,
        text="Paris",
        token_ids=[1, 2],
        finish_reason="stop",
        usage=Usage(prompt_tokens=5, completion_tokens=2),
    )
    assert JobResult.model_validate_json(result.model_dump_json()) == result
    event = TokenEvent(job_id="a", token_index=3, text="is", token_ids=[9], logprobs=[{9: -0.5}])
    assert TokenEvent.model_validate_json(event.model_dump_json()) == event
    state = JobState(job_id="a", status=JobStatus.RUNNING, text="Pa")
    assert JobState.model_validate_json(state.model_dump_json()) == state
    assert JobStatus.CANCELLED.is_final and not JobStatus.RUNNING.is_final


def test_dead_letters_keep_the_raw_bytes() -> None:
    raw = b"\xff\xfe not json"
    letter = DeadLetter.of(raw, "genfleet.jobs", 3, 17, reason="invalid UTF-8")
    assert DeadLetter.model_validate_json(letter.model_dump_json()).raw == raw


def test_names_are_distinct_and_prefixed() -> None:
    names = Names(prefix="test-1.")
    values = [
        names.jobs_topic,
        names.results_topic,
        names.dead_letter_topic,
        names.control_channel,
        names.job_key("t", "j"),
        names.events_stream("t", "j"),
        names.events_channel("t", "j"),
        names.cancel_key("t", "j"),
    ]
    assert len(set(values)) == len(values)
    assert all(value.startswith("test-1.") for value in values)
    assert Names().consumer_group == "genfleet-workers"


def test_the_contract_imports_neither_side_nor_torch() -> None:
    code = (
        "import sys, queue_schemas\n"
        "print(sorted(m for m in ('torch', 'worker', 'producer_api', 'kernels') "
        "if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


class _RecordingPipe:
    """Collects the commands a layout function queues (the layout, not Redis, is tested)."""

    def __init__(self) -> None:
        self.commands: list[tuple] = []

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: self.commands.append((name, args, kwargs))


def test_a_state_lives_under_its_tenant_and_reads_back() -> None:
    from queue_schemas import JobState, JobStatus, Usage
    from queue_schemas.redis_records import read_state, write_state

    names = Names("p.")
    pipe = _RecordingPipe()
    write_state(pipe, names, JobState(job_id="j", tenant="b", status=JobStatus.FAILED), 60)
    (_, (key,), _), _ = pipe.commands
    assert key == "p.job:b:j"

    full = JobState(
        job_id="j", tenant="acme", status=JobStatus.COMPLETED, usage=Usage(prompt_tokens=3)
    )
    pipe = _RecordingPipe()
    write_state(pipe, names, full, 60)
    items = pipe.commands[0][2]["items"]  # HSET's flat name, value, ... list
    stored = {k.encode(): v.encode() for k, v in zip(items[::2], items[1::2], strict=True)}
    assert read_state(stored) == full
    assert read_state({}) is None


def test_events_go_live_and_to_the_capped_stream() -> None:
    from queue_schemas import TokenEvent
    from queue_schemas.redis_records import EVENT_FIELD, append_event, read_event

    pipe = _RecordingPipe()
    first = TokenEvent(job_id="j", token_index=0, text="a", token_ids=[7])
    later = TokenEvent(job_id="j", token_index=4, text="b", token_ids=[8])
    append_event(pipe, Names("p."), "acme", first, maxlen=100, ttl_s=60)
    append_event(pipe, Names("p."), "acme", later, maxlen=100, ttl_s=60)
    (publish, (channel, payload), _), (xadd, (stream, fields), options), *rest = pipe.commands
    assert (publish, channel, xadd, stream) == (
        "publish",
        "p.job:acme:j:live",
        "xadd",
        "p.job:acme:j:events",
    )
    assert options["maxlen"] == 100
    assert read_event(fields[EVENT_FIELD]) == read_event(payload) == first
    # The event that opens an attempt gives the new stream its lifetime; later ones do not.
    assert [(name, args) for name, args, _ in rest] == [
        ("expire", ("p.job:acme:j:events", 60)),
        ("publish", ("p.job:acme:j:live", later.model_dump_json(exclude_none=True))),
        ("xadd", ("p.job:acme:j:events", {EVENT_FIELD: later.model_dump_json(exclude_none=True)})),
    ]
