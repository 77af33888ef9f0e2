"""From a Kafka record to an engine request, or to the reason it cannot be one.

Nothing a producer can put in a record raises here: a null value (a
tombstone), an empty or oversized one, bytes that are not UTF-8 or not JSON,
a document that fails the schema. Each is a ``Rejected`` with its reason, and
with the job it names where that can be read (from an oversized record's first
members), so that the job ends failed rather than never.
"""

import contextlib
import json
from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError

from queue_schemas import JobRequest
from queue_schemas.bounds import JobId, TenantName


@dataclass
class Rejected:
    reason: str
    # A few words for the dead-letter counter's label: "unreadable", "too_large",
    # "invalid" (fails the schema) or "refused" (valid, but cannot be served).
    kind: str
    job_id: str | None = None
    tenant: str = "default"


UNREADABLE, INVALID, REFUSED, TOO_LARGE = "unreadable", "invalid", "refused", "too_large"
# How much of an oversized record is read for the job it names (its first members:
# a JobRequest as genfleet writes it starts with job_id and tenant).
OWNER_SCAN_BYTES = 64 * 1024
_JOB_ID = TypeAdapter(JobId)
_TENANT = TypeAdapter(TenantName)


def _readable_owner(document: object) -> tuple[str, str] | None:
    """The record's (job id, tenant) when both are valid, so the job can fail visibly."""
    if not isinstance(document, dict):
        return None
    try:
        return (
            _JOB_ID.validate_python(document.get("job_id")),
            _TENANT.validate_python(document.get("tenant", "default")),
        )
    except ValidationError:
        return None


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _owner_in_prefix(prefix: bytes) -> tuple[str, str] | None:
    """The (job id, tenant) that the top-level members at the start of a JSON object
    name, read up to the first member the prefix cuts (tenant: ``default`` unless named
    before that); None without a valid job id there."""
    try:
        text = prefix.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(prefix) - 3:
            return None  # not UTF-8, short of a character the cut split
        text = prefix[: error.start].decode("utf-8")
    decoder = json.JSONDecoder()
    members: dict[str, object] = {}
    i = _skip_space(text, 0)
    if not text.startswith("{", i):
        return None
    i += 1
    with contextlib.suppress(ValueError, IndexError):  # the cut, or not JSON: stop there
        while True:
            i = _skip_space(text, i)
            if not text.startswith('"', i):
                break
            key, i = decoder.raw_decode(text, i)
            i = _skip_space(text, i)
            if not text.startswith(":", i):
                break
            value, i = decoder.raw_decode(text, _skip_space(text, i + 1))
            members[str(key)] = value
            i = _skip_space(text, i)
            if not text.startswith(",", i):
                break
            i += 1
    return _readable_owner(members) if "job_id" in members else None


def parse_job(raw: bytes | None, max_bytes: int) -> JobRequest | Rejected:
    """Validate a record's value; every failure names what is wrong with it."""
    if raw is None:
        return Rejected(
            "null value (a tombstone): a job record must carry a JobRequest", UNREADABLE
        )
    if not raw:
        return Rejected("empty value: a job record must carry a JobRequest", UNREADABLE)
    if len(raw) > max_bytes:
        reason = f"record of {len(raw)} bytes is larger than the limit of {max_bytes}"
        owner = _owner_in_prefix(raw[:OWNER_SCAN_BYTES])
        return Rejected(reason, TOO_LARGE, *(owner or ()))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return Rejected(f"invalid UTF-8: {error}", UNREADABLE)
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        return Rejected(f"not JSON: {error}", UNREADABLE)
    try:
        return JobRequest.model_validate(document)
    except (ValidationError, RecursionError) as error:
        problems = (
            "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}"
                for e in error.errors()[:10]
            )
            if isinstance(error, ValidationError)
            else "nested too deeply"
        )
        owner = _readable_owner(document)
        if owner is None:
            return Rejected(f"invalid job: {problems}", INVALID)
        return Rejected(f"invalid job: {problems}", INVALID, *owner)
