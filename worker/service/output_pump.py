"""From the engine's step outputs to readers: Redis first, then the results topic.

    engine step outputs -> token events + result claims, one Redis pipeline per batch
    won claims          -> results topic -> ``result_sent`` -> the record's offset done

Steps that ran while Redis was slow or away are written together, in order. A
job's offset counts as done only once its result is on the results topic, so a
worker that dies before that loses nothing: the job is redelivered.
"""

import asyncio
import logging
from collections.abc import Callable

from queue_schemas import JobResult, JobStatus
from worker.engine_process.protocol import EngineLoad, Output
from worker.service.flights import Flights, InFlight, Record, key_of
from worker.service.kafka_out import KafkaOut
from worker.service.metrics import WorkerMetrics
from worker.service.offsets import OffsetTracker
from worker.service.publisher import History, RedisPublisher, TenantEvent
from worker.service.replies import ReplyReader
from worker.service.settings import WorkerSettings
from worker.service.wire import finished_line, finished_result, token_event

log = logging.getLogger("genfleet.worker")

# A result about to be claimed: the record it settles (None: not ours to settle),
# and the attempt that claims it.
Finished = tuple[JobResult, Record | None, str]


class OutputPump:
    def __init__(
        self,
        settings: WorkerSettings,
        flights: Flights,
        publisher: RedisPublisher,
        kafka: KafkaOut,
        metrics: WorkerMetrics,
        offsets: OffsetTracker,
        load: Callable[[], EngineLoad],
        reader: ReplyReader | None = None,
    ) -> None:
        self.settings = settings
        self.reader = reader
        self.flights = flights
        self.publisher = publisher
        self.kafka = kafka
        self.metrics = metrics
        self.offsets = offsets
        self.load = load
        self._outputs: asyncio.Queue[list[Output]] = asyncio.Queue()
        self._to_send: asyncio.Queue[tuple[JobResult, Record | None]] = asyncio.Queue()

    def stepped(self, outputs: list[Output]) -> None:
        """An engine step's outputs (called on the event loop, between its awaits)."""
        self._outputs.put_nowait(outputs)

    @property
    def sending(self) -> bool:
        """Results claimed and not yet on the results topic."""
        return not self._to_send.empty()

    async def all_sent(self) -> None:
        """Until every claimed result is on the results topic."""
        await self._to_send.join()

    async def run_outputs(self) -> None:
        while True:
            outputs = await self._outputs.get()
            while not self._outputs.empty():  # steps run while Redis was slow or away
                outputs += self._outputs.get_nowait()
            await self._publish(outputs)

    async def _publish(self, outputs: list[Output]) -> None:
        events: list[TenantEvent] = []
        finished: list[Finished] = []
        leaving: list[InFlight] = []
        for output in outputs:
            flight = self.flights.of_request(output.delta.request_id)
            if flight is None:
                continue  # a job dropped for another owner
            event = token_event(flight, output, self.settings.stream_interval)
            if event is not None:
                events.append((flight.job.tenant, event))
            if output.delta.finished:
                self.flights.forget(flight)
                leaving.append(flight)
                record = flight.record if flight.attached else None
                result = finished_result(flight, output, self.settings.worker_id, self.reader)
                finished.append((result, record, flight.request_id))
        await self.finish(events, finished, leaving)

    def _history(self, leaving: list[InFlight]) -> list[History]:
        return [(f.job.tenant, f.job.job_id, list(f.events)) for f in [*self.flights, *leaving]]

    async def finish(
        self,
        events: list[TenantEvent],
        finished: list[Finished],
        leaving: list[InFlight] | None = None,
    ) -> None:
        """Write events and claim results; a won claim's result goes to the results topic.
        ``leaving`` are the flights these results end (their history may need rewriting)."""
        claims = await self.publisher.publish(
            events, [(r, c) for r, _, c in finished], lambda: self._history(leaving or [])
        )
        for (result, record, attempt), won in zip(finished, claims, strict=True):
            if won:
                text, fields = finished_line(result, attempt, record)
                log.info(text, extra=fields)
                self._to_send.put_nowait((result, record))
            elif record is not None:  # another copy of the job claimed the result first
                self.offsets.done(record.partition, record.offset)
            if result.status in (JobStatus.CANCELLED, JobStatus.EXPIRED):
                load = self.load()
                log.info(
                    "%s %s: %d/%d KV blocks free",
                    result.status.value,
                    result.job_id,
                    load.free_blocks,
                    load.total_blocks,
                )

    async def run_results(self) -> None:
        while True:
            batch = [await self._to_send.get()]
            while not self._to_send.empty():
                batch.append(self._to_send.get_nowait())
            try:
                await asyncio.gather(*(self.kafka.send_result(result) for result, _ in batch))
                for result, _ in batch:
                    self.metrics.count_result(result)
                await self.publisher.mark_sent([key_of(result) for result, _ in batch])
                for _, record in batch:
                    if record is not None:
                        self.offsets.done(record.partition, record.offset)
            finally:
                for _ in batch:
                    self._to_send.task_done()
