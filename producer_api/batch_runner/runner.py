"""``genfleet batch-runner``: takes the fleet's batches from ``validating`` to a final status.

Every ``batch_tick_s`` (a second), and sooner when one of their jobs' results
comes in, it walks the active batches (``BatchStore``):
- ``validating``: reads the input file and checks every line as its route would
  (``batch_schema.read_input``); an invalid file fails the batch with the lines'
  errors and runs nothing;
- ``in_progress``: submits the lines as fleet jobs (each line's jobs are the ones
  its route would submit, ``build_run``) to the batch lane, a topic of its own
  that workers stop reading before the interactive one when their KV cache runs
  short; at most ``batch_max_in_flight`` lines unfinished at a time (the lane's
  backlog stays a window, visible as lag, not the whole batch), with
  ``BATCH_PRIORITY`` added to their priority, so a worker's engine schedules
  interactive jobs first;
- a cancel asked: ``cancelling``: stops submitting, cancels the lines' unfinished
  jobs, waits for their results, then ``cancelled`` with what had finished;
- past ``expires_at``: cancels what is unfinished, ``expired`` with what finished;
- every line done: ``finalizing``, then the output and error files in input
  order, and ``completed``.

Meanwhile it reads the results topic in its own consumer group and records each
batch job's result once in Redis, committing offsets only after. Everything it
knows is in Redis and Kafka: a restarted runner (or API) loses nothing, and a
result read twice counts once. Lines whose submission a crash interrupted are
submitted again under the same job ids.
"""

import asyncio
import contextlib
import io
import json
import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from producer_api.auth import Tenant
from producer_api.batch_schema import (
    MAX_ERRORS,
    BatchError,
    BatchErrors,
    BatchObject,
    BatchRequest,
    BatchStatus,
    BatchUsage,
    read_input,
)
from producer_api.errors import ApiError
from producer_api.fleet import Fleet
from producer_api.job_store import EventCursor
from producer_api.metrics import ApiMetrics
from producer_api.openai_format import usage_body
from producer_api.openai_routes import Run, build_run
from producer_api.settings import ApiSettings
from queue_schemas import JobResult, JobStatus, TokenEvent
from queue_schemas.bounds import INT32_MAX
from queue_schemas.logs import configure_logging
from queue_schemas.topics import ensure_topics

log = logging.getLogger("genfleet.batch")
BATCH_PRIORITY = 1000  # added to each line's own: interactive jobs (0 by default) go first
# A result wakes the runner at most this often, and after at least nine times the
# last walk's duration: a walk reads every line of every active batch.
MIN_WAKE_GAP_S = 0.1
SUBMIT_CHUNK = 64
CANCEL_WAIT_S = 60.0  # a cancelled job's result that never comes does not hold the batch
RETRY_S = 1.0
# What an outage of Redis, Kafka or the files folder raises: waited out, never fatal.
OUTAGES = (RedisError, KafkaError, OSError, ApiError)


@dataclass
class Line:
    """One request of a batch, as the jobs its route would submit."""

    custom_id: str
    run: Run

    @property
    def job_ids(self) -> list[str]:
        return self.run.job_ids


