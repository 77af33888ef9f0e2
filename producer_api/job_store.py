"""The API's side of Redis: a job's state, its events (history then live), cancellation.

Tenancy is enforced here: a job whose hash names another tenant is reported
as not found, exactly like a job that does not exist.
"""

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from redis.asyncio import Redis

from producer_api.errors import ApiError
from producer_api.fanout import LiveFanout
from queue_schemas import CancelJob, JobRequest, JobResult, JobState, JobStatus, TokenEvent
from queue_schemas.fleet_settings import FleetSettings
from queue_schemas.redis_records import (
    EVENT_FIELD,
    JobEvent,
    append_event,
    final_state,
    read_event,
    read_state,
    write_state,
)

# A live channel silent this long: look at the stream again (pub/sub is at most once).
RECHECK_S = 2.0


def now() -> datetime:
    return datetime.now(UTC)


class EventCursor:
    """What a reader has seen: token events are new when their index is past the last one."""

    def __init__(self, last_index: int = -1) -> None:
        self.last_index = last_index
        self.stream_id = "-"

    def is_new(self, event: JobEvent) -> bool:
        if isinstance(event, JobResult):
            return True
        if event.token_index <= self.last_index:
            return False
        self.last_index = event.token_index
        return True


class JobStore:
    def __init__(self, redis: Redis, fanout: LiveFanout, settings: FleetSettings) -> None:
        self.redis = redis
        self.fanout = fanout
        self.names = settings.names
        self.settings = settings

    async def record_queued(self, jobs: list[JobRequest]) -> None:
        """State ``queued`` (the limits reserved the jobs' places), before Kafka."""
        pipe = self.redis.pipeline(transaction=True)
        for job in jobs:
            state = JobState(
                job_id=job.job_id, tenant=job.tenant, status=JobStatus.QUEUED, updated_at=now()
            )
            write_state(pipe, self.names, state, self.settings.result_ttl_s)
        await pipe.execute()

    async def forget(self, jobs: list[JobRequest]) -> None:
        """Jobs Kafka did not take: no state, and a cancel mark in case a record arrives late."""
        pipe = self.redis.pipeline(transaction=True)
        for job in jobs:
            pipe.delete(self.names.job_key(job.job_id))
            pipe.zrem(self.names.tenant_jobs_key(job.tenant), job.job_id)
            pipe.set(self.names.cancel_key(job.job_id), 1, ex=self.settings.result_ttl_s)
        await pipe.execute()

    async def exists(self, job_id: str) -> bool:
        return bool(await self.redis.exists(self.names.job_key(job_id)))

    async def state(self, job_id: str, tenant: str) -> JobState:
        state = read_state(await self.redis.hgetall(self.names.job_key(job_id)))
        if state is None or state.tenant != tenant:
            raise ApiError(404, f"no job {job_id!r}", code="job_not_found")
        return state

    async def history(self, job_id: str, cursor: EventCursor) -> list[JobEvent]:
        """Stream entries after the cursor's stream id that are new to it."""
        start = "-" if cursor.stream_id == "-" else f"({cursor.stream_id}"
        entries = await self.redis.xrange(self.names.events_stream(job_id), start, "+")
        events = []
        for stream_id, fields in entries:
            cursor.stream_id = stream_id.decode()
            event = read_event(fields[EVENT_FIELD.encode()])
            if cursor.is_new(event):
                events.append(event)
        return events

    async def text_so_far(self, job_id: str) -> str:
        events = await self.history(job_id, EventCursor())
        return "".join(event.text for event in events if isinstance(event, TokenEvent))

    async def events(self, job_id: str, after: int = -1) -> AsyncIterator[JobEvent]:
        """Every event of the job with a token index past ``after``, in order, ending with
        its result: the stored history first, then live ones, with no gap and no repeat.

        Raises ``SlowReader`` when the caller falls a whole buffer behind.
        """
        cursor = EventCursor(after)
        # Subscribed (and confirmed) before reading the history: nothing falls in between.
        async with self.fanout.listen(self.names.events_channel(job_id)) as live:
            while True:
                for event in await self.history(job_id, cursor):
                    yield event
                    if isinstance(event, JobResult):
                        return
                try:
                    while True:
                        event = read_event(await asyncio.wait_for(live.get(), RECHECK_S))
                        if cursor.is_new(event):
                            yield event
                            if isinstance(event, JobResult):
                                return
                except TimeoutError:
                    continue

    async def cancel(self, job_id: str, tenant: str) -> tuple[JobState, JobResult | None]:
        """Mark the job cancelled and tell the workers. A job no worker has started is
        finished here; the result is returned so that it can go to the results topic too."""
        state = await self.state(job_id, tenant)
        if state.status.is_final:
            raise ApiError(
                409, f"job {job_id!r} is already {state.status.value}", code="job_finished"
            )
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.names.cancel_key(job_id), 1, ex=self.settings.result_ttl_s)
        pipe.publish(self.names.control_channel, CancelJob(cancel=job_id).model_dump_json())
        result = None
        if state.status is JobStatus.QUEUED:
            result = JobResult(
                job_id=job_id,
                tenant=tenant,
                status=JobStatus.CANCELLED,
                finish_reason="abort",
                finished_at=now(),
            )
            ttl = self.settings.result_ttl_s
            append_event(pipe, self.names, result, self.settings.event_stream_maxlen, ttl)
            state = final_state(result, now())
            write_state(pipe, self.names, state, ttl)
        await pipe.execute()
        return state, result
