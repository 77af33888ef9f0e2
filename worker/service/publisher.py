"""Tokens out through Redis: one pipeline per engine step.

Each delta becomes a ``TokenEvent``: PUBLISHed on the job's live channel and
XADDed to its capped event stream (for replay), numbered by token index. A
finished job's ``JobResult`` goes the same two ways and its final ``JobState``
into the job's hash; every key gets the configured TTL.
"""

from datetime import UTC, datetime

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from queue_schemas import JobResult, JobState, JobStatus, Names, TokenEvent


def now() -> datetime:
    return datetime.now(UTC)


class RedisPublisher:
    def __init__(self, redis: Redis, names: Names, maxlen: int, ttl_s: int) -> None:
        self.redis = redis
        self.names = names
        self.maxlen = maxlen
        self.ttl_s = ttl_s

    async def publish(self, events: list[TokenEvent], results: list[JobResult]) -> None:
        """Write one step's events and any final results in a single round trip."""
        if not events and not results:
            return
        pipe = self.redis.pipeline(transaction=False)
        for message in [*events, *results]:
            self._emit(pipe, message.job_id, message.model_dump_json())
        for result in results:
            state = JobState(
                job_id=result.job_id,
                tenant=result.tenant,
                status=result.status,
                text=result.text,
                finish_reason=result.finish_reason,
                usage=result.usage,
                error=result.error,
                updated_at=now(),
            )
            self._set_state(pipe, state)
        await pipe.execute()

    async def set_state(self, state: JobState) -> None:
        pipe = self.redis.pipeline(transaction=False)
        self._set_state(pipe, state)
        await pipe.execute()

    async def is_final_or_cancelled(self, job_id: str) -> bool:
        """Whether a (redelivered) job needs no work: final already, or cancelled."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.names.job_key(job_id), "status")
        pipe.exists(self.names.cancel_key(job_id))
        status, cancelled = await pipe.execute()
        final = status is not None and JobStatus(status.decode()).is_final
        return final or bool(cancelled)

    def _emit(self, pipe: Pipeline, job_id: str, payload: str) -> None:
        stream = self.names.events_stream(job_id)
        pipe.publish(self.names.events_channel(job_id), payload)
        pipe.xadd(stream, {"event": payload}, maxlen=self.maxlen, approximate=True)
        pipe.expire(stream, self.ttl_s)

    def _set_state(self, pipe: Pipeline, state: JobState) -> None:
        key = self.names.job_key(state.job_id)
        fields = state.model_dump(mode="json", exclude_none=True)
        fields["usage"] = state.usage.model_dump_json()
        pipe.hset(key, mapping={k: str(v) for k, v in fields.items()})
        pipe.expire(key, self.ttl_s)
