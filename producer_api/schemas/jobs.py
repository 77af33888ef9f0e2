"""``/v1/jobs`` bodies: what a client submits, and how a job looks to it."""

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from queue_schemas import JobRequest, JobState, JobStatus, SamplingOptions, Usage
from queue_schemas.bounds import JobId, ServedModelName
from queue_schemas.jobs import lowest_version
from queue_schemas.messages import now
from queue_schemas.tools import ToolCall
from queue_schemas.versioning import TOOLS_VERSION


class JobSubmission(JobRequest):
    """A ``JobRequest`` as a client sends it: the tenant comes from the API key, the id
    from the route unless the client names one, and the version from what the job
    means (``to_job``); ``timeout_s`` becomes part of its ``deadline``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Not a wire record: every field this API knows may be sent, whatever the version.
    schema_version: int = TOOLS_VERSION
    job_id: JobId | None = None  # type: ignore[assignment]
    model: ServedModelName | None = Field(
        default=None, description="the served model (see /v1/models); the fleet's default if unset"
    )

    def to_job(self, tenant: str, job_id: str, deadline: datetime | None) -> JobRequest:
        """The job to produce; ``deadline`` is the request's (``services.deadlines``)."""
        excluded = {
            "job_id", "tenant", "created_at", "schema_version", "deadline", "timeout_s", "model",
        }  # fmt: skip
        return JobRequest(
            **self.model_dump(exclude=excluded),
            schema_version=lowest_version(self.sampling, self.tools, self.messages),
            job_id=job_id,
            tenant=tenant,
            deadline=deadline,
            created_at=now(),
        )


class JobLinks(BaseModel):
    self: str
    events: str


class JobView(BaseModel):
    id: str
    status: JobStatus
    text: str = ""
    # What the text was read as (a job with tools, a worker with a reasoning parser).
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    sampling: SamplingOptions | None = None
    updated_at: datetime | None = None
    links: JobLinks

    @classmethod
    def of(cls, state: JobState, text: str | None = None) -> "JobView":
        return cls(
            id=state.job_id,
            status=state.status,
            text=state.text if text is None else text,
            content=state.content,
            reasoning=state.reasoning,
            tool_calls=state.tool_calls,
            finish_reason=state.finish_reason,
            usage=state.usage if state.status.is_final else None,
            error=state.error,
            sampling=state.sampling,
            updated_at=state.updated_at,
            links=JobLinks(
                self=f"/v1/jobs/{state.job_id}", events=f"/v1/jobs/{state.job_id}/events"
            ),
        )
