"""Fakes of the narrow interfaces the worker's parts talk through: the engine client,
Redis (``RedisPublisher``), Kafka out, and the consumer. Kafka and Redis themselves are
for the integration tests."""

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiokafka.structs import ConsumerRecord, TopicPartition
from prometheus_client import CollectorRegistry

from queue_schemas import DeadLetter, JobRequest, JobResult, SamplingOptions
from queue_schemas.redis_records import Delivery
from worker.engine_process.protocol import Accepted, EngineLoad
from worker.service.metrics import WorkerMetrics
from worker.service.publisher import redis_outage
from worker.service.retry import Dependency

LANE = TopicPartition("genfleet.jobs", 0)


def metrics() -> WorkerMetrics:
    return WorkerMetrics(CollectorRegistry(), "tiny", 64)


def record(job: JobRequest | bytes, offset: int, timestamp_ms: int | None = None) -> ConsumerRecord:
    value = job if isinstance(job, bytes) else job.model_dump_json(exclude_none=True).encode()
    stamp = timestamp_ms if timestamp_ms is not None else int(datetime.now(UTC).timestamp() * 1e3)
    return ConsumerRecord(
        LANE.topic, LANE.partition, offset, stamp, 0, None, value, None, len(value), -1, []
    )


class FakeEngine:
    """Takes every request (answering with its sampling, the neutral values filled in)."""

    def __init__(self) -> None:
        self.added: list[tuple[str, JobRequest, SamplingOptions]] = []
        self.resumed: dict[str, list[int]] = {}  # request id -> resumed token ids
        self.aborted: list[str] = []
        self.load = EngineLoad(free_blocks=100, total_blocks=100, waiting=0)

    def add(
        self,
        request_id: str,
        job: JobRequest,
        params: SamplingOptions,
        resumed_token_ids: list[int] | None = None,
    ) -> asyncio.Future:
        self.added.append((request_id, job, params))
        self.resumed[request_id] = list(resumed_token_ids or [])
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()
        resumed = len(self.resumed[request_id])
        accepted.set_result(Accepted(request_id, params.with_defaults(), resumed, 0))
        return accepted

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


@dataclass
class FakePublisher:
    """Redis as the worker sees it: what earlier deliveries left, and the claims it wins."""

    past: dict[tuple[str, str], Delivery] = field(default_factory=dict)
    claimed: list[JobResult] = field(default_factory=list)
    events: list = field(default_factory=list)
    sent: list[tuple[str, str]] = field(default_factory=list)
    started: list[tuple[str, str]] = field(default_factory=list)
    # (tenant, job id) -> earlier attempts' token events, as readers hold them
    streams: dict[tuple[str, str], list] = field(default_factory=dict)
    available: Dependency = field(default_factory=lambda: Dependency("redis", redis_outage))

    async def deliveries(self, jobs):
        return [self.past.get(job, Delivery()) for job in jobs]

    async def start(self, jobs):
        self.started += jobs
        return [True for _ in jobs]

    async def streamed(self, jobs):
        return [self.streams.get(job, []) for job in jobs]

    async def publish(self, events, finished, history):
        self.events += events
        won = []
        for result, _ in finished:
            first = all(c.job_id != result.job_id for c in self.claimed)
            if first:
                self.claimed.append(result)
            won.append(first)
        return won

    async def mark_sent(self, jobs):
        self.sent += jobs


@dataclass
class FakeKafka:
    results: list[JobResult] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    available: Dependency = field(default_factory=lambda: Dependency("kafka", lambda _: True))

    async def send_result(self, result: JobResult) -> None:
        self.results.append(result)

    async def send_dead_letter(self, letter: DeadLetter) -> None:
        self.dead_letters.append(letter)

    async def result_on_topic(self, tenant: str, job_id: str, claimed_at: float) -> bool:
        return any(r.job_id == job_id for r in self.results)


class FakeConsumer:
    def __init__(self) -> None:
        self.paused_partitions: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return {LANE}

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused_partitions |= set(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused_partitions -= set(partitions)
