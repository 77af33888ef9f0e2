"""``genfleet worker``: Kafka in, engine, Redis and the results topic out.

Tasks on one event loop, the engine in its own thread:

    intake   getmany -> validate -> dead-letter | skip | engine.add
    outputs  engine deltas -> Redis pipeline per step -> results topic -> offset done
    control  Redis pub/sub: cancellations -> engine.abort
    commits  every second: per partition, up to the lowest unfinished offset

A job's offset counts as done only after its result is on the results topic,
so a worker that dies loses nothing: the job is redelivered and regenerated.
"""

import asyncio
import enum
import itertools
import logging
import signal
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from pydantic import ValidationError
from redis.asyncio import Redis

from queue_schemas import (
    CancelJob,
    DeadLetter,
    JobRequest,
    JobResult,
    JobState,
    JobStatus,
    Names,
    TokenEvent,
)
from queue_schemas import Usage as WireUsage
from queue_schemas.topics import ensure_topics
from worker.engine import LLMEngine
from worker.outputs import RequestDelta
from worker.service.backpressure import Backpressure
from worker.service.engine_thread import EngineThread
from worker.service.intake import Rejected, engine_prompt, parse_job, sampling_params
from worker.service.offsets import OffsetTracker
from worker.service.publisher import RedisPublisher, now
from worker.service.settings import WorkerSettings

log = logging.getLogger("genfleet.worker")
COMMIT_INTERVAL_S = 1.0
ATTEMPT_SEPARATOR = "#"  # never in a job id (see queue_schemas.jobs.JobId)
FETCH_TIMEOUT_MS = 200


@dataclass
class InFlight:
    job: JobRequest
    partition: TopicPartition
    offset: int
    started_at: datetime
    # The engine's id for this attempt at the job: a job dropped on a rebalance and
    # delivered to this worker again is a new attempt, so late deltas of the old
    # one (its abort) are never taken for the new one's.
    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)


class Admission(enum.Enum):
    ACCEPTED = "accepted"
    # Final already, or cancelled before it started (a redelivery): nothing to do.
    ALREADY_SERVED = "already served"


def _job_id_of(request_id: str) -> str:
    return request_id.rpartition(ATTEMPT_SEPARATOR)[0]


