"""The API's side of Redis: a job's state, its events (history then live), cancellation.

Tenancy is enforced by the key layout: every job lives under its tenant's
name (``Names.job_key``), so a tenant can neither see nor shadow another's
job, even one with the same id.

An event stream outlives a Redis outage: reads are retried until Redis answers
again. A stream whose job's state is gone for good (Redis restarted without
its data and no worker rewrote it) ends with a ``failed`` result that says so.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from producer_api.errors import ApiError
from producer_api.services.fanout import LiveFanout
from queue_schemas import CancelJob, JobRequest, JobResult, JobState, JobStatus, TokenEvent
from queue_schemas.fleet_settings import FleetSettings
from queue_schemas.messages import now
from queue_schemas.redis_records import (
    EVENT_FIELD,
    FINISH_SCRIPT,
    EventCursor,
    JobEvent,
    as_text,
    finish_call,
    mark_sent,
    read_event,
    read_state,
    write_state,
)

log = logging.getLogger("genfleet.api")
# A live channel silent this long: look at the stream again (pub/sub is at most once).
RECHECK_S = 2.0
# A streamed job whose state stays missing this long was lost with Redis's data.
LOST_AFTER_S = 30.0
OUTAGE_RETRY_S = 1.0


class JobStore:
    def __init__(self, redis: Redis, fanout: LiveFanout, settings: FleetSettings) -> None:
        self.redis = redis
        self.fanout = fanout
        self.names = settings.names
        self.settings = settings
        self._finish = redis.register_script(FINISH_SCRIPT)

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
            pipe.delete(self.names.job_key(job.tenant, job.job_id))
            pipe.zrem(self.names.tenant_jobs_key(job.tenant), job.job_id)
            cancel_key = self.names.cancel_key(job.tenant, job.job_id)
            pipe.set(cancel_key, 1, ex=self.settings.result_ttl_s)
        await pipe.execute()

    async def exists(self, tenant: str, job_id: str) -> bool:
        return bool(await self.redis.exists(self.names.job_key(tenant, job_id)))

    async def state(self, job_id: str, tenant: str) -> JobState:
        state = read_state(await self.redis.hgetall(self.names.job_key(tenant, job_id)))
        if state is None:
            raise ApiError(404, f"no job {job_id!r}", code="job_not_found")
        return state

    async def history(self, tenant: str, job_id: str, cursor: EventCursor) -> list[JobEvent]:
        """Stream entries after the cursor's stream id that are new to it."""
        start = "-" if cursor.stream_id == "-" else f"({cursor.stream_id}"
        entries = await self.redis.xrange(self.names.events_stream(tenant, job_id), start, "+")
        events = []
        for stream_id, fields in entries or []:
            assert stream_id is not None and fields is not None  # XRANGE entries have both
            cursor.stream_id = as_text(stream_id)
            event = read_event(fields[EVENT_FIELD.encode()])
            if cursor.is_new(event):
                events.append(event)
        return events

    async def text_so_far(self, tenant: str, job_id: str) -> str:
        events = await self.history(tenant, job_id, EventCursor())
        return "".join(event.text for event in events if isinstance(event, TokenEvent))

    async def events(self, tenant: str, job_id: str, after: int = -1) -> AsyncIterator[JobEvent]:
        """Every event of the job with a token index past ``after``, in order, ending with
        its result: the stored history first, then live ones, with no gap and no repeat.

        Raises ``SlowReader`` when the caller falls a whole buffer behind.
        """
        cursor = EventCursor(after)
        missing_since: float | None = None
        while True:
            try:
                # Subscribed (and confirmed) before reading the history: nothing falls
                # in between.
                async with self.fanout.listen(self.names.events_channel(tenant, job_id)) as live:
                    while True:
                        for event in await self.history(tenant, job_id, cursor):
                            yield event
                            if isinstance(event, JobResult):
                                return
                        try:
                            while True:
                                async with asyncio.timeout(RECHECK_S):  # no task per token
                                    payload = await live.get()
                                event = read_event(payload)
                                if cursor.is_new(event):
                                    yield event
                                    if isinstance(event, JobResult):
                                        return
                        except TimeoutError:
                            pass
                        if await self.exists(tenant, job_id):
                            missing_since = None
                            continue
                        missing_since = missing_since or time.monotonic()
                        if time.monotonic() - missing_since > LOST_AFTER_S:
                            yield _lost(tenant, job_id)
                            return
            except (RedisConnectionError, RedisTimeoutError) as error:
                log.warning("job %s stream: redis unavailable (%r); retrying", job_id, error)
                await asyncio.sleep(OUTAGE_RETRY_S)

    async def cancel(self, job_id: str, tenant: str) -> tuple[JobState, JobResult | None]:
        """Mark the job cancelled and tell the workers. A job no worker has started is
        finished here (claimed as ``redis_records`` says, so that no worker finishes it
        too); its result is returned to go to the results topic."""
        state = await self.state(job_id, tenant)
        if state.status.is_final:
            raise ApiError(
                409, f"job {job_id!r} is already {state.status.value}", code="job_finished"
            )
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.names.cancel_key(tenant, job_id), 1, ex=self.settings.result_ttl_s)
        cancel = CancelJob(cancel=job_id, tenant=tenant)
        pipe.publish(self.names.control_channel, cancel.model_dump_json())
        await pipe.execute()
        if state.status is not JobStatus.QUEUED:
            return state, None
        result = JobResult(
            job_id=job_id,
            tenant=tenant,
            status=JobStatus.CANCELLED,
            finish_reason="abort",
            finished_at=now(),
        )
        keys, args = finish_call(
            self.names, result, self.settings.event_stream_maxlen, self.settings.result_ttl_s,
            time.time(), claimant=f"api-cancel-{job_id}",
        )  # fmt: skip
        claimed = await self._finish(keys=keys, args=args)
        return await self.state(job_id, tenant), result if claimed else None

    async def result_sent(self, tenant: str, job_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        mark_sent(pipe, self.names, tenant, job_id)
        await pipe.execute()


def _lost(tenant: str, job_id: str) -> JobResult:
    return JobResult(
        job_id=job_id,
        tenant=tenant,
        status=JobStatus.FAILED,
        finish_reason="error",
        error="the job's state was lost from Redis; its result, if any, is on the results topic",
        finished_at=now(),
    )
