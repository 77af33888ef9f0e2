"""``genfleet worker``: Kafka in, engine, Redis and the results topic out.

Tasks on one event loop, the engine in its own thread:

    intake   getmany -> each record: parse -> dead-letter | skip | engine.add
    outputs  engine deltas -> Redis pipeline (events, result claims) per step
    results  claimed results -> results topic -> ``result_sent`` -> offset done
    control  Redis pub/sub: cancellations -> engine.abort
    commits  every second: per partition, up to the lowest unfinished offset
    watch    engine stalls, topics after a broker restart

A job's offset counts as done only after its result is on the results topic,
so a worker that dies loses nothing: the job is redelivered and regenerated.
No record, request or outage stops the worker: bad records become dead
letters, Redis and Kafka calls wait out outages (``retry.Dependency``). Only a
failed or stalled engine stops it, loudly, with exit status 1.
"""

import asyncio
import contextlib
import itertools
import logging
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition
from pydantic import ValidationError
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from queue_schemas import (
    CancelJob,
    DeadLetter,
    JobRequest,
    JobResult,
    JobStatus,
    Names,
    TokenEvent,
)
from queue_schemas import Usage as WireUsage
from queue_schemas.messages import now
from queue_schemas.redis_records import Delivery
from worker.engine import LLMEngine, Prompt
from worker.outputs import RequestDelta
from worker.sampling_params import SamplingParams
from worker.service.admission import Action, decide
from worker.service.backpressure import Backpressure
from worker.service.commits import Committer
from worker.service.engine_thread import EngineThread
from worker.service.intake import (
    Rejected,
    engine_prompt,
    longest_token_bytes,
    parse_job,
    sampling_params,
)
from worker.service.kafka_out import KafkaOut
from worker.service.offsets import OffsetTracker
from worker.service.publisher import History, RedisPublisher, TenantEvent
from worker.service.settings import WorkerSettings

log = logging.getLogger("genfleet.worker")
COMMIT_INTERVAL_S = 1.0
FETCH_TIMEOUT_MS = 200
WATCH_INTERVAL_S = 0.5
TOPIC_CHECK_S = 5.0
# A rebalance waits this long for claimed results to reach the topic before it
# gives the partitions up (their next owner would otherwise wait out the grace).
RELEASE_WAIT_S = 5.0
STOP_TIMEOUT_S = 10.0

JobKey = tuple[str, str]  # (tenant, job id): job ids are unique within a tenant


@dataclass(frozen=True)
class Record:
    """Where a record came from: its offset counts as done once the job is settled."""

    partition: TopicPartition
    offset: int


@dataclass
class InFlight:
    job: JobRequest
    record: Record
    started_at: datetime
    # The engine's id for this attempt at the job, unique in the fleet: it also
    # claims the job's result (``redis_records.FINISH_SCRIPT``).
    request_id: str
    # False after a rebalance took the record's partition: the job runs on, its
    # offset no longer ours, until the partition is assigned elsewhere.
    attached: bool = True
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)

    @property
    def key(self) -> JobKey:
        return (self.job.tenant, self.job.job_id)


@dataclass
class _Start:
    """A job about to enter the engine, with what it enters as."""

    flight: InFlight
    raw: ConsumerRecord
    prompt: Prompt
    params: SamplingParams


def _key(job: JobRequest | JobResult) -> JobKey:
    return (job.tenant, job.job_id)


