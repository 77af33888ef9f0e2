"""A batch's input lines as fleet jobs, and the progress their results make (pure).

Each line becomes the jobs its route would submit (``services.runs.build_run``),
with ``BATCH_PRIORITY`` added to its priority, so a worker's engine schedules
interactive jobs first, and the batch's expiry as their deadline, so no worker
starts one after it. Job ids are ``{batch id}-{line}-{choice}``.
"""

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from producer_api.auth import Tenant
from producer_api.schemas.batches import BatchObject, BatchRequest, BatchUsage
from producer_api.schemas.openai_format import usage_body
from producer_api.services.runs import Run, build_run
from queue_schemas import JobResult, JobStatus
from queue_schemas.bounds import INT32_MAX

BATCH_PRIORITY = 1000  # added to each line's own: interactive jobs (0 by default) go first
# A line whose job ended so is unfinished: left out of the batch's files.
UNFINISHED = (JobStatus.CANCELLED, JobStatus.EXPIRED)


@dataclass
class Line:
    """One request of a batch, as the jobs its route would submit."""

    custom_id: str
    run: Run

    @property
    def job_ids(self) -> list[str]:
        return self.run.job_ids


def as_lines(batch: BatchObject, requests: list[BatchRequest], default_model: str) -> list[Line]:
    """Each request as the jobs its route would submit to its model (``default_model``
    when it names none), behind interactive priority, with the batch's expiry as their
    deadline (a worker does not start them later)."""
    tenant = Tenant(tenant=batch.tenant)
    expires = None if batch.expires_at is None else datetime.fromtimestamp(batch.expires_at, UTC)
    lines = []
    for request in requests:
        priority = min(request.body.priority + BATCH_PRIORITY, INT32_MAX)
        body = request.body.model_copy(update={"priority": priority})
        model = request.body.model or default_model
        run = build_run(body, f"{batch.id}-{request.line}", model, tenant, expires)
        lines.append(Line(request.custom_id, run))
    return lines


def count_progress(batch: BatchObject, lines: list[Line], done: dict[str, JobResult]) -> None:
    """Progress so far: lines completed and failed, the completed ones' usage."""
    completed = failed = 0
    usage = BatchUsage()
    for line in lines:
        results = [done.get(job_id) for job_id in line.job_ids]
        statuses = [None if r is None else r.status for r in results]
        if JobStatus.FAILED in statuses:
            failed += 1
        elif all(status is JobStatus.COMPLETED for status in statuses):
            completed += 1
            finished = [r for r in results if r is not None]
            add_usage(usage, usage_body(finished, line.run.choices_per_prompt))
    batch.request_counts.completed, batch.request_counts.failed = completed, failed
    batch.usage = usage


def slim(result: JobResult) -> JobResult:
    """A result without its text: what progress needs, kept for every line."""
    return result.model_copy(update={"text": "", "token_ids": []})


def add_usage(total: BatchUsage, line: dict[str, Any]) -> None:
    """Add one line's ``usage`` (the route's shape) to the batch's."""
    total.input_tokens += line["prompt_tokens"]
    total.input_tokens_details.cached_tokens += line["prompt_tokens_details"]["cached_tokens"]
    total.output_tokens += line["completion_tokens"]
    total.total_tokens = total.input_tokens + total.output_tokens


def batch_of(job_id: str) -> str | None:
    """The batch a job belongs to: its ids are ``{batch id}-{line}-{choice}``."""
    if not job_id.startswith("batch_"):
        return None
    parts = job_id.rsplit("-", 2)
    return parts[0] if len(parts) == 3 else None
