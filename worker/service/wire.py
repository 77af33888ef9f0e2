"""From what the engine reports to what the wire carries: token events and results.

Pure functions of a flight and the engine's output, so every mapping is a unit
test without a broker (``tests/worker/service/test_wire.py``).
"""

from datetime import UTC, datetime

from queue_schemas import FinishReason, JobRequest, JobResult, JobStatus, TokenEvent
from queue_schemas import Usage as WireUsage
from queue_schemas.messages import now
from queue_schemas.versioning import MODEL_DEFAULTS_VERSION, SCHEMA_VERSION, TOOLS_VERSION
from worker.engine_process.protocol import Output, reason_for
from worker.service.flights import InFlight, Record
from worker.service.records import REFUSED, Rejected
from worker.service.replies import ReplyReader


def _epoch(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds else None


def token_event(flight: InFlight, output: Output, interval: int = 1) -> TokenEvent | None:
    """The event to publish after this step (None: nothing yet); the flight keeps the
    text, ids and events so far, for its result and for repairs.

    A job's tokens are published in groups of ``interval`` with fixed bounds
    (``[0]``, ``[1, interval)``, then every ``interval`` tokens, and whatever is left
    when it finishes): the first token goes at once, so the time to first token does
    not wait, and every attempt at a job groups its tokens alike, so readers that see
    a regenerated job drop whole events by their index.
    """
    delta = output.delta
    if delta.new_token_ids or delta.new_text:
        flight.text += delta.new_text
        flight.token_ids += delta.new_token_ids
        step = TokenEvent(
            job_id=flight.job.job_id,
            token_index=delta.token_index,
            text=delta.new_text,
            token_ids=delta.new_token_ids,
            logprobs=delta.new_logprobs or None,
            token_texts=output.token_texts,
        )
        flight.pending = step if flight.pending is None else _joined(flight.pending, step)
    pending = flight.pending
    if pending is None or not (delta.finished or _ends_a_group(pending, interval)):
        return None
    flight.pending = None
    flight.events.append(pending)
    return pending


def _ends_a_group(event: TokenEvent, interval: int) -> bool:
    past_last = event.token_index + len(event.token_ids)
    return event.token_index == 0 or past_last // interval > event.token_index // interval


def _joined(first: TokenEvent, then: TokenEvent) -> TokenEvent:
    """One event with the tokens of two consecutive ones."""
    logprobs = None if first.logprobs is None else first.logprobs + (then.logprobs or [])
    texts = None if first.token_texts is None else {**first.token_texts, **(then.token_texts or {})}
    return first.model_copy(
        update={
            "text": first.text + then.text,
            "token_ids": first.token_ids + then.token_ids,
            "logprobs": logprobs,
            "token_texts": texts,
        }
    )


def finished_result(
    flight: InFlight, output: Output, worker: str, reader: ReplyReader | None = None
) -> JobResult:
    """The result of a flight whose last delta this is: completed, or ended by an abort
    (cancelled, or expired when its deadline aborted it); its text read by ``reader``
    (content, reasoning, tool calls: finish reason ``tool_calls`` where it stopped on them)."""
    delta = output.delta
    status, error, version = JobStatus.COMPLETED, None, SCHEMA_VERSION
    finish_reason: FinishReason | None = delta.finish_reason
    if delta.finish_reason == "abort":
        status = JobStatus.CANCELLED
        if flight.expired:
            status, version = JobStatus.EXPIRED, MODEL_DEFAULTS_VERSION
            error = f"{_deadline_text(flight.expires_at)} passed while it ran"
    reply = None if reader is None else reader.read(flight.job, flight.text)
    if reply is not None:
        version = TOOLS_VERSION
        if reply.tool_calls and finish_reason == "stop":
            finish_reason = "tool_calls"
    return JobResult(
        **(reply.model_dump() if reply is not None else {}),
        schema_version=version,
        job_id=flight.job.job_id,
        tenant=flight.job.tenant,
        status=status,
        error=error,
        text=flight.text,
        token_ids=flight.token_ids,
        finish_reason=finish_reason,
        stop_reason=delta.stop_reason,
        usage=WireUsage(
            prompt_tokens=delta.usage.prompt_tokens,
            completion_tokens=delta.usage.completion_tokens,
            cached_tokens=delta.usage.cached_tokens,
        ),
        sampling=flight.sampling,
        metadata=flight.job.metadata,
        worker=worker,
        created_at=flight.job.created_at,
        started_at=flight.started_at,
        first_token_at=_epoch(delta.timings.first_token_time),
        finished_at=now(),
    )


def cancelled_result(job: JobRequest, worker: str) -> JobResult:
    """A job cancelled before any worker ran it to the end."""
    return JobResult(
        job_id=job.job_id,
        tenant=job.tenant,
        status=JobStatus.CANCELLED,
        finish_reason="abort",
        metadata=job.metadata,
        worker=worker,
        created_at=job.created_at,
        finished_at=now(),
    )


def expired_result(job: JobRequest, worker: str, expires_at: datetime | None) -> JobResult:
    """A job whose deadline passed before any worker started it."""
    return JobResult(
        schema_version=MODEL_DEFAULTS_VERSION,
        job_id=job.job_id,
        tenant=job.tenant,
        status=JobStatus.EXPIRED,
        finish_reason="abort",
        error=f"{_deadline_text(expires_at)} passed before the job started",
        metadata=job.metadata,
        worker=worker,
        created_at=job.created_at,
        finished_at=now(),
    )


def _deadline_text(expires_at: datetime | None) -> str:
    when = "?" if expires_at is None else expires_at.isoformat(timespec="milliseconds")
    return f"the job's deadline ({when})"


def rejected_result(rejected: Rejected, reason: str, worker: str) -> JobResult | None:
    """The failure of a record that cannot be served, or None when it names no job."""
    if rejected.job_id is None:
        return None
    return JobResult(
        job_id=rejected.job_id,
        tenant=rejected.tenant,
        status=JobStatus.FAILED,
        finish_reason="error",
        error=reason,
        worker=worker,
        finished_at=now(),
    )


def lost_result(job: JobRequest) -> JobResult:
    """For a job whose claimant died and whose stored result is gone too."""
    return JobResult(
        job_id=job.job_id,
        tenant=job.tenant,
        status=JobStatus.FAILED,
        finish_reason="error",
        error="the job's result was lost",
        metadata=job.metadata,
        finished_at=now(),
    )


def refusal(job: JobRequest, error: BaseException) -> Rejected:
    """A parsed job that cannot be served: the engine's ValueError names why."""
    return Rejected(reason_for(error), REFUSED, job.job_id, job.tenant)


def finished_line(
    result: JobResult, attempt: str, record: Record | None
) -> tuple[str, dict[str, object]]:
    """A finished job's one log line: the text people read, and the same facts as
    fields for JSON logs, with the record's key and partition (where its affinity
    sent it). Times run from the job's creation (the caller's view)."""

    def since_created(moment: datetime | None) -> float | None:
        if moment is None or result.created_at is None:
            return None
        return round((moment - result.created_at).total_seconds(), 3)

    fields: dict[str, object] = {
        "job_id": result.job_id,
        "tenant": result.tenant,
        "status": result.status.value,
        "prompt_tokens": result.usage.prompt_tokens,
        "output_tokens": result.usage.completion_tokens,
        "ttft_s": since_created(result.first_token_at),
        "total_s": since_created(result.finished_at),
        "worker": result.worker,
        "attempt": attempt,
        "key": None
        if record is None or record.key is None
        else record.key.decode(errors="replace"),
        "partition": None if record is None else record.partition.partition,
    }
    text = (
        f"job {result.tenant}/{result.job_id} {result.status.value}: "
        f"{result.usage.prompt_tokens} prompt + {result.usage.completion_tokens} output tokens, "
        f"ttft {fields['ttft_s']} s, total {fields['total_s']} s, attempt {attempt}, "
        f"key {fields['key']} on partition {fields['partition']}"
    )
    return text, fields
