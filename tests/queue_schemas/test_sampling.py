"""Sampling options: an unset field stays unset on every path and takes the model's
default only where the record's version says so."""

import json

import pytest
from pydantic import ValidationError

from queue_schemas import JobRequest, JobResult, JobStatus, SamplingOptions
from queue_schemas.jobs import lowest_version
from queue_schemas.sampling import MODEL_DEFAULTED

MODEL = SamplingOptions(temperature=0.2, top_p=0.9, max_tokens=64)


def test_unset_fields_stay_out_of_every_dump_and_come_back_unset() -> None:
    options = SamplingOptions(temperature=0.7, seed=3)
    assert set(options.unset) == set(MODEL_DEFAULTED) - {"temperature"}
    dumped = json.loads(options.model_dump_json())
    assert "top_p" not in dumped and "max_tokens" not in dumped and dumped["temperature"] == 0.7
    job = JobRequest(job_id="a", prompt="x", sampling=options, schema_version=3)
    again = JobRequest.model_validate_json(job.model_dump_json(exclude_none=True))
    assert again.sampling.unset == options.unset
    assert again.sampling.temperature == 0.7


def test_null_means_unset_and_out_of_bounds_is_refused() -> None:
    options = SamplingOptions.model_validate({"temperature": None, "max_tokens": None})
    assert set(options.unset) == set(MODEL_DEFAULTED)
    with pytest.raises(ValidationError, match="temperature"):
        SamplingOptions(temperature=2.5)
    with pytest.raises(ValidationError, match="temperature"):  # null, yes; not a number, no
        SamplingOptions.model_validate({"seed": None, "top_k": None, "temperature": "hot"})


def test_defaults_fill_only_what_the_request_left_unset() -> None:
    resolved = SamplingOptions(temperature=0.0, top_k=5).with_defaults(MODEL)
    assert (resolved.temperature, resolved.top_k) == (0.0, 5)  # explicit values win
    assert (resolved.top_p, resolved.max_tokens) == (0.9, 64)  # the model's
    assert (resolved.min_p, resolved.repetition_penalty) == (0.0, 1.0)  # neutral
    assert resolved.unset == ()
    assert json.loads(resolved.model_dump_json())["min_p"] == 0.0  # applied values show


def test_a_default_max_tokens_below_an_explicit_min_tokens_is_raised_to_it() -> None:
    assert SamplingOptions(min_tokens=100).with_defaults(MODEL).max_tokens == 100


def test_without_model_defaults_unset_fields_are_the_neutral_values() -> None:
    neutral = SamplingOptions().with_defaults()
    assert (neutral.temperature, neutral.top_p, neutral.top_k, neutral.max_tokens) == (
        1.0,
        1.0,
        0,
        None,
    )


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_record_keeps_its_meaning_whatever_the_model_says(version: int) -> None:
    raw = {"job_id": "a", "prompt": "x", "schema_version": version, "sampling": {"top_k": 3}}
    requested = JobRequest.model_validate(raw).requested_sampling()
    assert requested.unset == ()  # nothing left for the model's defaults
    resolved = requested.with_defaults(MODEL)
    assert (resolved.temperature, resolved.top_p, resolved.max_tokens) == (1.0, 1.0, None)


def test_a_version_3_record_leaves_unset_fields_to_the_model() -> None:
    raw = {"job_id": "a", "prompt": "x", "schema_version": 3, "sampling": {"top_k": 3}}
    resolved = JobRequest.model_validate(raw).requested_sampling().with_defaults(MODEL)
    assert (resolved.temperature, resolved.top_p, resolved.max_tokens) == (0.2, 0.9, 64)
    assert resolved.top_k == 3


def test_a_record_without_a_version_is_version_1_whatever_it_leaves_unset() -> None:
    assert JobRequest.model_validate({"job_id": "a", "prompt": "x"}).schema_version == 1


def test_writers_choose_the_lowest_version_that_carries_the_meaning() -> None:
    every = dict.fromkeys(MODEL_DEFAULTED[:-1], 1.0) | {"top_k": 0, "max_tokens": 4}
    assert lowest_version(SamplingOptions(**every)) == 1
    assert lowest_version(SamplingOptions(**every, structured_outputs={"regex": "a"})) == 2
    assert lowest_version(SamplingOptions(**{**every, "max_tokens": None})) == 3


def test_timeout_needs_version_3_and_deadlines_without_a_zone_are_utc() -> None:
    with pytest.raises(ValidationError, match="timeout_s needs schema_version 3"):
        JobRequest.model_validate({"job_id": "a", "prompt": "x", "timeout_s": 5})
    job = JobRequest.model_validate(
        {"job_id": "a", "prompt": "x", "deadline": "2030-01-01T00:00:00"}
    )
    assert job.deadline is not None and job.deadline.utcoffset() is not None


@pytest.mark.parametrize("timeout", [0, -1, 1e12, "soon"])
def test_a_timeout_out_of_bounds_is_refused(timeout: object) -> None:
    with pytest.raises(ValidationError, match="timeout_s"):
        JobRequest.model_validate(
            {"job_id": "a", "prompt": "x", "schema_version": 3, "timeout_s": timeout}
        )


def test_a_job_expires_at_its_earliest_end() -> None:
    from datetime import UTC, datetime, timedelta

    created = datetime(2030, 1, 1, tzinfo=UTC)
    produced = created + timedelta(seconds=3)
    job = JobRequest(job_id="a", prompt="x", schema_version=3, timeout_s=10, created_at=created)
    assert job.expires_at(produced) == created + timedelta(seconds=10)
    untimed = job.model_copy(update={"created_at": None})
    assert untimed.expires_at(produced) == produced + timedelta(seconds=10)
    early = job.model_copy(update={"deadline": created + timedelta(seconds=1)})
    assert early.expires_at(produced) == created + timedelta(seconds=1)
    assert JobRequest(job_id="a", prompt="x").expires_at(produced) is None
    far = JobRequest(
        job_id="a", prompt="x", schema_version=3, timeout_s=3e7,
        created_at=datetime(9999, 12, 31, tzinfo=UTC),
    )  # fmt: skip
    assert far.expires_at(produced) is None  # past year 9999: never


def test_an_expired_result_round_trips_with_what_was_applied() -> None:
    applied = SamplingOptions(temperature=0.2).with_defaults(MODEL)
    result = JobResult(job_id="a", status=JobStatus.EXPIRED, schema_version=3, sampling=applied)
    again = JobResult.model_validate_json(result.model_dump_json())
    assert again.status is JobStatus.EXPIRED and again.status.is_final
    assert again.sampling == applied
