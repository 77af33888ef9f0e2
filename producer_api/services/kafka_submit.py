"""Jobs onto the jobs topic, with ``acks=all``, or a 503 the client can retry.

The producer starts lazily and restarts after a failure, so the API comes up
(and answers /healthz) while the broker is away and serves as soon as it is
back. A send that the broker does not acknowledge in time is a 503 with
Retry-After, never a 500.
"""

import asyncio
import logging

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from producer_api.errors import ApiError
from producer_api.settings import ApiSettings
from queue_schemas import JobRequest, JobResult, Names
from queue_schemas.topics import ensure_topics

log = logging.getLogger("genfleet.api")


class KafkaUnavailable(ApiError):
    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(
            503,
            f"the job queue is unavailable ({detail}); retry later",
            code="queue_unavailable",
            retry_after_s=retry_after_s,
        )


class JobSubmitter:
    def __init__(self, settings: ApiSettings, names: Names) -> None:
        self.settings = settings
        self.names = names
        self.timeout_s = settings.kafka_send_timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self._stopping: set[asyncio.Task[None]] = set()  # retired producers, stopping

    async def _started(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self.settings.kafka_bootstrap,
                    acks="all",
                    enable_idempotence=self.settings.kafka_idempotence,
                    request_timeout_ms=int(self.timeout_s * 1000),
                )
                try:
                    await asyncio.wait_for(self._start(producer), self.timeout_s)
                except (KafkaError, OSError, TimeoutError) as error:
                    await producer.stop()
                    raise self._unavailable(error) from error
                self._producer = producer
            return self._producer

    async def _start(self, producer: AIOKafkaProducer) -> None:
        await producer.start()
        await ensure_topics(
            self.settings.kafka_bootstrap, self.names, self.settings.jobs_partitions
        )

    def _unavailable(self, error: Exception) -> KafkaUnavailable:
        return KafkaUnavailable(type(error).__name__, self.settings.retry_after_s)

    async def submit(self, jobs: list[JobRequest], keys: list[str], topic: str) -> None:
        """Every job acknowledged by the broker on ``topic`` under its record key, or
        KafkaUnavailable."""
        producer = await self._started()
        try:
            await asyncio.wait_for(
                self._send_all(producer, jobs, keys, topic),
                self.timeout_s,
            )
        except (KafkaError, TimeoutError) as error:
            log.warning("kafka send failed: %r; restarting the producer", error)
            self._retire()  # the 503 goes now: stopping a producer may take as long again
            raise self._unavailable(error) from error

    async def _send_all(
        self, producer: AIOKafkaProducer, jobs: list[JobRequest], keys: list[str], topic: str
    ) -> None:
        sends = [
            await producer.send(
                topic, job.model_dump_json(exclude_none=True).encode(), key=key.encode()
            )
            for job, key in zip(jobs, keys, strict=True)
        ]
        await asyncio.gather(*sends)

    async def send_result(self, result: JobResult) -> bool:
        """A result the API decided (a job cancelled before any worker took it), for
        readers of the results topic. False when it could not be sent: Redis marks it
        unsent, and the worker that reads the job's record sends it."""
        try:
            producer = await self._started()
            await asyncio.wait_for(
                producer.send_and_wait(
                    self.names.results_topic,
                    result.model_dump_json().encode(),
                    key=result.job_id.encode(),
                ),
                self.timeout_s,
            )
        except (ApiError, KafkaError, TimeoutError) as error:
            log.warning("result of %s not on the results topic yet: %r", result.job_id, error)
            return False
        return True

    async def ready(self) -> bool:
        try:
            producer = await self._started()
            await asyncio.wait_for(producer.client.fetch_all_metadata(), self.timeout_s)
        except (ApiError, KafkaError, TimeoutError):
            return False
        return True

    def _retire(self) -> None:
        """Take the producer out of use at once (the next send starts another) and stop
        it in the background."""
        producer, self._producer = self._producer, None
        if producer is not None:
            stopping = asyncio.create_task(self._stop(producer))
            self._stopping.add(stopping)
            stopping.add_done_callback(self._stopping.discard)

    async def _stop(self, producer: AIOKafkaProducer) -> None:
        # A stuck batch would keep stop() waiting; the records of a failed send are
        # marked cancelled in Redis, so a late delivery is skipped by the workers.
        try:
            await asyncio.wait_for(producer.stop(), self.timeout_s)
        except (KafkaError, TimeoutError) as error:
            log.warning("kafka producer did not stop cleanly: %r", error)

    async def stop(self) -> None:
        async with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            await self._stop(producer)
        await asyncio.gather(*self._stopping)
