"""``genfleet batch-runner``: takes the fleet's batches from ``validating`` to a final status.

Every ``batch_tick_s`` (a second), and sooner when one of their jobs' results
comes in, it walks the active batches (``BatchStore``):
- ``validating``: reads the input file and checks every line as its route would
  (``schemas.batches.read_input``); an invalid file fails the batch with the lines'
  errors and runs nothing;
- ``in_progress``: submits the lines as fleet jobs (``lines``: the jobs each line's
  route would submit, behind interactive ones, with the batch's expiry as their
  deadline) to the batch lane, a topic of its own that workers stop reading before
  the interactive one when their KV cache runs short; at most
  ``batch_max_in_flight`` lines unfinished at a time (the lane's backlog stays a
  window, visible as lag, not the whole batch);
- a cancel asked: ``cancelling``: stops submitting, cancels the lines' unfinished
  jobs, waits for their results, then ``cancelled`` with what had finished;
- past ``expires_at``: cancels what is unfinished, ``expired`` with what finished;
- every line done: ``finalizing``, then the output and error files in input
  order (``output``), and ``completed``.

Meanwhile it reads the results topic in its own consumer group and records each
batch job's result once in Redis, committing offsets only after (``results``). Everything it
knows is in Redis and Kafka: a restarted runner (or API) loses nothing, and a
result read twice counts once. Lines whose submission a crash interrupted are
submitted again under the same job ids.
"""

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterable

from producer_api.auth import Tenant
from producer_api.batch_runner.lines import Line, as_lines, count_progress, slim
from producer_api.batch_runner.output import write_files
from producer_api.batch_runner.results import OUTAGES, ResultsReader
from producer_api.errors import ApiError
from producer_api.metrics import ApiMetrics
from producer_api.schemas.batches import (
    MAX_ERRORS,
    BatchError,
    BatchErrors,
    BatchObject,
    BatchRequest,
    BatchStatus,
    read_input,
)
from producer_api.services.fleet import Fleet
from producer_api.services.runs import Run
from producer_api.settings import ApiSettings
from queue_schemas import JobResult
from queue_schemas.logs import configure_logging
from queue_schemas.tasks import cancel_and_wait

log = logging.getLogger("genfleet.batch")
# A result wakes the runner at most this often, and after at least nine times the
# last walk's duration: a walk reads every line of every active batch.
MIN_WAKE_GAP_S = 0.1
SUBMIT_CHUNK = 64
CANCEL_WAIT_S = 60.0  # a cancelled job's result that never comes does not hold the batch


