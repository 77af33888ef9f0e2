"""Each served model's backlog, read from Kafka, and admission of interactive requests by it.

The backlog is what KEDA scales on: over a model's jobs topic's partitions, the
end offset minus its workers' committed offset (a worker commits a job only once
its result is out, so this counts queued and running jobs). Read every
``backlog_refresh_s`` by one background task per API process, for every model
the fleet serves, never on a request's path. A model's completion rate is how
fast its committed offsets advanced over the last minute.

Past ``max_queued_jobs`` of its model the OpenAI routes answer 429 with a Retry-After of
the time the fleet needs, at its measured rate, to bring the backlog back
under the limit; ``/v1/jobs`` keeps accepting (Kafka absorbs an asynchronous
burst). An unknown or stale backlog (Kafka away) admits: the submit itself
then answers 503 if Kafka really is down.
"""

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition
from redis.exceptions import RedisError

from producer_api.errors import ApiError
from producer_api.metrics import ApiMetrics
from producer_api.services.models import ModelDirectory
from producer_api.settings import ApiSettings
from queue_schemas.tasks import cancel_and_wait

log = logging.getLogger("genfleet.api")
RATE_WINDOW_S = 60.0
MAX_RETRY_AFTER_S = 60


@dataclass
class Backlog:
    jobs: int  # past the committed offsets, over all partitions
    committed: int  # sum of the committed offsets (or log starts)
    measured_at: float  # monotonic


@dataclass
class ModelBacklog:
    """One model's readings of the last ``RATE_WINDOW_S`` and the rate they show."""

    latest: Backlog | None = None
    completion_rate: float = 0.0  # jobs/s
    window: deque[Backlog] = field(default_factory=deque)

    def record(self, reading: Backlog) -> None:
        window = self.window
        if window and reading.committed < window[-1].committed:
            window.clear()  # the broker lost the group's offsets: start measuring again
        window.append(reading)
        while reading.measured_at - window[0].measured_at > RATE_WINDOW_S:
            window.popleft()
        first = window[0]
        elapsed = reading.measured_at - first.measured_at
        self.completion_rate = (reading.committed - first.committed) / elapsed if elapsed else 0.0
        self.latest = reading


def retry_after_s(excess: int, completion_rate: float, fallback_s: int) -> int:
    """Seconds until ``excess`` jobs are done at ``completion_rate`` jobs/s, 1 to 60."""
    if completion_rate <= 0:
        return fallback_s
    return max(1, min(MAX_RETRY_AFTER_S, math.ceil(excess / completion_rate)))


class FleetBacklog:
    def __init__(self, settings: ApiSettings, models: ModelDirectory, metrics: ApiMetrics) -> None:
        self.settings = settings
        self.models = models
        self.metrics = metrics
        self.by_model: dict[str, ModelBacklog] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    def fresh(self, model: str) -> Backlog | None:
        """The model's latest reading unless it is older than three refreshes."""
        backlog = self.by_model.get(model)
        latest = None if backlog is None else backlog.latest
        if (
            latest is None
            or time.monotonic() - latest.measured_at > 3 * self.settings.backlog_refresh_s
        ):
            return None
        return latest

    def completion_rate(self, model: str) -> float:
        backlog = self.by_model.get(model)
        return 0.0 if backlog is None else backlog.completion_rate

    def admit_interactive(self, model: str) -> None:
        """Raise 429 when the model's backlog is past ``max_queued_jobs``."""
        limit, backlog = self.settings.max_queued_jobs, self.fresh(model)
        if limit is None or backlog is None or backlog.jobs < limit:
            return
        wait = retry_after_s(
            backlog.jobs - limit + 1, self.completion_rate(model), self.settings.retry_after_s
        )
        self.metrics.fleet_rejections.labels(model).inc()
        raise ApiError(
            429,
            f"the fleet has {backlog.jobs} jobs of {model} queued (limit {limit}); retry in "
            f"{wait} s, or submit through /v1/jobs, which queues",
            code="fleet_overloaded",
            retry_after_s=wait,
        )

    def detail(self) -> dict[str, object]:
        """For ``/readyz``: the default model's figures, and every model's."""
        models = {}
        for model in [self.models.default_model, *self.by_model]:
            backlog = self.fresh(model)
            models[model] = {
                "queued_jobs": None if backlog is None else backlog.jobs,
                "completion_rate": round(self.completion_rate(model), 3),
            }
        default = models[self.models.default_model]
        return {**default, "max_queued_jobs": self.settings.max_queued_jobs, "models": models}

    async def _watch(self) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka_bootstrap)
        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap)
        started = False
        try:
            while True:
                try:
                    if not started:
                        await asyncio.wait_for(consumer.start(), self.settings.kafka_send_timeout_s)
                        await asyncio.wait_for(admin.start(), self.settings.kafka_send_timeout_s)
                        started = True
                    for model in await self.models.served_models():
                        reading = await asyncio.wait_for(
                            self.read(consumer, admin, model), self.settings.kafka_send_timeout_s
                        )
                        if reading is not None:
                            self._record(model, reading)
                except (KafkaError, OSError, TimeoutError, RedisError) as error:
                    log.debug("backlog not read: %r", error)
                await asyncio.sleep(self.settings.backlog_refresh_s)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()
            with contextlib.suppress(Exception):
                await admin.close()

    async def read(
        self, consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient, model: str
    ) -> Backlog | None:
        lanes = self.models.lanes(model)
        topic = lanes.jobs_topic
        # Asked each time: the topic may be new, or made again with other partitions.
        (described,) = await admin.describe_topics([topic])
        partitions = sorted(p["partition"] for p in described.get("partitions") or [])
        if described.get("error_code") or not partitions:
            return None
        tps = [TopicPartition(topic, p) for p in partitions]
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
        # Partitions named: the tansu broker drops the connection on an all-partitions fetch.
        committed = await admin.list_consumer_group_offsets(lanes.consumer_group, partitions=tps)
        # A partition the group never committed is read from its start.
        offsets = {tp: starts[tp] for tp in tps}
        offsets.update(
            {tp: c.offset for tp, c in committed.items() if tp in offsets and c.offset >= 0}
        )
        jobs = sum(max(0, ends[tp] - offsets[tp]) for tp in tps)
        return Backlog(jobs, sum(offsets.values()), time.monotonic())

    def _record(self, model: str, reading: Backlog) -> None:
        backlog = self.by_model.setdefault(model, ModelBacklog())
        backlog.record(reading)
        self.metrics.fleet_backlog.labels(model).set(reading.jobs)
        self.metrics.fleet_completion_rate.labels(model).set(backlog.completion_rate)
