"""How messages lie in Redis: the job hash, the event stream and the live channel.

Both sides write here (the worker its events and results, the API a job's
``queued`` state and the result of a job cancelled before any worker took it)
and the API reads here, so the layout is written once. The functions take a
redis-py pipeline (sync or asyncio: only commands are queued on it).

A job's result goes out in three moves, so the results topic gets exactly one
``JobResult`` per job whoever dies when:

1. ``FINISH_SCRIPT`` claims the job: if its hash is not final yet, it writes the
   final state, the result itself and ``result_sent=0`` and appends the final
   event, atomically; a second finisher (a redelivered copy) gets 0 and sends
   nothing.
2. The claimant produces the result to the results topic.
3. ``result_sent=1``. A redelivered record of a job that is final but not sent
   belongs to a claimant that died between 1 and 3: the result is on the topic
   or not, and the reader of the record finds out before sending it again.
"""

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from queue_schemas.messages import JobResult, JobState, JobStatus, TokenEvent
from queue_schemas.names import Names

if TYPE_CHECKING:
    from redis.asyncio.client import Pipeline

JobEvent = TokenEvent | JobResult
_EVENT = TypeAdapter(JobEvent)
EVENT_FIELD = "event"
RESULT_FIELD = "result"
RESULT_SENT_FIELD = "result_sent"
CLAIMED_AT_FIELD = "result_claimed_at"
CLAIMANT_FIELD = "result_claimant"
FINAL_STATUSES = ",".join(status.value for status in JobStatus if status.is_final)
# The job hash's fields that hold a model, as its JSON.
NESTED_FIELDS = ("usage", "sampling", "tool_calls")

# Lua shared by the scripts below: whether a job status is one of ARGV[1]'s
# comma-separated final statuses.
_IS_FINAL = """
local function is_final(status)
  if not status then return false end
  for final in string.gmatch(ARGV[1], '[^,]+') do
    if final == status then return true end
  end
  return false
end
"""

# KEYS: job hash, event stream. ARGV: final statuses (comma-separated), ttl, stream
# maxlen, live channel, final event, claimant, then the hash's field/value pairs.
# A claimant that runs the script again (its reply was lost) gets its claim back.
FINISH_SCRIPT = (
    _IS_FINAL
    + """
local current = redis.call('HMGET', KEYS[1], 'status', 'result_claimant')
if current[2] == ARGV[6] then return 1 end
if is_final(current[1]) then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'event', ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"""
)

