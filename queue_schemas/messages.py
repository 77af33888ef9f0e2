"""What workers write back: token events, job state, results, dead letters."""

import base64
import enum
import hashlib
from datetime import UTC, datetime
from typing import Literal

from pydantic import Field

from queue_schemas.bounds import JobId, TenantName
from queue_schemas.sampling import SamplingOptions
from queue_schemas.tools import ToolCall
from queue_schemas.versioning import SCHEMA_VERSION, WireModel


def now() -> datetime:
    """A wire timestamp: timezone-aware UTC."""
    return datetime.now(UTC)


# "tool_calls": the reply was read as tool calls (a result at schema_version 4).
FinishReason = Literal["stop", "length", "abort", "error", "tool_calls"]


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Its deadline passed: before a worker started it, or while it ran.
    EXPIRED = "expired"

    @property
    def is_final(self) -> bool:
        return self is not JobStatus.QUEUED and self is not JobStatus.RUNNING


class Usage(WireModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TokenEvent(WireModel):
    """New tokens of one job. ``token_index`` numbers the first of them in the output,
    so a reader that sees a token index twice (a job regenerated after a crash) drops it.
    An event may carry several tokens (a worker's ``stream_interval``)."""

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

    @property
    def last_index(self) -> int:
        """The index of its last token: readers resume after it. An event that brought
        text but no token (held-back text released at the end) counts as its index."""
        return self.token_index + max(len(self.token_ids), 1) - 1


class ReadReply(WireModel):
    """What a reply's text was read as (``queue_schemas.tool_parsers``): the fields of
    a job with tools or of a worker with a reasoning parser (schema_version 4)."""

    content: str | None = Field(
        default=None, description="the text less its reasoning and tool calls"
    )
    reasoning: str | None = Field(default=None, description="the model's thinking")
    tool_calls: list[ToolCall] | None = None


class JobResult(ReadReply):
    """The final outcome of a job: the results topic carries one per job id
    (a redelivered job may produce a duplicate with identical content). A result
    whose status is ``expired`` is written at schema_version 3; one whose text was
    read (``content``, ``reasoning``, ``tool_calls``) at 4. ``text`` is always the
    whole text generated."""

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
    sampling: SamplingOptions | None = Field(
        default=None, description="the sampling the worker applied, model defaults filled in"
    )
    metadata: dict[str, str] = Field(default_factory=dict)
    worker: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    first_token_at: datetime | None = None
    finished_at: datetime | None = None


class JobState(ReadReply):
    """The job's Redis hash: what ``GET /v1/jobs/{id}`` reads."""

    job_id: JobId
    tenant: str = "default"
    status: JobStatus
    text: str = ""
    finish_reason: FinishReason | None = None
    usage: Usage = Usage()
    error: str | None = None
    sampling: SamplingOptions | None = Field(
        default=None, description="the sampling the worker applied, model defaults filled in"
    )
    updated_at: datetime | None = None
    worker: str | None = Field(default=None, description="the worker running it, or that ran it")


class CancelJob(WireModel):
    """On the control channel: every worker aborts this job of this tenant if it runs it."""

    cancel: JobId
    tenant: TenantName = "default"


# A dead letter keeps at most this much of the record, so it always fits the
# producer's request limit (1 MiB by default) whatever the record's size.
DEAD_LETTER_EXCERPT_BYTES = 64 * 1024
MAX_REASON_CHARS = 2048


class DeadLetter(WireModel):
    """A record no worker could serve, with the reason: byte for byte when it is small,
    else its first ``DEAD_LETTER_EXCERPT_BYTES`` with the size and SHA-256 of the whole."""

    schema_version: int = SCHEMA_VERSION
    raw_base64: str
    topic: str
    partition: int
    offset: int
    reason: str
    job_id: str | None = None
    failed_at: datetime | None = None
    key_base64: str | None = Field(default=None, description="the record's key, if any")
    value_null: bool = Field(default=False, description="the value was null (a tombstone)")
    raw_size: int | None = Field(default=None, description="bytes of the whole value")
    raw_sha256: str | None = Field(default=None, description="digest of the whole value")
    truncated: bool = Field(default=False, description="raw_base64 holds an excerpt only")

    @classmethod
    def of(
        cls,
        raw: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        *,
        reason: str,
        key: bytes | None = None,
        **fields: object,
    ) -> "DeadLetter":
        value = raw or b""
        excerpt = value[:DEAD_LETTER_EXCERPT_BYTES]
        return cls(
            raw_base64=base64.b64encode(excerpt).decode(),
            topic=topic,
            partition=partition,
            offset=offset,
            reason=reason[:MAX_REASON_CHARS],
            key_base64=None if key is None else base64.b64encode(key[:1024]).decode(),
            value_null=raw is None,
            raw_size=len(value),
            raw_sha256=hashlib.sha256(value).hexdigest(),
            truncated=len(excerpt) < len(value),
            **fields,
        )

    @property
    def raw(self) -> bytes:
        """The value, or its excerpt when ``truncated``."""
        return base64.b64decode(self.raw_base64)
