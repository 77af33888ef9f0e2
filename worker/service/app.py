"""``genfleet worker``: Kafka in, engine, Redis and the results topic out.

Tasks on one event loop; the engine runs in its own process (``engine_client``):

    intake   getmany -> each record: parse -> dead-letter | skip | engine.add
    outputs  engine step outputs -> Redis pipeline (events, result claims) per step
    results  claimed results -> results topic -> ``result_sent`` -> offset done
    cancels  Redis pub/sub: cancellations -> engine.abort (``cancellations``)
    commits  every second: per partition, up to the lowest unfinished offset
    watch    engine stalls, topics after a broker restart, partition and lag gauges

With ``--metrics-port`` the worker also serves ``/metrics`` (``metrics``),
``/healthz`` and ``/readyz`` (``health``) from the first moment, model loading
included.

A job's offset counts as done only after its result is on the results topic,
so a worker that dies loses nothing: the job is redelivered and regenerated.
No record, request or outage stops the worker: bad records become dead
letters, Redis and Kafka calls wait out outages (``retry.Dependency``). Only a
failed or stalled engine stops it, loudly, with exit status 1.
"""

import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition
from prometheus_client import CollectorRegistry
from redis.asyncio import BlockingConnectionPool, Redis

from queue_schemas import DeadLetter, JobRequest, JobResult, JobStatus, Names
from queue_schemas.logs import configure_logging
from queue_schemas.messages import now
from queue_schemas.redis_records import Delivery
from worker.sampling_params import SamplingParams
from worker.service.admission import Action, decide
from worker.service.backpressure import lane_gates
from worker.service.cancellations import Cancellations
from worker.service.commits import Committer
from worker.service.engine_client import EngineClient, EngineFailed
from worker.service.engine_protocol import Output, StepOutput
from worker.service.flights import Attempts, InFlight, JobKey, Record, key_of
from worker.service.health import HealthServer, ListenError, health_app
from worker.service.intake import UNREADABLE, Rejected, parse_job, sampling_params
from worker.service.kafka_out import KafkaOut
from worker.service.metrics import WorkerMetrics
from worker.service.offsets import OffsetTracker
from worker.service.publisher import History, RedisPublisher, TenantEvent
from worker.service.settings import WorkerSettings
from worker.service.wire import (
    cancelled_result,
    finished_line,
    finished_result,
    lost_result,
    refusal,
    rejected_result,
    token_event,
)

log = logging.getLogger("genfleet.worker")
COMMIT_INTERVAL_S = 1.0
FETCH_TIMEOUT_MS = 200
WATCH_INTERVAL_S = 0.5
TOPIC_CHECK_S = 5.0
LAG_CHECK_S = 2.0
# A rebalance waits this long for claimed results to reach the topic before it
# gives the partitions up (their next owner would otherwise wait out the grace).
RELEASE_WAIT_S = 5.0
STOP_TIMEOUT_S = 10.0


