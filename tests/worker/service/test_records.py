"""What an oversized record names: the job of its first top-level members, so that
job ends failed; nothing else (a nested id, an id after the cut, bytes that are not
UTF-8), and never an exception, whatever the bytes."""

import json

from hypothesis import given
from hypothesis import strategies as st

from worker.service.records import OWNER_SCAN_BYTES, TOO_LARGE, parse_job


def _oversized(document: dict) -> bytes:
    return json.dumps(document, ensure_ascii=False).encode()


def test_the_job_an_oversized_record_names_first_is_the_one_that_fails() -> None:
    record = _oversized({"job_id": "j-1", "tenant": "acme", "prompt": "x" * 500})
    rejected = parse_job(record, max_bytes=100)
    assert rejected.kind == TOO_LARGE and "larger than the limit of 100" in rejected.reason
    assert (rejected.job_id, rejected.tenant) == ("j-1", "acme")
    # schema_version first, no tenant before the cut: the default tenant.
    versioned = parse_job(
        _oversized({"schema_version": 1, "job_id": "j-2", "prompt": "x" * 500}), 100
    )
    assert (versioned.job_id, versioned.tenant) == ("j-2", "default")


def test_no_job_is_named_from_what_cannot_be_read_as_its_first_members() -> None:
    cases = [
        {"prompt": "x" * OWNER_SCAN_BYTES, "job_id": "after-the-cut"},
        {"nested": {"job_id": "victim"}, "prompt": "x" * 500},
        {"job_id": "not a valid id!", "prompt": "x" * 500},
        {"job_id": 5, "prompt": "x" * 500},
    ]
    for document in cases:
        assert parse_job(_oversized(document), 100).job_id is None, document
    assert (
        parse_job(b"\xff\xfe" + _oversized({"job_id": "j", "prompt": "x" * 500}), 100).job_id
        is None
    )
    # A character the scan's cut splits is not a reason to lose the job.
    cut = _oversized({"job_id": "j-3", "prompt": "é" * OWNER_SCAN_BYTES})
    assert parse_job(cut, 100).job_id == "j-3"


@given(st.binary(min_size=101, max_size=600))
def test_any_oversized_bytes_are_rejected_without_raising(raw: bytes) -> None:
    rejected = parse_job(raw, max_bytes=100)
    assert rejected.kind == TOO_LARGE