class BatchRunner:
    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.names = settings.names
        self.fleet = Fleet(settings, ApiMetrics())
        self.store = self.fleet.batches
        self._lines: dict[str, list[Line]] = {}  # batch id -> its lines, parsed once
        # batch id -> job id -> its result (without its text: counts and usage only)
        self._done: dict[str, dict[str, JobResult]] = {}
        self._cancelled_jobs: set[str] = set()  # batches whose jobs were cancelled here
        # Set by a batch job's new result: a window has room, or a batch may be done.
        self._result_came = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        await self.fleet.start()
        consumer = AIOKafkaConsumer(
            self.names.results_topic,
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=self.names.batch_runner_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # A runner that died hands the results over to its successor this soon.
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )
        try:
            await self._start(consumer, stop)
            reading = asyncio.create_task(self._read_results(consumer, stop))
            while not stop.is_set():
                self._result_came.clear()  # a result taken during the walk wakes the next
                began = time.monotonic()
                try:
                    await self._tick()
                except OUTAGES as error:
                    log.warning("batch runner: %r; trying again", error)
                await self._until_next_tick(stop, time.monotonic() - began)
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
        finally:
            await consumer.stop()
            await self.fleet.stop()

    async def _until_next_tick(self, stop: asyncio.Event, walk_s: float) -> None:
        """A tick's time, or less when a result came: a window with room is refilled
        then, not a tick later (with a small window and short lines, the tick would
        be what limits a batch's speed)."""
        tick_s = self.settings.batch_tick_s
        gap = min(tick_s, max(MIN_WAKE_GAP_S, 9 * walk_s))
        await _until_set([stop], gap)
        await _until_set([stop, self._result_came], tick_s - gap)

    async def _start(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await ensure_topics(
                    self.settings.kafka_bootstrap, self.names, self.settings.jobs_partitions
                )
                await consumer.start()
                log.info("batch runner reading %s", self.names.results_topic)
                return
            except (KafkaError, OSError) as error:
                log.warning("batch runner: broker unavailable (%r); retrying", error)
                await asyncio.sleep(RETRY_S)

    async def _read_results(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        """Record every batch job's result, committing only what is recorded; an outage
        stops nothing: uncommitted results are read again."""
        while not stop.is_set():
            try:
                fetched = await consumer.getmany(timeout_ms=500)
                for records in fetched.values():
                    for record in records:
                        await self._take_result(record.value)
                if fetched:
                    await consumer.commit()
            except OUTAGES as error:
                log.warning("batch runner, results: %r; reading again", error)
                await self._rewind(consumer)
                await asyncio.sleep(RETRY_S)

    async def _rewind(self, consumer: AIOKafkaConsumer) -> None:
        """Back to the last commit, so the results of a failed fetch are not skipped."""
        for partition in consumer.assignment():
            with contextlib.suppress(*OUTAGES):
                committed = await consumer.committed(partition)
                if committed is None:
                    await consumer.seek_to_beginning(partition)
                else:
                    consumer.seek(partition, committed)

    async def _take_result(self, value: bytes | None) -> None:
        try:
            result = JobResult.model_validate_json(value or b"")
        except ValueError:
            return  # not a result this runner can read; the workers dead-letter their own
        batch_id = batch_of(result.job_id)
        if batch_id is None or not await self.store.exists(result.tenant, batch_id):
            return  # not a batch's job, or a batch this fleet never made
        new = await self.store.record_result(result.tenant, batch_id, result)
        if new and batch_id in self._done:
            self._done[batch_id][result.job_id] = _slim(result)
        if new:
            self._result_came.set()

    async def _tick(self) -> None:
        for tenant, batch_id in await self.store.active():
            loaded = await self.store.load(tenant, batch_id)
            if loaded is not None:
                await self._advance(*loaded)

    async def _advance(self, batch: BatchObject, cancel_asked: bool, submitted: int) -> None:
        now = int(time.time())
        if batch.status == "validating":
            if cancel_asked:
                await self._final(batch, "cancelled", [])
                return
            if not await self._validate(batch):
                return
        lines = await self._lines_of(batch)
        done = await self._finished_jobs(batch)
        lines_done = sum(all(job_id in done for job_id in line.job_ids) for line in lines)
        if batch.status == "in_progress" and cancel_asked:
            batch.status, batch.cancelling_at = "cancelling", now
            await self.store.save(batch)
        started = lines[:submitted]
        if batch.status == "in_progress" and batch.expires_at and now >= batch.expires_at:
            await self._cancel_jobs(batch, started, done)
            await self._final(batch, "expired", started)
        elif batch.status == "cancelling":
            await self._cancel_jobs(batch, started, done)
            settled = all(job_id in done for line in started for job_id in line.job_ids)
            if settled or now - (batch.cancelling_at or now) > CANCEL_WAIT_S:
                await self._final(batch, "cancelled", started)
        elif lines_done == len(lines):
            await self._final(batch, "completed", lines)
        else:
            await self._submit(batch, lines, submitted, lines_done)
            self._count(batch, lines, done)
            await self.store.save(batch)

    async def _validate(self, batch: BatchObject) -> bool:
        """Parse the input; an invalid one fails the batch. True: the batch is running."""
        requests: list[BatchRequest] = []
        if await self.fleet.files.get(batch.tenant, batch.input_file_id) is None:
            message = f"the input file {batch.input_file_id} was deleted"
            errors = [BatchError(code="file_not_found", message=message)]
        else:
            requests, errors = await self._read_input(batch)
        now = int(time.time())
        if errors:
            batch.errors = BatchErrors(data=errors[:MAX_ERRORS])
            batch.status, batch.failed_at = "failed", now
            await self.store.save(batch)
            log.info("batch %s failed validation: %d invalid lines", batch.id, len(errors))
            return False
        batch.status, batch.in_progress_at = "in_progress", now
        batch.request_counts.total = len(requests)
        self._lines[batch.id] = self._as_lines(batch, requests)
        await self.store.save(batch)
        log.info("batch %s: %d requests", batch.id, len(requests))
        return True

    async def _read_input(self, batch: BatchObject) -> tuple[list[BatchRequest], list[BatchError]]:
        content = b"".join(
            [chunk async for chunk in self.fleet.files.content(batch.tenant, batch.input_file_id)]
        )
        return read_input(content, batch.endpoint, self.settings.model)

    async def _lines_of(self, batch: BatchObject) -> list[Line]:
        """The lines validation made, or (after a restart) the input read again."""
        if batch.id not in self._lines:
            requests, _ = await self._read_input(batch)
            self._lines[batch.id] = self._as_lines(batch, requests)
        return self._lines[batch.id]

    def _as_lines(self, batch: BatchObject, requests: list[BatchRequest]) -> list[Line]:
        """Each request as the jobs its route would submit, behind interactive priority."""
        tenant = Tenant(tenant=batch.tenant)
        lines = []
        for request in requests:
            priority = min(request.body.priority + BATCH_PRIORITY, INT32_MAX)
            body = request.body.model_copy(update={"priority": priority})
            run = build_run(body, f"{batch.id}-{request.line}", self.settings.model, tenant)
            lines.append(Line(request.custom_id, run))
        return lines

    async def _finished_jobs(self, batch: BatchObject) -> dict[str, JobResult]:
        if batch.id not in self._done:
            # In place before the read: a result taken meanwhile lands here, not nowhere.
            done = self._done[batch.id] = {}
            results = await self.store.results(batch)
            done.update({job_id: _slim(r) for job_id, r in results.items()})
        return self._done[batch.id]

    async def _submit(
        self, batch: BatchObject, lines: list[Line], submitted: int, lines_done: int
    ) -> None:
        window = self.settings.batch_max_in_flight
        while submitted < len(lines) and submitted - lines_done < window:
            chunk = lines[submitted : submitted + min(SUBMIT_CHUNK, window)]
            jobs = [job for line in chunk for job in line.run.jobs]
            await self.fleet.store.record_queued(jobs)
            await self.fleet.submitter.submit(jobs, self.names.batch_jobs_topic)
            submitted += len(chunk)
            await self.store.submitted(batch, submitted)

    async def _cancel_jobs(
        self, batch: BatchObject, lines: list[Line], done: dict[str, JobResult]
    ) -> None:
        if batch.id in self._cancelled_jobs:
            return
        tenant = Tenant(tenant=batch.tenant)
        for job_id in [job_id for line in lines for job_id in line.job_ids if job_id not in done]:
            with contextlib.suppress(ApiError):  # finished meanwhile, or never recorded
                await self.fleet.cancel(tenant, job_id)
        self._cancelled_jobs.add(batch.id)

    def _count(self, batch: BatchObject, lines: list[Line], done: dict[str, JobResult]) -> None:
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

    async def _final(self, batch: BatchObject, status: BatchStatus, lines: list[Line]) -> None:
        """Write the output and error files of the lines that finished, then the status."""
        if status == "completed":
            # Only a completing batch shows it (as OpenAI's): one cancelled or expired
            # keeps its status, so a runner restarted meanwhile finishes it the same way.
            batch.status, batch.finalizing_at = "finalizing", int(time.time())
            await self.store.save(batch)
        results = await self.store.results(batch)
        output, errors = io.BytesIO(), io.BytesIO()
        usage = BatchUsage()
        completed = failed = 0
        for line in lines:
            written = await self._output_line(line, [results.get(i) for i in line.job_ids])
            if written is None:
                continue
            is_error, entry, line_usage = written
            target = errors if is_error else output
            target.write(json.dumps(entry).encode() + b"\n")
            if is_error:
                failed += 1
            else:
                completed += 1
                add_usage(usage, line_usage)
        batch.output_file_id = await self._save(batch, output, "output")
        batch.error_file_id = await self._save(batch, errors, "error")
        batch.request_counts.completed, batch.request_counts.failed = completed, failed
        batch.usage = usage
        batch.status = status
        setattr(batch, f"{status}_at", int(time.time()))
        await self.store.save(batch)
        await self.store.drop_results(batch)  # the files hold them now
        self._forget(batch.id)
        log.info("batch %s %s: %d completed, %d failed", batch.id, status, completed, failed)

    async def _output_line(
        self, line: Line, results: list[JobResult | None]
    ) -> tuple[bool, dict[str, Any], dict[str, Any]] | None:
        """(is an error, the file's line, usage) of a finished line; None if unfinished."""
        if any(r is None or r.status is JobStatus.CANCELLED for r in results):
            return None
        run = line.run
        finished = [r for r in results if r is not None]
        entry: dict[str, Any] = {"id": f"batch_req_{run.id}", "custom_id": line.custom_id}
        failure = next((r for r in finished if r.status is JobStatus.FAILED), None)
        if failure is not None:
            error = {"code": "job_failed", "message": failure.error or "the job failed"}
            return True, {**entry, "response": None, "error": error}, {}
        events = [await self._token_events(run, r) for r in finished]
        body = run.whole(finished, events)
        response = {"status_code": 200, "request_id": run.id, "body": body}
        return False, {**entry, "response": response, "error": None}, body["usage"]

    async def _token_events(self, run: Run, result: JobResult) -> list[TokenEvent]:
        """A job's token events, where the line asked for logprobs (the only use of them)."""
        if run.shape.top is None:
            return []
        history = await self.fleet.store.history(result.tenant, result.job_id, EventCursor())
        return [event for event in history if isinstance(event, TokenEvent)]

    async def _save(self, batch: BatchObject, content: io.BytesIO, kind: str) -> str | None:
        if not content.tell():
            return None
        content.seek(0)
        name = f"{batch.id}_{kind}.jsonl"
        saved = await self.fleet.files.save(batch.tenant, content, name, "batch_output")
        return saved.id

    def _forget(self, batch_id: str) -> None:
        self._lines.pop(batch_id, None)
        self._done.pop(batch_id, None)
        self._cancelled_jobs.discard(batch_id)


async def _until_set(events: list[asyncio.Event], timeout_s: float) -> None:
    """Until one of ``events`` is set, or ``timeout_s`` has passed."""
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _slim(result: JobResult) -> JobResult:
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


def run_batch_runner(settings: ApiSettings) -> int:
    configure_logging(settings.log_format)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await BatchRunner(settings).run(stop)

    asyncio.run(main())
    return 0
