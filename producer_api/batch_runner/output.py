"""A finished batch's output and error files, in input order, as OpenAI writes them."""

import io
import json
from dataclasses import dataclass, field
from typing import Any

from producer_api.batch_runner.lines import UNFINISHED, Line, add_usage
from producer_api.schemas.batches import BatchObject, BatchUsage
from producer_api.services.fleet import Fleet
from producer_api.services.runs import Run
from queue_schemas import JobResult, JobStatus, TokenEvent
from queue_schemas.redis_records import EventCursor


@dataclass
class Written:
    """What the files hold: their ids (None: empty), and the lines' counts and usage."""

    output_file_id: str | None = None
    error_file_id: str | None = None
    completed: int = 0
    failed: int = 0
    usage: BatchUsage = field(default_factory=BatchUsage)


async def write_files(
    fleet: Fleet, batch: BatchObject, lines: list[Line], results: dict[str, JobResult]
) -> Written:
    """The output file (completed lines) and the error file (failed ones); a line that
    did not finish (cancelled, expired, never run) is in neither."""
    output, errors = io.BytesIO(), io.BytesIO()
    written = Written()
    for line in lines:
        entry = await _output_line(fleet, line, [results.get(i) for i in line.job_ids])
        if entry is None:
            continue
        is_error, text, line_usage = entry
        (errors if is_error else output).write(json.dumps(text).encode() + b"\n")
        if is_error:
            written.failed += 1
        else:
            written.completed += 1
            add_usage(written.usage, line_usage)
    written.output_file_id = await _save(fleet, batch, output, "output")
    written.error_file_id = await _save(fleet, batch, errors, "error")
    return written


async def _output_line(
    fleet: Fleet, line: Line, results: list[JobResult | None]
) -> tuple[bool, dict[str, Any], dict[str, Any]] | None:
    """(is an error, the file's line, usage) of a finished line; None if unfinished."""
    if any(r is None or r.status in UNFINISHED for r in results):
        return None
    run = line.run
    finished = [r for r in results if r is not None]
    entry: dict[str, Any] = {"id": f"batch_req_{run.id}", "custom_id": line.custom_id}
    failure = next((r for r in finished if r.status is JobStatus.FAILED), None)
    if failure is not None:
        error = {"code": "job_failed", "message": failure.error or "the job failed"}
        return True, {**entry, "response": None, "error": error}, {}
    events = [await _token_events(fleet, run, r) for r in finished]
    body = run.whole(finished, events)
    response = {"status_code": 200, "request_id": run.id, "body": body}
    return False, {**entry, "response": response, "error": None}, body["usage"]


async def _token_events(fleet: Fleet, run: Run, result: JobResult) -> list[TokenEvent]:
    """A job's token events, where the line asked for logprobs (the only use of them)."""
    if run.shape.top is None:
        return []
    history = await fleet.store.history(result.tenant, result.job_id, EventCursor())
    return [event for event in history if isinstance(event, TokenEvent)]


async def _save(fleet: Fleet, batch: BatchObject, content: io.BytesIO, kind: str) -> str | None:
    if not content.tell():
        return None
    content.seek(0)
    name = f"{batch.id}_{kind}.jsonl"
    saved = await fleet.files.save(batch.tenant, content, name, "batch_output")
    return saved.id
