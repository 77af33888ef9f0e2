"""What workers write back: token events, job state, results, dead letters."""

import base64
import enum
from datetime import datetime
from typing import Literal

from pydantic import Field

from queue_schemas.jobs import JobId
from queue_schemas.versioning import SCHEMA_VERSION, WireModel

FinishReason = Literal["stop", "length", "abort", "error"]


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


class Usage(WireModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TokenEvent(WireModel):
    """New tokens of one job. ``token_index`` numbers the first of them in the output,
    so a reader that sees a token index twice (a job regenerated after a crash) drops it."""

    kind: Literal["token"] = "token"
    job_id: JobId
    token_index: int = Field(ge=0)
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None = Field(
        default=None, description="per token: log-probability of it and of the top alternatives"
    )
    token_texts: dict[int, str] | None = Field(
        default=None, description="with logprobs: the text of every token id named above"
    )


class JobResult(WireModel):
    """The final outcome of a job: the results topic carries one per job id
    (a redelivered job may produce a duplicate with identical content)."""

    kind: Literal["result"] = "result"
    schema_version: int = SCHEMA_VERSION
    job_id: JobId
    tenant: str = "default"
    status: JobStatus
    text: str = ""
    token_ids: list[int] = Field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    usage: Usage = Usage()
    error: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    worker: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    first_token_at: datetime | None = None
    finished_at: datetime | None = None


class JobState(WireModel):
    """The job's Redis hash: what ``GET /v1/jobs/{id}`` reads."""

    job_id: JobId
    tenant: str = "default"
    status: JobStatus
    text: str = ""
    finish_reason: FinishReason | None = None
    usage: Usage = Usage()
    error: str | None = None
    updated_at: datetime | None = None


class CancelJob(WireModel):
    """On the control channel: every worker aborts this job if it is running it."""

    cancel: JobId


class DeadLetter(WireModel):
    """A record no worker could serve, kept byte for byte with the reason."""

    schema_version: int = SCHEMA_VERSION
    raw_base64: str
    topic: str
    partition: int
    offset: int
    reason: str
    job_id: str | None = None
    failed_at: datetime | None = None

    @classmethod
    def of(
        cls, raw: bytes, topic: str, partition: int, offset: int, **fields: object
    ) -> "DeadLetter":
        return cls(
            raw_base64=base64.b64encode(raw).decode(),
            topic=topic,
            partition=partition,
            offset=offset,
            **fields,  # type: ignore[arg-type]
        )

    @property
    def raw(self) -> bytes:
        return base64.b64decode(self.raw_base64)
