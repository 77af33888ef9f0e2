"""Jobs in from Kafka: fetch, gate, route each record, start it in the engine.

    getmany (as many as the engine's waiting room takes) -> for each record:
      unreadable or invalid -> dead-letter topic (and a failed result if it names a job)
      final, cancelled or past its deadline -> settled without the engine (``admission``)
      else -> state ``running`` in Redis -> engine.add (not awaited: the next fetch
              does not wait for a step)

Each lane (the interactive and the batch topic) has a backpressure gate: its
partitions are paused while free KV blocks are short or the engine's queue is
full, and while Redis is away (``backpressure``). The consumer keeps polling
meanwhile, or the group would evict it.
"""

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from queue_schemas import DeadLetter, JobRequest, SamplingOptions
from queue_schemas.messages import now
from queue_schemas.redis_records import Delivery
from worker.engine_process.client import EngineClient, EngineFailed
from worker.engine_process.protocol import Accepted
from worker.service.admission import Action, decide
from worker.service.background import Background
from worker.service.backpressure import lane_gates
from worker.service.deadlines import has_passed, stop_at_deadline
from worker.service.flights import Attempts, Flights, InFlight, JobKey, Record, key_of
from worker.service.kafka_out import KafkaOut
from worker.service.metrics import WorkerMetrics
from worker.service.offsets import OffsetTracker
from worker.service.output_pump import OutputPump
from worker.service.publisher import RedisPublisher
from worker.service.records import UNREADABLE, Rejected, parse_job
from worker.service.settings import WorkerSettings
from worker.service.wire import (
    cancelled_result,
    expired_result,
    lost_result,
    refusal,
    rejected_result,
)

log = logging.getLogger("genfleet.worker")
FETCH_TIMEOUT_MS = 200


@dataclass
class _Start:
    """A job about to enter the engine, with what it enters as."""

    flight: InFlight
    raw: ConsumerRecord
    params: SamplingOptions


def produced_at(raw: ConsumerRecord) -> datetime:
    """When the record was written (its Kafka timestamp), for a job that does not say."""
    return datetime.fromtimestamp(raw.timestamp / 1000, UTC) if raw.timestamp > 0 else now()


