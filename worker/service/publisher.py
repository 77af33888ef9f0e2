"""Tokens out through Redis: one pipeline per engine step.

Each delta becomes a ``TokenEvent``, a finished job a ``JobResult``; both are
PUBLISHed on the job's live channel and XADDed to its capped event stream (for
replay), and a result also becomes the job's final state in its hash. The
layout is ``queue_schemas.redis_records``'s; every key gets the configured TTL.
"""

from datetime import UTC, datetime

from redis.asyncio import Redis

from queue_schemas import JobResult, JobState, JobStatus, Names, TokenEvent
from queue_schemas.redis_records import append_event, final_state, write_state


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
            append_event(pipe, self.names, message, self.maxlen, self.ttl_s)
        for result in results:
            write_state(pipe, self.names, final_state(result, now()), self.ttl_s)
        await pipe.execute()

    async def set_state(self, state: JobState) -> None:
        pipe = self.redis.pipeline(transaction=False)
        write_state(pipe, self.names, state, self.ttl_s)
        await pipe.execute()

    async def is_final_or_cancelled(self, job_id: str) -> bool:
        """Whether a (redelivered) job needs no work: final already, or cancelled."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.names.job_key(job_id), "status")
        pipe.exists(self.names.cancel_key(job_id))
        status, cancelled = await pipe.execute()
        final = status is not None and JobStatus(status.decode()).is_final
        return final or bool(cancelled)