# KEYS: job hash. ARGV: final statuses, ttl, then the hash's field/value pairs.
# The state of a job a worker starts, unless the job became final meanwhile (the
# API cancelled it, another copy finished): then 0, and the worker leaves it.
START_SCRIPT = (
    _IS_FINAL
    + """
if is_final(redis.call('HGET', KEYS[1], 'status')) then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""
)


def as_text(value: bytes | str) -> str:
    """A field or key as redis-py returns it (bytes, or str with decode_responses)."""
    return value.decode() if isinstance(value, bytes) else value


def append_event(
    pipe: "Pipeline", names: Names, tenant: str, event: TokenEvent, maxlen: int, ttl_s: int
) -> None:
    """PUBLISH for live readers and XADD to the capped stream for replay.

    NOTE: the stream's lifetime is set by the event that opens an attempt at the job
    (token index 0: XADD has just made the stream) and by the job's result
    (``FINISH_SCRIPT``), not by every event: one command in three per token less,
    and a stream whose job never finishes still expires."""
    payload = event.model_dump_json(exclude_none=True)
    stream = names.events_stream(tenant, event.job_id)
    pipe.publish(names.events_channel(tenant, event.job_id), payload)
    pipe.xadd(stream, {EVENT_FIELD: payload}, maxlen=maxlen, approximate=True)
    if event.token_index == 0:
        pipe.expire(stream, ttl_s)


def _hash_fields(state: JobState) -> dict[str, str]:
    fields = state.model_dump(mode="json", exclude_unset=True, exclude_none=True)
    for name in NESTED_FIELDS:  # a hash holds strings: nested models as JSON
        if name in fields:
            fields[name] = json.dumps(fields[name])
    return {name: str(value) for name, value in fields.items()}


def _hash_pairs(state: JobState) -> list[str]:
    """The hash's fields as HSET's flat name, value, name, value... list."""
    return [item for pair in _hash_fields(state).items() for item in pair]


def write_state(pipe: "Pipeline", names: Names, state: JobState, ttl_s: int) -> None:
    """Write the fields the writer set."""
    key = names.job_key(state.tenant, state.job_id)
    pipe.hset(key, items=_hash_pairs(state))
    pipe.expire(key, ttl_s)


def start_call(names: Names, state: JobState, ttl_s: int) -> tuple[list[str], list[str]]:
    """``START_SCRIPT``'s keys and arguments for this (running) state."""
    pairs = _hash_pairs(state)
    return [names.job_key(state.tenant, state.job_id)], [FINAL_STATUSES, str(ttl_s), *pairs]


def final_state(result: JobResult, updated_at: datetime) -> JobState:
    return JobState(
        job_id=result.job_id,
        tenant=result.tenant,
        status=result.status,
        text=result.text,
        content=result.content,
        reasoning=result.reasoning,
        tool_calls=result.tool_calls,
        finish_reason=result.finish_reason,
        usage=result.usage,
        error=result.error,
        sampling=result.sampling,
        updated_at=updated_at,
        worker=result.worker,
    )


def finish_call(
    names: Names, result: JobResult, maxlen: int, ttl_s: int, claimed_at: float, claimant: str
) -> tuple[list[str], list[str]]:
    """``FINISH_SCRIPT``'s keys and arguments for this result; ``claimant`` names this
    attempt at the job uniquely."""
    fields = _hash_fields(final_state(result, datetime.fromtimestamp(claimed_at, UTC)))
    fields[RESULT_FIELD] = result.model_dump_json()
    fields[RESULT_SENT_FIELD] = "0"
    fields[CLAIMED_AT_FIELD] = f"{claimed_at:.3f}"
    fields[CLAIMANT_FIELD] = claimant
    keys = [
        names.job_key(result.tenant, result.job_id),
        names.events_stream(result.tenant, result.job_id),
    ]
    args = [
        FINAL_STATUSES,
        str(ttl_s),
        str(maxlen),
        names.events_channel(result.tenant, result.job_id),
        result.model_dump_json(exclude_none=True),
        claimant,
        *(item for pair in fields.items() for item in pair),
    ]
    return keys, args


def mark_sent(pipe: "Pipeline", names: Names, tenant: str, job_id: str) -> None:
    pipe.hset(names.job_key(tenant, job_id), mapping={RESULT_SENT_FIELD: "1"})


class Delivery(BaseModel):
    """What a reader of a job record needs to know about the job's past (``delivery``)."""

    status: JobStatus | None = None
    cancelled: bool = False
    result_sent: bool = True
    claimed_at: float | None = None
    result: JobResult | None = None


DELIVERY_FIELDS = ("status", RESULT_SENT_FIELD, CLAIMED_AT_FIELD, RESULT_FIELD)


def delivery(values: list[bytes | None], cancelled: bool) -> Delivery:
    """From ``HMGET job-hash *DELIVERY_FIELDS`` and whether the cancel mark exists."""
    status, sent, claimed_at, result = values
    try:
        parsed = JobResult.model_validate_json(result) if result else None
    except ValidationError:
        parsed = None
    return Delivery(
        status=JobStatus(status.decode()) if status else None,
        cancelled=cancelled,
        # A final job written without the protocol (or before it) counts as sent.
        result_sent=sent != b"0",
        claimed_at=float(claimed_at) if claimed_at else None,
        result=parsed,
    )


def read_state(fields: Mapping[bytes | str, bytes | str]) -> JobState | None:
    """A job hash as ``HGETALL`` returns it; None when the job is unknown."""
    document: dict[str, Any] = {as_text(key): as_text(value) for key, value in fields.items()}
    if "status" not in document or "job_id" not in document:
        return None
    for name in NESTED_FIELDS:
        if name in document:
            document[name] = json.loads(document[name])
    return JobState.model_validate(document)


def read_event(payload: bytes | str) -> JobEvent:
    return _EVENT.validate_json(payload)


class EventCursor:
    """What a reader has seen: token events are new when their index is past the last one."""

    def __init__(self, last_index: int = -1) -> None:
        self.last_index = last_index
        self.stream_id = "-"

    def is_new(self, event: JobEvent) -> bool:
        if isinstance(event, JobResult):
            return True
        if event.last_index <= self.last_index:
            return False
        self.last_index = event.last_index
        return True


def streamed_output(entries: list) -> list[TokenEvent]:
    """The token events a reader of a job's stream (XRANGE ``entries``) keeps, in
    order, up to the first that does not follow on from the one before: what every
    reader holds of the job's output (a taken-over job resumes from them)."""
    last_index, kept = -1, []
    for _, fields in entries:
        event = read_event(fields.get(EVENT_FIELD.encode(), fields.get(EVENT_FIELD)))
        if not isinstance(event, TokenEvent) or event.last_index <= last_index:
            continue  # a result, or tokens readers have already
        if event.token_index != last_index + 1:
            break
        last_index = event.last_index
        kept.append(event)
    return kept
