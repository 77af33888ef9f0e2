"""``/v1/jobs``: submit, look up, stream and cancel asynchronous jobs."""

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Header, Response
from pydantic import BaseModel, ConfigDict
from sse_starlette import EventSourceResponse, ServerSentEvent

from producer_api.dependencies import FleetDep, TenantDep
from producer_api.errors import ApiError
from producer_api.fanout import SlowReader
from producer_api.fleet import new_id
from producer_api.streams import event_stream, merged_events
from queue_schemas import JobRequest, JobResult, JobState, JobStatus, Usage
from queue_schemas.bounds import JobId
from queue_schemas.messages import now

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


class JobSubmission(JobRequest):
    """A ``JobRequest`` as a client sends it: the tenant comes from the API key, and the
    id is made here unless the client names one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: JobId | None = None  # type: ignore[assignment]

    def to_job(self, tenant: str) -> JobRequest:
        fields = self.model_dump(exclude={"job_id", "tenant", "created_at", "schema_version"})
        return JobRequest(
            **fields, job_id=self.job_id or new_id("job"), tenant=tenant, created_at=now()
        )


class JobLinks(BaseModel):
    self: str
    events: str


class JobView(BaseModel):
    id: str
    status: JobStatus
    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    updated_at: datetime | None = None
    links: JobLinks

    @classmethod
    def of(cls, state: JobState, text: str | None = None) -> "JobView":
        return cls(
            id=state.job_id,
            status=state.status,
            text=state.text if text is None else text,
            finish_reason=state.finish_reason,
            usage=state.usage if state.status.is_final else None,
            error=state.error,
            updated_at=state.updated_at,
            links=JobLinks(
                self=f"/v1/jobs/{state.job_id}", events=f"/v1/jobs/{state.job_id}/events"
            ),
        )


@router.post("", status_code=202, response_model=JobView)
async def submit_job(
    submission: JobSubmission, response: Response, fleet: FleetDep, tenant: TenantDep
) -> JobView:
    job = submission.to_job(tenant.tenant)
    # Ids are the tenant's own (keys live under the tenant): only its own jobs clash.
    if submission.job_id is not None and await fleet.store.exists(job.tenant, job.job_id):
        raise ApiError(409, f"job id {job.job_id!r} is taken", param="job_id", code="job_exists")
    await fleet.submit(tenant, [job], route="/v1/jobs")
    response.headers["Location"] = f"/v1/jobs/{job.job_id}"
    return JobView.of(JobState(job_id=job.job_id, tenant=job.tenant, status=JobStatus.QUEUED))


@router.get("/{job_id}", response_model=JobView)
async def get_job(job_id: JobId, fleet: FleetDep, tenant: TenantDep) -> JobView:
    state = await fleet.store.state(job_id, tenant.tenant)
    if state.status.is_final:
        return JobView.of(state)
    return JobView.of(state, text=await fleet.store.text_so_far(tenant.tenant, job_id))


@router.delete("/{job_id}", status_code=202, response_model=JobView)
async def cancel_job(job_id: JobId, fleet: FleetDep, tenant: TenantDep) -> JobView:
    """Cancel: a queued job ends now; a running one when its worker aborts it (its
    stream then ends with a ``cancelled`` event)."""
    await fleet.cancel(tenant, job_id)
    return JobView.of(await fleet.store.state(job_id, tenant.tenant))


@router.get(
    "/{job_id}/events",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def job_events(
    job_id: JobId,
    fleet: FleetDep,
    tenant: TenantDep,
    last_event_id: Annotated[
        int | None, Header(ge=-1, description="resume after this token index")
    ] = None,
) -> EventSourceResponse:
    """``token`` events (``id`` = index of the event's last token), then one final event
    named after the job's status (``completed``, ``failed``, ``cancelled``) with the
    ``JobResult``. Reconnect with ``Last-Event-ID`` to get exactly the events after it."""
    await fleet.store.state(job_id, tenant.tenant)
    after = -1 if last_event_id is None else last_event_id

    async def events() -> AsyncIterator[ServerSentEvent]:
        last = after
        try:
            async for _, event in merged_events(fleet, tenant.tenant, [job_id], after):
                if isinstance(event, JobResult):
                    yield ServerSentEvent(
                        event.model_dump_json(), event=event.status.value, id=str(last + 1)
                    )
                else:
                    last = event.last_index
                    yield ServerSentEvent(
                        event.model_dump_json(exclude_none=True), event="token", id=str(last)
                    )
        except SlowReader:
            return  # the client resumes with Last-Event-ID

    return event_stream(fleet, events())
