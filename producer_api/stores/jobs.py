"""The API's side of Redis: a job's state, its stored events, cancellation.

Tenancy is enforced by the key layout: every job lives under its tenant's
name (``Names.job_key``), so a tenant can neither see nor shadow another's
job, even one with the same id.
"""

import logging
import time

from redis.asyncio import Redis

from producer_api.errors import ApiError
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


class JobStore:
    def __init__(self, redis: Redis, settings: FleetSettings) -> None:
        self.redis = redis
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
        result = cancelled_result(job_id, tenant)
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


def cancelled_result(job_id: str, tenant: str) -> JobResult:
    """The result of a job cancelled before any worker took it."""
    return JobResult(
        job_id=job_id,
        tenant=tenant,
        status=JobStatus.CANCELLED,
        finish_reason="abort",
        finished_at=now(),
    )