class Intake:
    def __init__(
        self,
        settings: WorkerSettings,
        consumer: AIOKafkaConsumer,
        engine: EngineClient,
        flights: Flights,
        offsets: OffsetTracker,
        publisher: RedisPublisher,
        kafka: KafkaOut,
        pump: OutputPump,
        metrics: WorkerMetrics,
        abort: Callable[[InFlight], None],
    ) -> None:
        self.settings = settings
        self.consumer = consumer
        self.engine = engine
        self.flights = flights
        self.offsets = offsets
        self.publisher = publisher
        self.kafka = kafka
        self.pump = pump
        self.metrics = metrics
        self.abort = abort
        names = settings.names
        self.gates = lane_gates(settings, names)
        self.gate = self.gates[names.jobs_topic]
        self.attempts = Attempts(settings.worker_id)
        self.background = Background(self.settle)

    def settle(self, record: Record) -> None:
        self.offsets.done(record.partition, record.offset)

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self._apply_backpressure()
            # Keep polling (the group evicts a consumer that stops), and keep partitions
            # that a rebalance just gave us paused too.
            for topic, gate in self.gates.items():
                if gate.paused or self.publisher.available.down:
                    self.consumer.pause(*self._lane(topic))
            room = max(1, self.gate.room(self.engine.load))
            try:
                batches = await self.consumer.getmany(timeout_ms=FETCH_TIMEOUT_MS, max_records=room)
            except KafkaError as error:
                self.kafka.available.failed(error)
                await asyncio.sleep(1.0)
                continue
            records = [(partition, record) for partition, rs in batches.items() for record in rs]
            if records:
                await self._take(records)

    def _lane(self, topic: str) -> list[TopicPartition]:
        return [tp for tp in self.consumer.assignment() if tp.topic == topic]

    def _apply_backpressure(self) -> None:
        load = self.engine.load
        for topic, gate in self.gates.items():
            decision = gate.update(load, hold=self.publisher.available.down)
            if decision is None:
                continue
            partitions = self._lane(topic)
            if decision:
                self.consumer.pause(*partitions)
            else:
                self.consumer.resume(*partitions)
            log.info(
                "%s intake of %s: %d/%d KV blocks free, %d waiting (pauses %d, resumes %d)",
                "paused" if decision else "resumed",
                topic,
                load.free_blocks,
                load.total_blocks,
                load.waiting,
                gate.pauses,
                gate.resumes,
            )

    async def _take(self, records: list[tuple[TopicPartition, ConsumerRecord]]) -> None:
        """One fetch, each record on its own: a bad one fails alone, as a dead letter.
        Redis is asked about all of them in one round trip, and the engine process gets
        them all between two steps."""
        jobs: list[tuple[Record, ConsumerRecord, JobRequest]] = []
        for partition, raw in records:
            record = Record(partition, raw.offset, raw.key)
            self.offsets.add(partition, raw.offset)
            try:
                job = parse_job(raw.value, self.settings.max_record_bytes)
            except Exception as error:  # parse_job raises nothing we know of; be sure
                job = Rejected(f"unreadable record: {error!r}", UNREADABLE)
            if isinstance(job, Rejected):
                self.background.spawn(self._dead_letter(record, raw, job), record)
            else:
                jobs.append((record, raw, job))
        pasts = await self.publisher.deliveries([key_of(job) for _, _, job in jobs])
        starting: dict[JobKey, _Start] = {}
        for (record, raw, job), past in zip(jobs, pasts, strict=True):
            try:
                # A job twice in one fetch (a producer's retry) starts once.
                also = starting.get(key_of(job))
                flight = self._route(record, raw, job, past, None if also is None else also.flight)
                if flight is not None:
                    starting[flight.key] = _Start(flight, raw, job.requested_sampling())
            except Exception as error:  # ValueError: the job asks for what cannot be
                self.background.spawn(self._dead_letter(record, raw, refusal(job, error)), record)
        if starting:
            await self._start(list(starting.values()))

    def _route(
        self,
        record: Record,
        raw: ConsumerRecord,
        job: JobRequest,
        past: Delivery,
        starting: InFlight | None,
    ) -> InFlight | None:
        """The flight to start for this record, or None when it needs no new run
        (``starting``: the flight of this job that this fetch starts already)."""
        running = starting or self.flights.get(key_of(job))
        if running is not None:
            if not running.attached:  # our own job, redelivered after a rebalance
                running.record, running.attached, running.orphaned = record, True, False
                self.metrics.redelivered.inc()
            else:  # a second record of a job that is running here
                self.settle(record)
            return None
        action = decide(past, time.time(), self.settings.result_confirm_grace_s)
        expires_at = job.expires_at(produced_at(raw))
        worker = self.settings.worker_id
        if action is Action.SKIP:
            self.settle(record)
        elif action is Action.WAIT:
            self.background.spawn(self._look_again(record, job, past), record)
        elif action is Action.CONFIRM:
            self.background.spawn(self._confirm(record, job, past), record)
        elif action is Action.CANCEL or has_passed(expires_at):
            ended = (
                cancelled_result(job, worker)
                if action is Action.CANCEL
                else expired_result(job, worker, expires_at)
            )
            finish = self.pump.finish([], [(ended, record, self.attempts.next())])
            self.background.spawn(finish, record)
        else:
            flight = InFlight(job, record, now(), self.attempts.next(), expires_at)
            if past.status is not None:  # an earlier attempt started it and did not finish
                self.metrics.redelivered.inc()
                flight.taken_over = True
            return flight
        return None

    async def _start(self, starting: list[_Start]) -> None:
        flights = [start.flight for start in starting]
        running = await self.publisher.start([flight.key for flight in flights])
        taken = [flight for flight in flights if flight.taken_over]
        if taken:  # resume from what readers hold, not from the prompt
            streams = await self.publisher.streamed([flight.key for flight in taken])
            for flight, events in zip(taken, streams, strict=True):
                flight.resume_from(events)
        for start, ok in zip(starting, running, strict=True):
            flight = start.flight
            if not ok:  # final meanwhile: cancelled by the API, or finished elsewhere
                self.settle(flight.record)
                continue
            self.flights.add(flight)
            resumed = list(flight.token_ids)
            added = self.engine.add(flight.request_id, flight.job, start.params, resumed)
            stop_at_deadline(flight, self.abort)
            # Not awaited: the engine answers between steps, and intake must not wait
            # a step (up to a long prefill) before its next fetch.
            added.add_done_callback(functools.partial(self._answered, start))

    def _answered(self, start: _Start, answer: "asyncio.Future[Accepted]") -> None:
        flight = start.flight
        error = answer.exception()
        if error is None:
            accepted = answer.result()
            flight.sampling = accepted.applied
            if accepted.resumed_tokens < len(flight.token_ids):
                flight.keep_resumed(accepted.resumed_tokens, accepted.resumed_chars)
            if flight.token_ids:
                log.info("%s resumes after %d tokens", flight.job.job_id, len(flight.token_ids))
                self.metrics.resumed_tokens.inc(len(flight.token_ids))
            return
        if isinstance(error, EngineFailed):
            return  # the worker is stopping and the job is left for redelivery
        self.flights.forget(flight)
        refused = refusal(flight.job, error)
        self.background.spawn(self._dead_letter(flight.record, start.raw, refused), flight.record)

    async def _look_again(self, record: Record, job: JobRequest, past: Delivery) -> None:
        assert past.claimed_at is not None
        wait = past.claimed_at + self.settings.result_confirm_grace_s - time.time()
        await asyncio.sleep(max(0.0, wait) + 0.1)
        (fresh,) = await self.publisher.deliveries([key_of(job)])
        if decide(fresh, time.time(), self.settings.result_confirm_grace_s) is Action.SKIP:
            self.settle(record)
        else:
            await self._confirm(record, job, fresh)

    async def _confirm(self, record: Record, job: JobRequest, past: Delivery) -> None:
        """A claimant died before confirming its result: send it unless the topic has it."""
        claimed_at = past.claimed_at or 0.0
        if await self.kafka.result_on_topic(job.tenant, job.job_id, claimed_at):
            log.info("result of %s was on the topic already", job.job_id)
        else:
            result = past.result or lost_result(job)
            log.info("sending the result of %s for a claimant that died", job.job_id)
            await self.kafka.send_result(result)
            self.metrics.count_result(result)
        await self.publisher.mark_sent([key_of(job)])
        self.settle(record)

    async def _dead_letter(self, record: Record, raw: ConsumerRecord, rejected: Rejected) -> None:
        """Keep the record on the dead-letter topic; a job whose id we can read also
        fails visibly, so whoever waits on it (an SSE stream, the results topic) hears why."""
        where = record.partition
        log.warning("dead letter %s:%d %s", where.topic, record.offset, rejected.reason[:200])
        letter = DeadLetter.of(
            raw.value, where.topic, where.partition, record.offset,
            reason=rejected.reason, key=raw.key, job_id=rejected.job_id, failed_at=now(),
        )  # fmt: skip
        await self.kafka.send_dead_letter(letter)
        self.metrics.dead_lettered.labels(rejected.kind).inc()
        failure = rejected_result(rejected, letter.reason, self.settings.worker_id)
        if failure is None:
            self.settle(record)
        else:
            await self.pump.finish([], [(failure, record, self.attempts.next())])
