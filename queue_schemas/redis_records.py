"""How messages lie in Redis: the job hash, the event stream and the live channel.

Both sides write here (the worker its events and results, the API a job's
``queued`` state and the result of a job cancelled before any worker took it)
and the API reads here, so the layout is written once. The functions take a
redis-py pipeline (sync or asyncio: only commands are queued on it).
"""

from datetime import datetime
from typing import Any, Protocol

from pydantic import TypeAdapter

from queue_schemas.messages import JobResult, JobState, TokenEvent, Usage
from queue_schemas.names import Names

JobEvent = TokenEvent | JobResult
_EVENT = TypeAdapter(JobEvent)
EVENT_FIELD = "event"


class CommandQueue(Protocol):
    def publish(self, channel: str, message: str) -> Any: ...
    def xadd(self, name: str, fields: dict, maxlen: int, approximate: bool) -> Any: ...
    def expire(self, name: str, seconds: int) -> Any: ...
    def hset(self, name: str, mapping: dict) -> Any: ...


def append_event(
    pipe: CommandQueue, names: Names, event: JobEvent, maxlen: int, ttl_s: int
) -> None:
    """PUBLISH for live readers and XADD to the capped stream for replay."""
    payload = event.model_dump_json(exclude_none=True)
    stream = names.events_stream(event.job_id)
    pipe.publish(names.events_channel(event.job_id), payload)
    pipe.xadd(stream, {EVENT_FIELD: payload}, maxlen=maxlen, approximate=True)
    pipe.expire(stream, ttl_s)


def write_state(pipe: CommandQueue, names: Names, state: JobState, ttl_s: int) -> None:
    """Write the fields the writer set: a worker that does not know the tenant keeps it."""
    key = names.job_key(state.job_id)
    fields = state.model_dump(mode="json", exclude_unset=True, exclude_none=True)
    if "usage" in fields:
        fields["usage"] = state.usage.model_dump_json()
    pipe.hset(key, mapping={name: str(value) for name, value in fields.items()})
    pipe.expire(key, ttl_s)


def final_state(result: JobResult, updated_at: datetime) -> JobState:
    """The hash of a finished job; the tenant only when the result names one."""
    known = {"tenant": result.tenant} if "tenant" in result.model_fields_set else {}
    return JobState(
        job_id=result.job_id,
        status=result.status,
        text=result.text,
        finish_reason=result.finish_reason,
        usage=result.usage,
        error=result.error,
        updated_at=updated_at,
        **known,
    )


def read_state(fields: dict[bytes, bytes]) -> JobState | None:
    """A job hash as ``HGETALL`` returns it; None when the job is unknown."""
    if not fields:
        return None
    document: dict[str, Any] = {key.decode(): value.decode() for key, value in fields.items()}
    if "usage" in document:
        document["usage"] = Usage.model_validate_json(document["usage"])
    return JobState.model_validate(document)


def read_event(payload: bytes | str) -> JobEvent:
    return _EVENT.validate_json(payload)