class BatchRunner:
    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
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
        results = ResultsReader(self.settings, self.store, self._result)
        try:
            await results.start(stop)
            reading = asyncio.create_task(results.run(stop))
            while not stop.is_set():
                self._result_came.clear()  # a result taken during the walk wakes the next
                began = time.monotonic()
                try:
                    await self._tick()
                except OUTAGES as error:
                    log.warning("batch runner: %r; trying again", error)
                await self._until_next_tick(stop, time.monotonic() - began)
            await cancel_and_wait([reading])
        finally:
            await results.stop()
            await self.fleet.stop()

    def _result(self, batch_id: str, result: JobResult) -> None:
        """A batch job's recorded result: new here, it counts and wakes the runner (a
        window has room, or the batch may be done)."""
        done = self._done.get(batch_id)
        if done is not None:  # else the batch's first walk reads its results from Redis
            if result.job_id in done:
                return
            done[result.job_id] = slim(result)
        self._result_came.set()

    async def _until_next_tick(self, stop: asyncio.Event, walk_s: float) -> None:
        """A tick's time, or less when a result came: a window with room is refilled
        then, not a tick later (with a small window and short lines, the tick would
        be what limits a batch's speed)."""
        tick_s = self.settings.batch_tick_s
        gap = min(tick_s, max(MIN_WAKE_GAP_S, 9 * walk_s))
        await _until_set([stop], gap)
        await _until_set([stop, self._result_came], tick_s - gap)

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
            count_progress(batch, lines, done)
            await self.store.save(batch)

    async def _validate(self, batch: BatchObject) -> bool:
        """Parse the input; an invalid one fails the batch. True: the batch is running."""
        requests: list[BatchRequest] = []
        if await self.fleet.files.get(batch.tenant, batch.input_file_id) is None:
            message = f"the input file {batch.input_file_id} was deleted"
            errors = [BatchError(code="file_not_found", message=message)]
        else:
            requests, errors = await self._read_input(
                batch, await self.fleet.models.served_models()
            )
        now = int(time.time())
        if errors:
            batch.errors = BatchErrors(data=errors[:MAX_ERRORS])
            batch.status, batch.failed_at = "failed", now
            await self.store.save(batch)
            log.info("batch %s failed validation: %d invalid lines", batch.id, len(errors))
            return False
        batch.status, batch.in_progress_at = "in_progress", now
        batch.request_counts.total = len(requests)
        self._lines[batch.id] = as_lines(batch, requests, self.settings.model)
        await self.store.save(batch)
        log.info("batch %s: %d requests", batch.id, len(requests))
        return True

    async def _read_input(
        self, batch: BatchObject, served_models: list[str] | None
    ) -> tuple[list[BatchRequest], list[BatchError]]:
        """The input's requests (naming one of ``served_models``; None: any) or its errors."""
        content = b"".join(
            [chunk async for chunk in self.fleet.files.content(batch.tenant, batch.input_file_id)]
        )
        return read_input(content, batch.endpoint, served_models)

    async def _lines_of(self, batch: BatchObject) -> list[Line]:
        """The lines validation made, or (after a restart) the input read again."""
        if batch.id not in self._lines:
            # Validated before: a model whose workers left meanwhile keeps its lines.
            requests, _ = await self._read_input(batch, None)
            self._lines[batch.id] = as_lines(batch, requests, self.settings.model)
        return self._lines[batch.id]

    async def _finished_jobs(self, batch: BatchObject) -> dict[str, JobResult]:
        if batch.id not in self._done:
            # In place before the read: a result taken meanwhile lands here, not nowhere.
            done = self._done[batch.id] = {}
            results = await self.store.results(batch)
            done.update({job_id: slim(r) for job_id, r in results.items()})
        return self._done[batch.id]

    async def _submit(
        self, batch: BatchObject, lines: list[Line], submitted: int, lines_done: int
    ) -> None:
        window = self.settings.batch_max_in_flight
        while submitted < len(lines) and submitted - lines_done < window:
            chunk = lines[submitted : submitted + min(SUBMIT_CHUNK, window)]
            for model, runs in _by_model(line.run for line in chunk).items():
                hinted = [(job, run.affinity_hint) for run in runs for job in run.jobs]
                jobs = [job for job, _ in hinted]
                keys = await self.fleet.partition_keys(hinted)
                await self.fleet.store.record_queued(jobs)
                lane = self.fleet.models.lanes(model).batch_jobs_topic
                await self.fleet.submitter.submit(jobs, keys, lane)
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

    async def _final(self, batch: BatchObject, status: BatchStatus, lines: list[Line]) -> None:
        """Write the output and error files of the lines that finished, then the status."""
        if status == "completed":
            # Only a completing batch shows it (as OpenAI's): one cancelled or expired
            # keeps its status, so a runner restarted meanwhile finishes it the same way.
            batch.status, batch.finalizing_at = "finalizing", int(time.time())
            await self.store.save(batch)
        written = await write_files(self.fleet, batch, lines, await self.store.results(batch))
        batch.output_file_id, batch.error_file_id = written.output_file_id, written.error_file_id
        batch.request_counts.completed = written.completed
        batch.request_counts.failed = written.failed
        batch.usage = written.usage
        batch.status = status
        setattr(batch, f"{status}_at", int(time.time()))
        await self.store.save(batch)
        await self.store.drop_results(batch)  # the files hold them now
        self._forget(batch.id)
        log.info(
            "batch %s %s: %d completed, %d failed",
            batch.id, status, written.completed, written.failed,
        )  # fmt: skip

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


def _by_model(runs: Iterable[Run]) -> dict[str, list[Run]]:
    grouped: dict[str, list[Run]] = {}
    for run in runs:
        grouped.setdefault(run.model, []).append(run)
    return grouped
