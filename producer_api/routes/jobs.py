"""``/v1/jobs``: submit, look up, stream and cancel asynchronous jobs."""

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from producer_api.dependencies import DeadlineDep, FleetDep, TenantDep
from producer_api.errors import ApiError
from producer_api.schemas.jobs import JobSubmission, JobView
from producer_api.services.fanout import SlowReader
from producer_api.services.fleet import new_id
from producer_api.services.streams import event_stream, merged_events
from queue_schemas import JobResult, JobState, JobStatus
from queue_schemas.bounds import JobId

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=202, response_model=JobView)
async def submit_job(
    submission: JobSubmission,
    response: Response,
    fleet: FleetDep,
    tenant: TenantDep,
    deadlines: DeadlineDep,
) -> JobView:
    """Queue a job; it never starts after its deadline, and stops when the deadline
    passes while it runs (state ``expired``; ``services.deadlines`` says how to set one)."""
    deadline = deadlines.deadline(
        submission.deadline, submission.timeout_s, fleet.settings.jobs_timeout_s
    )
    model = await fleet.models.resolve(submission.model)
    job = submission.to_job(tenant.tenant, submission.job_id or new_id("job"), deadline)
    # Ids are the tenant's own (keys live under the tenant): only its own jobs clash.
    if submission.job_id is not None and await fleet.store.exists(job.tenant, job.job_id):
        raise ApiError(409, f"job id {job.job_id!r} is taken", param="job_id", code="job_exists")
    await fleet.submit(tenant, [job], route="/v1/jobs", model=model)
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
    named after the job's status (``completed``, ``failed``, ``cancelled``, ``expired``)
    with the ``JobResult``. Reconnect with ``Last-Event-ID`` to get exactly the events after it."""
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