@dataclass
class _Start:
    """A job about to enter the engine, with what it enters as."""

    flight: InFlight
    raw: ConsumerRecord
    params: SamplingParams


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: "WorkerService") -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.service.release(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.service.adopt(assigned)
        await self.service.commit()  # the first commit, which later ones are checked by


class WorkerService:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.names = Names(settings.topic_prefix)
        self.offsets = OffsetTracker()
        self.jobs: dict[JobKey, InFlight] = {}
        self.by_request: dict[str, InFlight] = {}
        self.gates = lane_gates(settings, self.names)
        self.gate = self.gates[self.names.jobs_topic]
        self.stopping = asyncio.Event()
        self.failed = False
        self._outputs_in: asyncio.Queue[list[Output]] = asyncio.Queue()
        self._to_send: asyncio.Queue[tuple[JobResult, Record | None]] = asyncio.Queue()
        self.attempts = Attempts(settings.worker_id)
        self._background: set[asyncio.Task] = set()
        self.registry = CollectorRegistry()
        self.joined = False  # the group gave us an assignment (possibly empty)
        self._lag_reported: set[TopicPartition] = set()

    # --- lifecycle -------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until SIGTERM or a failure. The engine loads before the worker joins the
        group: a model that does not load ends the worker having read and committed nothing."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        self.engine = EngineClient(self.settings, self._stepped, self._fail)
        health = self._health_server()
        try:
            await self._run_engine()
        finally:
            if health is not None:
                await health.stop()

    async def _run_engine(self) -> None:
        try:
            ready = await self.engine.start()
        except EngineFailed as error:
            log.error("%s: the worker stops without serving", error)
            self.failed = True
            await self.engine.stop()
            return
        log.info(
            "engine ready: %d KV blocks, context %d tokens",
            ready.load.total_blocks,
            ready.max_model_len,
        )
        model_name = Path(self.settings.model).name
        self.metrics = WorkerMetrics(self.registry, model_name, ready.max_model_len)
        try:
            await self._serve()
        finally:
            await self.engine.stop()

    def _health_server(self) -> HealthServer | None:
        port = self.settings.metrics_port
        if port is None:
            return None
        app = health_app(self.registry, self._unhealthy, self._unready)
        server = HealthServer(app, self.settings.metrics_host, port)
        server.start()
        log.info("metrics and health on %s:%d", self.settings.metrics_host, server.port)
        return server

    def _unhealthy(self) -> str | None:
        """Why ``/healthz`` fails: the engine failed or stalls with work (the worker then
        exits anyway; the probe tells an orchestrator that asks first)."""
        if self.engine.failure is not None:
            return self.engine.failure
        stalled = self.engine.stalled_for()
        if stalled > self.settings.stuck_timeout_s:
            return f"engine step running for {stalled:.0f} s"
        return None

    def _unready(self) -> str | None:
        if self.stopping.is_set():
            return "draining"
        if not self.engine.ready:
            return self.engine.failure or "loading the model"
        if not self.joined:
            return "joining the consumer group"
        return None

    def _stepped(self, step: StepOutput) -> None:
        self.metrics.record_step(step)
        if step.outputs:
            self._outputs_in.put_nowait(step.outputs)

    async def _serve(self) -> None:
        settings = self.settings
        pool = BlockingConnectionPool.from_url(
            settings.redis_url,
            max_connections=settings.redis_max_connections,
            socket_timeout=settings.redis_timeout_s,
            socket_connect_timeout=settings.redis_timeout_s,
        )
        self.redis = Redis(connection_pool=pool)
        self.publisher = RedisPublisher(
            self.redis,
            self.names,
            settings.event_stream_maxlen,
            settings.result_ttl_s,
            settings.worker_id,
        )
        self.kafka = KafkaOut(
            settings.kafka_bootstrap, self.names, settings.jobs_partitions,
            settings.kafka_idempotence,
        )  # fmt: skip
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=self.names.consumer_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=settings.kafka_session_timeout_ms,
            heartbeat_interval_ms=settings.kafka_heartbeat_interval_ms,
            fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
            max_partition_fetch_bytes=max(1_048_576, 2 * settings.max_record_bytes),
        )
        self.consumer.subscribe(list(self.names.lanes), listener=_Rebalance(self))
        self.committer = Committer(self.consumer, self.offsets)
        self.cancellations = Cancellations(
            Redis.from_url(settings.redis_url, socket_connect_timeout=settings.redis_timeout_s),
            self.names.control_channel,
            self.publisher,
            lambda: self.jobs,
            self._abort,
        )
        await self.publisher.mark()
        await self.kafka.start()
        await self.kafka.available.call(self.consumer.start)
        log.info("worker %s serving %s", settings.worker_id, ", ".join(self.names.lanes))
        tasks = [
            asyncio.create_task(coroutine)
            for coroutine in (
                self._outputs(), self._results(), self.cancellations.run(), self._commits(),
                self._watch(),
            )
        ]  # fmt: skip
        for task in tasks:
            task.add_done_callback(self._stop_on_failure)
        try:
            await self._intake()
            await self._drain()
        finally:
            log.info("worker %s stopping: committing and leaving the group", settings.worker_id)
            with contextlib.suppress(TimeoutError):  # claimed results go out first
                await asyncio.wait_for(self._to_send.join(), RELEASE_WAIT_S)
            for task in [*tasks, *self._background]:
                task.cancel()
            await asyncio.gather(*tasks, *self._background, return_exceptions=True)
            await self.commit()
            for name, stop in (("consumer", self.consumer.stop), ("producer", self.kafka.stop)):
                try:  # a broker that does not answer does not hold the exit up
                    await asyncio.wait_for(stop(), STOP_TIMEOUT_S)
                except TimeoutError:
                    log.warning("the Kafka %s did not stop within %.0f s", name, STOP_TIMEOUT_S)
            await self.cancellations.listener.aclose()
            await self.redis.aclose()
        log.info("worker %s stopped", settings.worker_id)

    def _fail(self, reason: str) -> None:
        log.error("%s: leaving the group, unfinished jobs go to other workers", reason)
        self.failed = True
        self.stopping.set()

    def _stop_on_failure(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_coro(), exc_info=task.exception())
            self._fail("a worker task failed")

    def _spawn(self, work: Coroutine[Any, Any, None], record: Record) -> None:
        """Settle a record in the background. Should that fail for a reason no outage
        explains, the record is logged and let go: one record never stops the worker."""

        async def guarded() -> None:
            try:
                await work
            except Exception:
                where = record.partition
                log.exception("record %s:%d left unserved", where.topic, record.offset)
                self._settled(record)

        task = asyncio.create_task(guarded())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _drain(self) -> None:
        """After SIGTERM: let running jobs finish until the deadline, abandon the rest."""
        self.consumer.pause(*self.consumer.assignment())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.drain_deadline_s
        while (self.jobs or not self._to_send.empty()) and loop.time() < deadline:
            if self.failed:  # a failed engine finishes nothing: leave the jobs at once
                break
            await asyncio.sleep(0.05)
        if self.jobs and not self.failed:
            log.warning("drain deadline passed: leaving %d jobs for redelivery", len(self.jobs))
        self._abandon(list(self.jobs.values()))

    # --- intake ----------------------------------------------------------------------

    async def _intake(self) -> None:
        while not self.stopping.is_set():
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
        Redis is asked about all of them in one round trip, and the engine thread gets
        them all between two steps."""
        jobs: list[tuple[Record, ConsumerRecord, JobRequest]] = []
        for partition, raw in records:
            record = Record(partition, raw.offset)
            self.offsets.add(partition, raw.offset)
            try:
                job = parse_job(raw.value, self.settings.max_record_bytes)
            except Exception as error:  # parse_job raises nothing we know of; be sure
                job = Rejected(f"unreadable record: {error!r}", UNREADABLE)
            if isinstance(job, Rejected):
                self._spawn(self._dead_letter(record, raw, job), record)
            else:
                jobs.append((record, raw, job))
        pasts = await self.publisher.deliveries([key_of(job) for _, _, job in jobs])
        starting: list[_Start] = []
        for (record, raw, job), past in zip(jobs, pasts, strict=True):
            try:
                flight = self._route(record, job, past)
                if flight is not None:
                    starting.append(_Start(flight, raw, sampling_params(job)))
            except Exception as error:  # ValueError: the job asks for what cannot be
                self._spawn(self._dead_letter(record, raw, refusal(job, error)), record)
        if starting:
            await self._start(starting)

    def _route(self, record: Record, job: JobRequest, past: Delivery) -> InFlight | None:
        """The flight to start for this record, or None when it needs no new run."""
        running = self.jobs.get(key_of(job))
        if running is not None:
            if not running.attached:  # our own job, redelivered after a rebalance
                running.record, running.attached, running.orphaned = record, True, False
                self.metrics.redelivered.inc()
            else:  # a second record of a job that is running here
                self._settled(record)
            return None
        action = decide(past, time.time(), self.settings.result_confirm_grace_s)
        if action is Action.SKIP:
            self._settled(record)
        elif action is Action.WAIT:
            self._spawn(self._look_again(record, job, past), record)
        elif action is Action.CONFIRM:
            self._spawn(self._confirm(record, job, past), record)
        elif action is Action.CANCEL:
            cancelled = cancelled_result(job, self.settings.worker_id)
            finish = self._finish([], [(cancelled, record, self.attempts.next())])
            self._spawn(finish, record)
        elif job.deadline is not None and job.deadline < now():
            raise ValueError("deadline passed before the job started")
        else:
            if past.status is not None:  # an earlier attempt started it and did not finish
                self.metrics.redelivered.inc()
            return InFlight(job, record, now(), self.attempts.next())
        return None

    async def _start(self, starting: list["_Start"]) -> None:
        flights = [start.flight for start in starting]
        running = await self.publisher.start([flight.key for flight in flights])
        for start, ok in zip(starting, running, strict=True):
            flight = start.flight
            if not ok:  # final meanwhile: cancelled by the API, or finished elsewhere
                self._settled(flight.record)
                continue
            self.jobs[flight.key] = flight
            self.by_request[flight.request_id] = flight
            added = self.engine.add(flight.request_id, flight.job, start.params)
            # Not awaited: the engine answers between steps, and intake must not wait
            # a step (up to a long prefill) before its next fetch.
            added.add_done_callback(functools.partial(self._answered, start))

    def _answered(self, start: _Start, answer: "asyncio.Future[None]") -> None:
        error = answer.exception()
        if error is None or isinstance(error, EngineFailed):
            return  # running; or the worker is stopping and the job is left for redelivery
        flight = start.flight
        self._forget(flight)
        refused = refusal(flight.job, error)
        self._spawn(self._dead_letter(flight.record, start.raw, refused), flight.record)

    async def _look_again(self, record: Record, job: JobRequest, past: Delivery) -> None:
        assert past.claimed_at is not None
        wait = past.claimed_at + self.settings.result_confirm_grace_s - time.time()
        await asyncio.sleep(max(0.0, wait) + 0.1)
        (fresh,) = await self.publisher.deliveries([key_of(job)])
        if decide(fresh, time.time(), self.settings.result_confirm_grace_s) is Action.SKIP:
            self._settled(record)
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
            self.metrics.results.labels(result.status.value).inc()
        await self.publisher.mark_sent([key_of(job)])
        self._settled(record)

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
            self._settled(record)
        else:
            await self._finish([], [(failure, record, self.attempts.next())])

    def _settled(self, record: Record | None) -> None:
        if record is not None:
            self.offsets.done(record.partition, record.offset)

    def _forget(self, flight: InFlight) -> None:
        self.jobs.pop(flight.key, None)
        self.by_request.pop(flight.request_id, None)

    # --- outputs ---------------------------------------------------------------------

    async def _outputs(self) -> None:
        while True:
            outputs = await self._outputs_in.get()
            while not self._outputs_in.empty():  # steps run while Redis was slow or away
                outputs += self._outputs_in.get_nowait()
            events: list[TenantEvent] = []
            finished: list[tuple[JobResult, Record | None, str]] = []
            leaving: list[InFlight] = []
            for output in outputs:
                flight = self.by_request.get(output.delta.request_id)
                if flight is None:
                    continue  # a job dropped for another owner
                event = token_event(flight, output, self.settings.stream_interval)
                if event is not None:
                    events.append((flight.job.tenant, event))
                if output.delta.finished:
                    self._forget(flight)
                    leaving.append(flight)
                    record = flight.record if flight.attached else None
                    result = finished_result(flight, output, self.settings.worker_id)
                    finished.append((result, record, flight.request_id))
            await self._finish(events, finished, leaving)

    def _history(self, leaving: list[InFlight]) -> list[History]:
        return [
            (f.job.tenant, f.job.job_id, list(f.events)) for f in [*self.jobs.values(), *leaving]
        ]

    async def _finish(
        self,
        events: list[TenantEvent],
        finished: list[tuple[JobResult, Record | None, str]],
        leaving: list[InFlight] | None = None,
    ) -> None:
        """Write events and claim results; a won claim's result goes to the results topic.
        ``leaving`` are the flights these results end (their history may need rewriting)."""
        claims = await self.publisher.publish(
            events, [(r, c) for r, _, c in finished], lambda: self._history(leaving or [])
        )
        for (result, record, attempt), won in zip(finished, claims, strict=True):
            if won:
                text, fields = finished_line(result, attempt)
                log.info(text, extra=fields)
                self._to_send.put_nowait((result, record))
            else:  # another copy of the job claimed the result first
                self._settled(record)
            if result.status is JobStatus.CANCELLED:
                load = self.engine.load
                log.info(
                    "cancelled %s: %d/%d KV blocks free",
                    result.job_id,
                    load.free_blocks,
                    load.total_blocks,
                )

    async def _results(self) -> None:
        while True:
            batch = [await self._to_send.get()]
            while not self._to_send.empty():
                batch.append(self._to_send.get_nowait())
            try:
                await asyncio.gather(*(self.kafka.send_result(result) for result, _ in batch))
                for result, _ in batch:
                    self.metrics.results.labels(result.status.value).inc()
                await self.publisher.mark_sent([key_of(result) for result, _ in batch])
                for _, record in batch:
                    self._settled(record)
            finally:
                for _ in batch:
                    self._to_send.task_done()

    # --- cancellation, rebalance, commits, watch --------------------------------------------

    def _abort(self, flight: InFlight) -> None:
        self.engine.abort(flight.request_id)

    def _abandon(self, flights: list[InFlight]) -> None:
        for flight in flights:
            self._forget(flight)
            self._abort(flight)

    async def release(self, revoked: set[TopicPartition]) -> None:
        """Partitions taken away: send claimed results, commit what is done, and detach
        the jobs of those partitions (they run on until ``adopt`` knows who has them)."""
        try:
            await asyncio.wait_for(self._to_send.join(), RELEASE_WAIT_S)
        except TimeoutError:
            log.warning("rebalance: results still unsent after %.0f s", RELEASE_WAIT_S)
        await self.commit()
        self.committer.forget(revoked)
        self._detach(revoked)

    def _detach(self, partitions: set[TopicPartition], records_lost: bool = False) -> None:
        for flight in self.jobs.values():
            if flight.record.partition in partitions:
                flight.attached = False
                flight.orphaned = flight.orphaned or records_lost

    def adopt(self, assigned: set[TopicPartition]) -> None:
        """Abort detached jobs whose partition went to another worker (it runs them now);
        keep those whose partition came back, and those whose record a broker lost
        (nobody else will be given them)."""
        log.info("assigned %s", sorted(tp.partition for tp in assigned))
        self.joined = True
        gone = [
            f
            for f in self.jobs.values()
            if not f.attached and not f.orphaned and f.record.partition not in assigned
        ]
        self._abandon(gone)

    async def _commits(self) -> None:
        while True:
            await asyncio.sleep(COMMIT_INTERVAL_S)
            await self.commit()

    async def commit(self) -> None:
        """Commit what is done; a partition whose broker lost our commits is read again
        from its start. Its jobs in flight run on, detached: their offsets name records
        of the lost log."""
        lost = await self.committer.commit()
        if lost:
            self._detach(set(lost), records_lost=True)
            await self.consumer.seek_to_beginning(*lost)
            # A broker that lost its state lost our topics too: an in-memory broker
            # takes records for a missing topic and loses them when it is created.
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                await self.kafka.ensure_topics()

    async def _watch(self) -> None:
        last_topic_check = last_lag_check = time.monotonic()
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            stalled = self.engine.stalled_for()
            if stalled > self.settings.stuck_timeout_s:
                self._fail(f"engine step running for {stalled:.0f} s")
                return
            if self.publisher.available.down:
                await self.publisher.probe()
            owned = self.consumer.assignment()
            self.metrics.partitions_assigned.set(len(owned))
            self.metrics.partitions_paused.set(len(self.consumer.paused() & owned))
            if time.monotonic() - last_lag_check > LAG_CHECK_S:
                last_lag_check = time.monotonic()
                with contextlib.suppress(KafkaError, OSError, TimeoutError):
                    await asyncio.wait_for(self._measure_lag(owned), LAG_CHECK_S)
            if (
                not self.consumer.assignment()
                and time.monotonic() - last_topic_check > TOPIC_CHECK_S
            ):
                last_topic_check = time.monotonic()
                # A restarted broker may have come back without our topics.
                with contextlib.suppress(KafkaError, OSError, TimeoutError):
                    await self.kafka.ensure_topics()

    async def _measure_lag(self, owned: set[TopicPartition]) -> None:
        """Per owned partition, the records past its committed offset (what KEDA scales on)."""
        ends = await self.consumer.end_offsets(list(owned)) if owned else {}
        lag = self.metrics.consumer_lag
        for partition in self._lag_reported - set(ends):
            lag.remove(partition.topic, str(partition.partition))
        for partition, end in ends.items():
            committed = self.committer.committed(partition)
            if committed is not None:
                lag.labels(partition.topic, str(partition.partition)).set(max(0, end - committed))
        self._lag_reported = set(ends)


def run_worker(settings: WorkerSettings) -> int:
    """Serve until SIGTERM; the exit status is 0 unless the engine or a task failed."""
    configure_logging(settings.log_format)
    service = WorkerService(settings)
    try:
        # asyncio's own loop: uvloop measured no gain (README, the fleet benchmark).
        asyncio.run(service.run())
    except ListenError as error:
        log.error("%s", error)
        return 2
    return 1 if service.failed else 0
