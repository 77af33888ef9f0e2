"""``genfleet worker``: Kafka in, engine, Redis and the results topic out.

The wiring of the worker's parts, each in a module of its own, on one event loop;
the engine runs in its own process (``worker.engine_process``):

    intake       getmany -> each record: parse -> dead-letter | skip | expire | engine.add
    output_pump  engine step outputs -> Redis pipeline (events, result claims) per step;
                 claimed results -> results topic -> ``result_sent`` -> offset done
    cancellations  Redis pub/sub: cancellations -> engine.abort
    deadlines    a running job's deadline -> engine.abort -> ``expired``
    partitions   rebalances, commits every second, lag and partition gauges
    (here)       engine stalls, Redis probes while it is away, drain on SIGTERM

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
import logging
import signal
import time
from io import StringIO

from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry

from queue_schemas.announcements import ANNOUNCE_EVERY_S, WorkerAnnouncement
from queue_schemas.logs import configure_logging
from queue_schemas.tasks import cancel_and_wait
from worker.engine_process.client import EngineClient, EngineFailed
from worker.engine_process.protocol import StepOutput
from worker.service.cancellations import Cancellations
from worker.service.commits import Committer
from worker.service.connections import STOP_TIMEOUT_S, Connections
from worker.service.flights import Flights, InFlight
from worker.service.health import HealthServer, ListenError, health_app
from worker.service.intake import Intake
from worker.service.metrics import WorkerMetrics
from worker.service.offsets import OffsetTracker
from worker.service.output_pump import OutputPump
from worker.service.partitions import RELEASE_WAIT_S, Partitions
from worker.service.publisher import RedisPublisher
from worker.service.replies import ReplyReader
from worker.service.settings import WorkerSettings

log = logging.getLogger("genfleet.worker")
WATCH_INTERVAL_S = 0.5


class WorkerService:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.names = settings.names
        self.flights = Flights()
        self.offsets = OffsetTracker()
        self.stopping = asyncio.Event()
        self.failed = False
        self.registry = CollectorRegistry()
        self.engine = EngineClient(settings, self._stepped, self._fail)
        self.partitions: Partitions | None = None  # once connected
        self.pump: OutputPump | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until SIGTERM or a failure. The engine loads before the worker joins the
        group: a model that does not load ends the worker having read and committed nothing."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
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
        self.metrics = WorkerMetrics(self.registry, self.settings.served_name, ready.max_model_len)
        self.metrics.describe_engine(ready)
        reader = ReplyReader(
            self.settings.tool_call_parser or ready.template_tool_parser,
            self.settings.reasoning_parser,
        )
        log.info(
            "replies read by the %s tool-call parser, reasoning parser %s",
            reader.tool_call_parser,
            reader.reasoning_parser,
        )
        try:
            await self._serve(ready.max_model_len, reader)
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
        if self.partitions is None or not self.partitions.joined:
            return "joining the consumer group"
        return None

    def _stepped(self, step: StepOutput) -> None:
        self.metrics.record_step(step)
        if step.outputs and self.pump is not None:
            self.pump.stepped(step.outputs)

    async def _serve(self, max_model_len: int, reader: ReplyReader) -> None:
        settings, names = self.settings, self.names
        io = Connections.open(settings, names)
        pump = self.pump = OutputPump(
            settings, self.flights, io.publisher, io.kafka, self.metrics, self.offsets,
            lambda: self.engine.load, reader,
        )  # fmt: skip
        partitions = self.partitions = Partitions(
            io.consumer, Committer(io.consumer, self.offsets), self.flights, self._abandon,
            pump.all_sent, io.kafka, self.metrics,
        )  # fmt: skip
        io.consumer.subscribe(list(names.lanes), listener=partitions)
        intake = Intake(
            settings, io.consumer, self.engine, self.flights, self.offsets, io.publisher,
            io.kafka, pump, self.metrics, self._abort,
        )  # fmt: skip
        cancellations = Cancellations(
            io.listener, names.control_channel, io.publisher, self.flights, self._abort
        )
        await io.publisher.mark()
        await io.kafka.start()
        await io.kafka.available.call(io.consumer.start)
        log.info("worker %s serving %s", settings.worker_id, ", ".join(names.lanes))
        tasks = [
            asyncio.create_task(coroutine)
            for coroutine in (
                pump.run_outputs(), pump.run_results(), cancellations.run(),
                partitions.run_commits(), self._watch(io.publisher, partitions),
                self._announce(io.publisher, max_model_len, reader, partitions),
            )
        ]  # fmt: skip
        for task in tasks:
            task.add_done_callback(self._stop_on_failure)
        try:
            await intake.run(self.stopping)
            await self._drain(io.consumer, pump)
        finally:
            log.info("worker %s stopping: committing and leaving the group", settings.worker_id)
            with contextlib.suppress(TimeoutError):  # claimed results go out first
                await asyncio.wait_for(pump.all_sent(), RELEASE_WAIT_S)
            await _stop_tasks(tasks)
            await intake.background.cancel()
            await partitions.commit()
            with contextlib.suppress(Exception):  # else it drops out after the TTL
                await asyncio.wait_for(io.publisher.withdraw(), STOP_TIMEOUT_S)
            await io.close()
        log.info("worker %s stopped", settings.worker_id)

    def _fail(self, reason: str) -> None:
        log.error("%s: leaving the group, unfinished jobs go to other workers", reason)
        self.failed = True
        self.stopping.set()

    def _stop_on_failure(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_coro(), exc_info=task.exception())
            self._fail("a worker task failed")

    async def _drain(self, consumer: AIOKafkaConsumer, pump: OutputPump) -> None:
        """After SIGTERM: let running jobs finish until the deadline, abandon the rest."""
        consumer.pause(*consumer.assignment())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.drain_deadline_s
        while (len(self.flights) or pump.sending) and loop.time() < deadline:
            if self.failed:  # a failed engine finishes nothing: leave the jobs at once
                break
            await asyncio.sleep(0.05)
        if len(self.flights) and not self.failed:
            log.warning("drain deadline passed: leaving %d jobs for redelivery", len(self.flights))
        self._abandon(list(self.flights))

    def _abort(self, flight: InFlight) -> None:
        self.engine.abort(flight.request_id)

    def _abandon(self, flights: list[InFlight]) -> None:
        """Leave these jobs to another worker: out of the table, out of the engine."""
        for flight in flights:
            self.flights.forget(flight)
            self._abort(flight)

    async def _announce(
        self,
        publisher: RedisPublisher,
        max_model_len: int,
        reader: ReplyReader,
        partitions: Partitions,
    ) -> None:
        """Every ``ANNOUNCE_EVERY_S``: alive, serving what, how loaded (for the API)."""
        settings = self.settings
        while True:
            load = self.engine.load
            await publisher.announce(
                WorkerAnnouncement(
                    worker_id=settings.worker_id,
                    model=settings.served_name,
                    default_lanes=settings.served_model_name is None,
                    max_model_len=max_model_len,
                    kv_blocks_total=load.total_blocks,
                    kv_blocks_free=load.free_blocks,
                    running=load.running,
                    waiting=load.waiting,
                    partitions=len(partitions.consumer.assignment()),
                    tool_call_parser=reader.tool_call_parser,
                    reasoning_parser=reader.reasoning_parser,
                    announced_at=time.time(),
                )
            )
            await asyncio.sleep(ANNOUNCE_EVERY_S)

    async def _watch(self, publisher: RedisPublisher, partitions: Partitions) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            stalled = self.engine.stalled_for()
            if stalled > self.settings.stuck_timeout_s:
                self._fail(f"engine step running for {stalled:.0f} s")
                return
            if publisher.available.down:
                await publisher.probe()
            await partitions.observe()


async def _stop_tasks(tasks: list[asyncio.Task]) -> None:
    """Cancel the tasks and wait for them to end; one that does not (a client library
    that holds a cancellation) is named, with where it waits, and left behind: the
    worker exits."""
    for task in await cancel_and_wait(tasks, STOP_TIMEOUT_S):
        where = StringIO()
        task.print_stack(file=where)
        log.warning("a task did not end within %.0f s: %s", STOP_TIMEOUT_S, where.getvalue())


def run_worker(settings: WorkerSettings) -> int:
    """Serve until SIGTERM; the exit status is 0 unless the engine or a task failed."""
    configure_logging(settings.log_format)
    service = WorkerService(settings)
    try:
        # asyncio's own loop: uvloop measured no gain (docs/benchmarks.md, the fleet benchmark).
        asyncio.run(service.run())
    except ListenError as error:
        log.error("%s", error)
        return 2
    return 1 if service.failed else 0