def _epoch(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds else None


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: "WorkerService") -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.service.release(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("assigned %s", sorted(tp.partition for tp in assigned))


class WorkerService:
    def __init__(self, settings: WorkerSettings, engine: LLMEngine | None = None) -> None:
        self.settings = settings
        self.names = Names(settings.topic_prefix)
        self.engine = engine or LLMEngine(settings.engine_config())
        self.offsets = OffsetTracker()
        self.jobs: dict[str, InFlight] = {}
        self.gate = Backpressure(
            settings.low_watermark, settings.high_watermark, settings.max_waiting
        )
        self.stopping = asyncio.Event()
        self.failed = False
        self._deltas: asyncio.Queue[list[RequestDelta]] = asyncio.Queue()
        self._committed: dict[TopicPartition, int] = {}
        self._attempts = itertools.count()

    # --- lifecycle -------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        await ensure_topics(
            self.settings.kafka_bootstrap, self.names, self.settings.jobs_partitions
        )
        self.redis = Redis.from_url(self.settings.redis_url)
        self.publisher = RedisPublisher(
            self.redis, self.names, self.settings.event_stream_maxlen, self.settings.result_ttl_s
        )
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            acks="all",
            enable_idempotence=self.settings.kafka_idempotence,
        )
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=self.names.consumer_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        self.consumer.subscribe([self.names.jobs_topic], listener=_Rebalance(self))
        self.engine_thread = EngineThread(
            self.engine, lambda deltas: loop.call_soon_threadsafe(self._deltas.put_nowait, deltas)
        )
        await self.producer.start()
        await self.consumer.start()
        self.engine_thread.start()
        log.info("worker %s serving %s", self.settings.worker_id, self.names.jobs_topic)
        tasks = [
            asyncio.create_task(coroutine)
            for coroutine in (self._outputs(), self._control(), self._commits())
        ]
        for task in tasks:
            task.add_done_callback(self._stop_on_failure)
        try:
            await self._intake()
            await self._drain()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._commit()
            await self.consumer.stop()
            await self.producer.stop()
            self.engine_thread.stop()
            await self.redis.aclose()
        log.info("worker %s stopped", self.settings.worker_id)

    def _stop_on_failure(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed, stopping", task.get_coro(), exc_info=task.exception())
            self.failed = True
            self.stopping.set()

    async def _drain(self) -> None:
        """After SIGTERM: let running jobs finish until the deadline, abandon the rest."""
        self.consumer.pause(*self.consumer.assignment())
        deadline = asyncio.get_running_loop().time() + self.settings.drain_deadline_s
        while self.jobs and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if self.jobs:
            log.warning("drain deadline passed: leaving %d jobs for redelivery", len(self.jobs))
            self._abandon(list(self.jobs))

    # --- intake ----------------------------------------------------------------------

    async def _intake(self) -> None:
        while not self.stopping.is_set():
            self._apply_backpressure()
            if self.gate.paused:
                # Keep polling (the group evicts a consumer that stops), and keep
                # partitions that a rebalance just gave us paused too.
                self.consumer.pause(*self.consumer.assignment())
            room = max(1, self.gate.room(self.engine_thread.load))
            batches = await self.consumer.getmany(timeout_ms=FETCH_TIMEOUT_MS, max_records=room)
            # Taken concurrently, so the engine thread receives the whole batch
            # between two steps rather than one job per step.
            await asyncio.gather(
                *(
                    self._take(partition, record.offset, record.value)
                    for partition, records in batches.items()
                    for record in records
                )
            )

    def _apply_backpressure(self) -> None:
        decision = self.gate.update(self.engine_thread.load)
        if decision is None:
            return
        partitions = self.consumer.assignment()
        if decision:
            self.consumer.pause(*partitions)
        else:
            self.consumer.resume(*partitions)
        load = self.engine_thread.load
        log.info(
            "%s intake: %d/%d KV blocks free, %d waiting (pauses %d, resumes %d)",
            "paused" if decision else "resumed",
            load.free_blocks,
            load.total_blocks,
            load.waiting,
            self.gate.pauses,
            self.gate.resumes,
        )

    async def _take(self, partition: TopicPartition, offset: int, raw: bytes) -> None:
        self.offsets.add(partition, offset)
        job = parse_job(raw)
        if isinstance(job, Rejected):
            await self._dead_letter(partition, offset, raw, job.reason, job.job_id, None)
            return
        if job.job_id in self.jobs:  # a duplicate of a job this worker is serving
            self.offsets.done(partition, offset)
            return
        # Claimed before the first await, so a duplicate in the same batch is skipped.
        flight = InFlight(
            job, partition, offset, now(), f"{job.job_id}{ATTEMPT_SEPARATOR}{next(self._attempts)}"
        )
        self.jobs[job.job_id] = flight
        outcome = await self._admit(flight)
        if outcome is Admission.ACCEPTED:
            await self.publisher.set_state(
                JobState(
                    job_id=job.job_id, tenant=job.tenant, status=JobStatus.RUNNING, updated_at=now()
                )
            )
            return
        del self.jobs[job.job_id]
        if outcome is Admission.ALREADY_SERVED:
            self.offsets.done(partition, offset)
        else:
            await self._dead_letter(partition, offset, raw, outcome, job.job_id, job.tenant)

    async def _admit(self, flight: InFlight) -> Admission | str:
        """Hand the job to the engine; a text is why it cannot run (for the dead letter)."""
        job = flight.job
        if await self.publisher.is_final_or_cancelled(job.job_id):
            return Admission.ALREADY_SERVED
        if job.deadline and job.deadline < now():
            return "deadline passed"
        try:
            prompt = engine_prompt(job, self.engine.tokenizer)
            await self.engine_thread.add(
                flight.request_id, prompt, sampling_params(job), job.priority
            )
        except ValueError as error:
            return str(error)
        return Admission.ACCEPTED

    async def _dead_letter(
        self,
        partition: TopicPartition,
        offset: int,
        raw: bytes,
        reason: str,
        job_id: str | None,
        tenant: str | None,
    ) -> None:
        """Keep the record on the dead-letter topic; a job whose id we can read also
        fails visibly, so whoever waits on it (an SSE stream, the results topic) hears why."""
        log.warning("dead letter %s:%d %s", partition.topic, offset, reason)
        letter = DeadLetter.of(
            raw, partition.topic, partition.partition, offset,
            reason=reason, job_id=job_id, failed_at=now(),
        )  # fmt: skip
        await self.producer.send_and_wait(
            self.names.dead_letter_topic, letter.model_dump_json().encode()
        )
        if job_id is not None:
            known = {"tenant": tenant} if tenant is not None else {}
            failure = JobResult(
                job_id=job_id,
                status=JobStatus.FAILED,
                finish_reason="error",
                error=reason,
                worker=self.settings.worker_id,
                finished_at=now(),
                **known,
            )
            await self.publisher.publish([], [failure])
            await self._send_result(failure)
        self.offsets.done(partition, offset)

    async def _send_result(self, result: JobResult) -> None:
        await self.producer.send_and_wait(
            self.names.results_topic, result.model_dump_json().encode(), key=result.job_id.encode()
        )

    # --- outputs ---------------------------------------------------------------------

    async def _outputs(self) -> None:
        while True:
            deltas = await self._deltas.get()
            events, results = [], []
            for delta in deltas:
                flight = self.jobs.get(_job_id_of(delta.request_id))
                if flight is None or flight.request_id != delta.request_id:
                    continue  # a job dropped for another owner, or an earlier attempt
                events += self._event(flight, delta)
                if delta.finished:
                    results.append(self._result(flight, delta))
            await self.publisher.publish(events, results)
            for result in results:
                await self._send_result(result)
                flight = self.jobs.pop(result.job_id)
                self.offsets.done(flight.partition, flight.offset)
                if result.status is JobStatus.CANCELLED:
                    load = self.engine_thread.load
                    log.info(
                        "cancelled %s: %d/%d KV blocks free",
                        result.job_id,
                        load.free_blocks,
                        load.total_blocks,
                    )

    def _event(self, flight: InFlight, delta: RequestDelta) -> list[TokenEvent]:
        if not delta.new_token_ids and not delta.new_text:
            return []
        flight.text += delta.new_text
        flight.token_ids += delta.new_token_ids
        return [
            TokenEvent(
                job_id=flight.job.job_id,
                token_index=delta.token_index,
                text=delta.new_text,
                token_ids=delta.new_token_ids,
                logprobs=delta.new_logprobs or None,
                token_texts=self._token_texts(delta.new_logprobs, flight.job),
            )
        ]

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

    # --- control, rebalance, commits ---------------------------------------------------

    async def _control(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(self.names.control_channel)
        try:
            async for message in pubsub.listen():
                if message["type"] != "message":
                    continue
                try:
                    job_id = CancelJob.model_validate_json(message["data"]).cancel
                except ValidationError:
                    log.warning("ignoring control message %r", message["data"])
                    continue
                if job_id in self.jobs:
                    log.info("cancelling %s", job_id)
                    self.engine_thread.abort(self.jobs[job_id].request_id)
        finally:
            await pubsub.aclose()

    def _abandon(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self.engine_thread.abort(self.jobs.pop(job_id).request_id)

    async def release(self, revoked: set[TopicPartition]) -> None:
        """Partitions taken away: commit what is done, leave the rest to the next owner."""
        await self._commit()
        self._abandon([job_id for job_id, f in self.jobs.items() if f.partition in revoked])
        self.offsets.forget(revoked)
        for partition in revoked:
            self._committed.pop(partition, None)

    async def _commits(self) -> None:
        while True:
            await asyncio.sleep(COMMIT_INTERVAL_S)
            await self._commit()

    async def _commit(self) -> None:
        positions = {
            tp: offset
            for tp, offset in self.offsets.committable().items()
            if self._committed.get(tp) != offset
        }
        if not positions:
            return
        await self.consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in positions.items()})
        self._committed.update(positions)


def run_worker(settings: WorkerSettings) -> int:
    """Serve until SIGTERM; the exit status is 0 unless a background task failed."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    service = WorkerService(settings)
    asyncio.run(service.run())
    return 1 if service.failed else 0
