"""Structured-output constraints on the wire: one kind, a valid JSON Schema, version 2."""

import json

import pytest
from pydantic import ValidationError

from queue_schemas import JobRequest, StructuredOutputs
from queue_schemas.versioning import STRUCTURED_OUTPUTS_VERSION

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}


def _job(constraint: dict | None, **fields) -> dict:
    sampling = {} if constraint is None else {"structured_outputs": constraint}
    return {"job_id": "j", "prompt": "hi", "sampling": sampling, **fields}


@pytest.mark.parametrize(
    "constraint",
    [{"json": SCHEMA}, {"json": json.dumps(SCHEMA)}, {"json_object": True}, {"regex": r"\d+"},
     {"choice": ["yes", "no"]}, {"grammar": 'root ::= "a"'}],
)  # fmt: skip
def test_each_kind_round_trips_at_version_2(constraint) -> None:
    job = JobRequest.model_validate(_job(constraint))
    assert job.schema_version == STRUCTURED_OUTPUTS_VERSION
    wire = json.loads(job.model_dump_json())
    assert set(constraint) <= set(wire["sampling"]["structured_outputs"])  # "json", not an alias
    assert JobRequest.model_validate_json(job.model_dump_json()) == job


def test_a_job_without_a_constraint_stays_at_version_1_and_old_records_read() -> None:
    assert JobRequest.model_validate(_job(None)).schema_version == 1
    old = b'{"schema_version": 1, "job_id": "a", "prompt": "hi", "sampling": {"max_tokens": 3}}'
    assert JobRequest.model_validate_json(old).sampling.structured_outputs is None


def test_a_constraint_at_version_1_is_refused_naming_the_version() -> None:
    with pytest.raises(ValidationError, match="needs schema_version 2"):
        JobRequest.model_validate(_job({"regex": "a"}, schema_version=1))


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        ({"regex": "a", "choice": ["a"]}, "exactly one of .* got regex, choice"),
        ({}, "got none"),
        ({"json_object": False}, "got none"),
        ({"json": {"type": "nope"}}, "not a valid JSON Schema at type"),
        ({"json": {"properties": {"a": {"minimum": "x"}}}}, "at properties/a/minimum"),
        ({"json": "[1"}, "not JSON"),
        ({"json": "[1]"}, "must be an object"),
        ({"choice": []}, "at least 1 item"),
        ({"choice": [""]}, "at least 1 character"),
    ],
)
def test_what_can_be_checked_without_a_tokenizer_is_refused_by_name(constraint, message) -> None:
    with pytest.raises(ValidationError, match=message):
        StructuredOutputs.model_validate(constraint)


def test_a_deeply_nested_schema_is_refused_not_a_crash() -> None:
    schema: dict = {"type": "object"}
    for _ in range(5000):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(ValidationError, match="nested too deeply"):
        StructuredOutputs.model_validate({"json": schema})


def test_equal_constraints_share_a_digest_and_different_ones_do_not() -> None:
    as_text = StructuredOutputs(json=json.dumps(SCHEMA, indent=2))
    assert StructuredOutputs(json=SCHEMA).digest == as_text.digest
    # Property order is the output's order: another order is another constraint.
    two = {"type": "object", "properties": {"a": {}, "b": {}}}
    swapped = {"type": "object", "properties": {"b": {}, "a": {}}}
    assert StructuredOutputs(json=two).digest != StructuredOutputs(json=swapped).digest
    assert StructuredOutputs(regex="a").digest != StructuredOutputs(grammar="a").digest
    assert StructuredOutputs(choice=["a", "b"]).digest != StructuredOutputs(choice=["ab"]).digest