def _epoch(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds else None


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: "WorkerService") -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.service.release(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.service.adopt(assigned)
        await self.service.commit()  # the first commit, which later ones are checked by


class WorkerService:
    def __init__(self, settings: WorkerSettings, engine: LLMEngine | None = None) -> None:
        self.settings = settings
        self.names = Names(settings.topic_prefix)
        self.engine = engine or LLMEngine(settings.engine_config())
        self.max_prompt_bytes = (
            None
            if self.engine.tokenizer is None
            else self.engine.max_model_len * longest_token_bytes(self.engine.tokenizer)
        )
        self.offsets = OffsetTracker()
        self.jobs: dict[JobKey, InFlight] = {}
        self.by_request: dict[str, InFlight] = {}
        self.gate = Backpressure(
            settings.low_watermark, settings.high_watermark, settings.max_waiting
        )
        self.stopping = asyncio.Event()
        self.failed = False
        self._deltas: asyncio.Queue[list[RequestDelta]] = asyncio.Queue()
        self._to_send: asyncio.Queue[tuple[JobResult, Record | None]] = asyncio.Queue()
        self._attempts = itertools.count()
        self._background: set[asyncio.Task] = set()

    # --- lifecycle -------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
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
        self.consumer.subscribe([self.names.jobs_topic], listener=_Rebalance(self))
        self.committer = Committer(self.consumer, self.offsets)
        self.engine_thread = EngineThread(
            self.engine,
            lambda deltas: loop.call_soon_threadsafe(self._deltas.put_nowait, deltas),
            lambda error: loop.call_soon_threadsafe(self._fail, f"engine failed: {error!r}"),
        )
        await self.publisher.mark()
        await self.kafka.start()
        await self.kafka.available.call(self.consumer.start)
        self.engine_thread.start()
        log.info("worker %s serving %s", settings.worker_id, self.names.jobs_topic)
        tasks = [
            asyncio.create_task(coroutine)
            for coroutine in (
                self._outputs(), self._results(), self._control(), self._commits(), self._watch()
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
            self.engine_thread.stop()
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
            await asyncio.sleep(0.05)
        if self.jobs and not self.failed:
            log.warning("drain deadline passed: leaving %d jobs for redelivery", len(self.jobs))
        self._abandon(list(self.jobs.values()))

    # --- intake ----------------------------------------------------------------------

    async def _intake(self) -> None:
        while not self.stopping.is_set():
            self._apply_backpressure()
            if self.gate.paused or self.publisher.available.down:
                # Keep polling (the group evicts a consumer that stops), and keep
                # partitions that a rebalance just gave us paused too.
                self.consumer.pause(*self.consumer.assignment())
            room = max(1, self.gate.room(self.engine_thread.load))
            try:
                batches = await self.consumer.getmany(timeout_ms=FETCH_TIMEOUT_MS, max_records=room)
            except KafkaError as error:
                self.kafka.available.failed(error)
                await asyncio.sleep(1.0)
                continue
            records = [(partition, record) for partition, rs in batches.items() for record in rs]
            if records:
                await self._take(records)

    def _apply_backpressure(self) -> None:
        load = self.engine_thread.load
        decision = self.gate.update(load, hold=self.publisher.available.down)
        if decision is None:
            return
        partitions = self.consumer.assignment()
        if decision:
            self.consumer.pause(*partitions)
        else:
            self.consumer.resume(*partitions)
        log.info(
            "%s intake: %d/%d KV blocks free, %d waiting (pauses %d, resumes %d)",
            "paused" if decision else "resumed",
            load.free_blocks,
            load.total_blocks,
            load.waiting,
            self.gate.pauses,
            self.gate.resumes,
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
                job = Rejected(f"unreadable record: {error!r}")
            if isinstance(job, Rejected):
                self._spawn(self._dead_letter(record, raw, job), record)
            else:
                jobs.append((record, raw, job))
        pasts = await self.publisher.deliveries([_key(job) for _, _, job in jobs])
        starting: list[_Start] = []
        for (record, raw, job), past in zip(jobs, pasts, strict=True):
            try:
                flight = self._route(record, job, past)
                if flight is not None:
                    prompt = engine_prompt(job, self.engine.tokenizer, self.max_prompt_bytes)
                    starting.append(_Start(flight, raw, prompt, sampling_params(job)))
            except Exception as error:  # ValueError: the job asks for what cannot be
                self._spawn(self._dead_letter(record, raw, _refusal(job, error)), record)
        if starting:
            await self._start(starting)

    def _route(self, record: Record, job: JobRequest, past: Delivery) -> InFlight | None:
        """The flight to start for this record, or None when it needs no new run."""
        running = self.jobs.get(_key(job))
        if running is not None:
            if not running.attached:  # our own job, redelivered after a rebalance
                running.record, running.attached = record, True
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
            finish = self._finish([], [(self._cancelled(job), record, self._claimant())])
            self._spawn(finish, record)
        elif job.deadline is not None and job.deadline < now():
            raise ValueError("deadline passed before the job started")
        else:
            return InFlight(job, record, now(), self._claimant())
        return None

    def _claimant(self) -> str:
        return f"{self.settings.worker_id}-{next(self._attempts)}"

    async def _start(self, starting: list["_Start"]) -> None:
        flights = [start.flight for start in starting]
        running = await self.publisher.start([flight.key for flight in flights])
        adds: list[tuple[_Start, asyncio.Future[None]]] = []
        for start, ok in zip(starting, running, strict=True):
            flight = start.flight
            if not ok:  # final meanwhile: cancelled by the API, or finished elsewhere
                self._settled(flight.record)
                continue
            self.jobs[flight.key] = flight
            self.by_request[flight.request_id] = flight
            added = self.engine_thread.add(
                flight.request_id, start.prompt, start.params, flight.job.priority
            )
            adds.append((start, added))
        outcomes = await asyncio.gather(*(added for _, added in adds), return_exceptions=True)
        for (start, _), outcome in zip(adds, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                flight = start.flight
                self._forget(flight)
                refusal = _refusal(flight.job, outcome)
                self._spawn(self._dead_letter(flight.record, start.raw, refusal), flight.record)

    async def _look_again(self, record: Record, job: JobRequest, past: Delivery) -> None:
        assert past.claimed_at is not None
        wait = past.claimed_at + self.settings.result_confirm_grace_s - time.time()
        await asyncio.sleep(max(0.0, wait) + 0.1)
        (fresh,) = await self.publisher.deliveries([_key(job)])
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
            result = past.result or _lost(job)
            log.info("sending the result of %s for a claimant that died", job.job_id)
            await self.kafka.send_result(result)
        await self.publisher.mark_sent([_key(job)])
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
        if rejected.job_id is None:
            self._settled(record)
            return
        failure = JobResult(
            job_id=rejected.job_id,
            tenant=rejected.tenant,
            status=JobStatus.FAILED,
            finish_reason="error",
            error=letter.reason,
            worker=self.settings.worker_id,
            finished_at=now(),
        )
        await self._finish([], [(failure, record, self._claimant())])

    def _settled(self, record: Record | None) -> None:
        if record is not None:
            self.offsets.done(record.partition, record.offset)

    def _forget(self, flight: InFlight) -> None:
        self.jobs.pop(flight.key, None)
        self.by_request.pop(flight.request_id, None)

    # --- outputs ---------------------------------------------------------------------

    async def _outputs(self) -> None:
        while True:
            deltas = await self._deltas.get()
            while not self._deltas.empty():  # steps run while Redis was slow or away
                deltas += self._deltas.get_nowait()
            events: list[TenantEvent] = []
            finished: list[tuple[JobResult, Record | None, str]] = []
            leaving: list[InFlight] = []
            for delta in deltas:
                flight = self.by_request.get(delta.request_id)
                if flight is None:
                    continue  # a job dropped for another owner
                event = self._event(flight, delta)
                if event is not None:
                    events.append((flight.job.tenant, event))
                if delta.finished:
                    self._forget(flight)
                    leaving.append(flight)
                    record = flight.record if flight.attached else None
                    finished.append((self._result(flight, delta), record, flight.request_id))
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
        for (result, record, _), won in zip(finished, claims, strict=True):
            if won:
                self._to_send.put_nowait((result, record))
            else:  # another copy of the job claimed the result first
                self._settled(record)
            if result.status is JobStatus.CANCELLED:
                load = self.engine_thread.load
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
                await self.publisher.mark_sent([_key(result) for result, _ in batch])
                for _, record in batch:
                    self._settled(record)
            finally:
                for _ in batch:
                    self._to_send.task_done()

    def _event(self, flight: InFlight, delta: RequestDelta) -> TokenEvent | None:
        if not delta.new_token_ids and not delta.new_text:
            return None
        flight.text += delta.new_text
        flight.token_ids += delta.new_token_ids
        event = TokenEvent(
            job_id=flight.job.job_id,
            token_index=delta.token_index,
            text=delta.new_text,
            token_ids=delta.new_token_ids,
            logprobs=delta.new_logprobs or None,
            token_texts=self._token_texts(delta.new_logprobs, flight.job),
        )
        flight.events.append(event)
        return event

    def _token_texts(
        self, logprobs: list[dict[int, float]], job: JobRequest
    ) -> dict[int, str] | None:
        """Readers without the tokenizer (the API's OpenAI logprobs) need each token's text."""
        tokenizer = self.engine.tokenizer
        if not logprobs or tokenizer is None:
            return None
        skip = job.sampling.skip_special_tokens
        return {
            token_id: tokenizer.decode([token_id], skip_special_tokens=skip)
            for top in logprobs
            for token_id in top
        }

    def _result(self, flight: InFlight, delta: RequestDelta) -> JobResult:
        cancelled = delta.finish_reason == "abort"
        return JobResult(
            job_id=flight.job.job_id,
            tenant=flight.job.tenant,
            status=JobStatus.CANCELLED if cancelled else JobStatus.COMPLETED,
            text=flight.text,
            token_ids=flight.token_ids,
            finish_reason=delta.finish_reason,  # type: ignore[arg-type]
            stop_reason=delta.stop_reason,
            usage=WireUsage(
                prompt_tokens=delta.usage.prompt_tokens,
                completion_tokens=delta.usage.completion_tokens,
                cached_tokens=delta.usage.cached_tokens,
            ),
            metadata=flight.job.metadata,
            worker=self.settings.worker_id,
            created_at=flight.job.created_at,
            started_at=flight.started_at,
            first_token_at=_epoch(delta.timings.first_token_time),
            finished_at=now(),
        )

    def _cancelled(self, job: JobRequest) -> JobResult:
        return JobResult(
            job_id=job.job_id,
            tenant=job.tenant,
            status=JobStatus.CANCELLED,
            finish_reason="abort",
            metadata=job.metadata,
            worker=self.settings.worker_id,
            created_at=job.created_at,
            finished_at=now(),
        )

    # --- control, rebalance, commits, watch --------------------------------------------

    async def _control(self) -> None:
        """Cancellations from the control channel; after a Redis outage, the cancel marks
        of running jobs are read again (a message sent meanwhile is lost)."""
        listener = Redis.from_url(
            self.settings.redis_url, socket_connect_timeout=self.settings.redis_timeout_s
        )
        try:
            while True:
                pubsub = listener.pubsub()
                try:
                    await pubsub.subscribe(self.names.control_channel)
                    await self._recheck_cancels()
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            self._on_control(message["data"])
                except (RedisConnectionError, RedisTimeoutError, OSError) as error:
                    self.publisher.available.failed(error)
                    await asyncio.sleep(1.0)
                finally:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
        finally:
            await listener.aclose()

    def _on_control(self, data: bytes) -> None:
        try:
            cancel = CancelJob.model_validate_json(data)
        except ValidationError:
            log.warning("ignoring control message %r", data[:200])
            return
        flight = self.jobs.get((cancel.tenant, cancel.cancel))
        if flight is not None:
            log.info("cancelling %s", cancel.cancel)
            self.engine_thread.abort(flight.request_id)

    async def _recheck_cancels(self) -> None:
        flights = list(self.jobs.values())
        marks = await self.publisher.cancelled([flight.key for flight in flights])
        for flight, cancelled in zip(flights, marks, strict=True):
            if cancelled:
                log.info("cancelling %s", flight.job.job_id)
                self.engine_thread.abort(flight.request_id)

    def _abandon(self, flights: list[InFlight]) -> None:
        for flight in flights:
            self._forget(flight)
            self.engine_thread.abort(flight.request_id)

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

    def _detach(self, partitions: set[TopicPartition]) -> None:
        for flight in self.jobs.values():
            if flight.record.partition in partitions:
                flight.attached = False

    def adopt(self, assigned: set[TopicPartition]) -> None:
        """Abort detached jobs whose partition went to another worker (it runs them now);
        keep those whose partition came back (after a broker restart nobody else will)."""
        log.info("assigned %s", sorted(tp.partition for tp in assigned))
        gone = [
            f for f in self.jobs.values() if not f.attached and f.record.partition not in assigned
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
            self._detach(set(lost))
            await self.consumer.seek_to_beginning(*lost)
            # A broker that lost its state lost our topics too: an in-memory broker
            # takes records for a missing topic and loses them when it is created.
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                await self.kafka.ensure_topics()

    async def _watch(self) -> None:
        last_topic_check = time.monotonic()
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            stalled = self.engine_thread.stalled_for()
            if stalled > self.settings.stuck_timeout_s:
                self._fail(f"engine step running for {stalled:.0f} s")
                return
            if (
                not self.consumer.assignment()
                and time.monotonic() - last_topic_check > TOPIC_CHECK_S
            ):
                last_topic_check = time.monotonic()
                # A restarted broker may have come back without our topics.
                with contextlib.suppress(KafkaError, OSError, TimeoutError):
                    await self.kafka.ensure_topics()


def _refusal(job: JobRequest, error: BaseException) -> Rejected:
    reason = str(error) if isinstance(error, ValueError) else f"cannot be served: {error!r}"
    return Rejected(reason, job.job_id, job.tenant)


def _lost(job: JobRequest) -> JobResult:
    return JobResult(
        job_id=job.job_id,
        tenant=job.tenant,
        status=JobStatus.FAILED,
        finish_reason="error",
        error="the job's result was lost",
        metadata=job.metadata,
        finished_at=now(),
    )


def run_worker(settings: WorkerSettings) -> int:
    """Serve until SIGTERM; the exit status is 0 unless the engine or a task failed."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    service = WorkerService(settings)
    asyncio.run(service.run())
    return 1 if service.failed else 0
