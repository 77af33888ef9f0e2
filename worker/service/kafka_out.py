"""The worker's records onto Kafka (results, dead letters), and a look back at the results topic.

Sends wait out a broker outage or restart: a failed send is retried with
backoff, and a topic the (restarted, empty) broker no longer has is created
again before the next try. Nothing here fails the worker.
"""

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    KafkaUnavailableError,
    UnknownTopicOrPartitionError,
)
from aiokafka.structs import TopicPartition

from queue_schemas import DeadLetter, JobResult, Names
from queue_schemas.topics import ensure_topics
from worker.service.retry import Dependency

log = logging.getLogger("genfleet.worker")
SEND_TIMEOUT_MS = 10_000
# Producers' clocks may run behind ours: look this far before a claim for its result.
CLOCK_SKEW_S = 60.0
SCAN_POLL_MS = 500
SCAN_TIMEOUT_S = 30.0


def kafka_outage(error: BaseException) -> bool:
    """A broker away or restarting, as opposed to a request it will never take."""
    if isinstance(error, TimeoutError | OSError):
        return True
    outage = KafkaConnectionError | KafkaTimeoutError | KafkaUnavailableError
    return isinstance(error, KafkaError) and (isinstance(error, outage) or error.retriable)


class KafkaOut:
    def __init__(self, bootstrap: str, names: Names, jobs_partitions: int, idempotence: bool):
        self.bootstrap = bootstrap
        self.names = names
        self.jobs_partitions = jobs_partitions
        self.available = Dependency("kafka", kafka_outage)
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=idempotence,
            request_timeout_ms=SEND_TIMEOUT_MS,
        )

    async def start(self) -> None:
        await self.available.call(self.ensure_topics)
        await self.available.call(self.producer.start)

    async def stop(self) -> None:
        await self.producer.stop()

    async def ensure_topics(self) -> None:
        await ensure_topics(self.bootstrap, self.names, self.jobs_partitions)

    async def _send(self, topic: str, value: bytes, key: bytes | None) -> None:
        async def attempt() -> None:
            try:
                await self.producer.send_and_wait(topic, value, key=key)
            except UnknownTopicOrPartitionError:
                await self.ensure_topics()
                raise

        await self.available.call(attempt)

    async def send_result(self, result: JobResult) -> None:
        await self._send(
            self.names.results_topic, result.model_dump_json().encode(), result.job_id.encode()
        )

    async def send_dead_letter(self, letter: DeadLetter) -> None:
        await self._send(self.names.dead_letter_topic, letter.model_dump_json().encode(), None)

    async def result_on_topic(self, tenant: str, job_id: str, claimed_at: float) -> bool:
        """Whether the results topic holds this job's result, produced after its claim."""
        return await self.available.call(
            lambda: asyncio.wait_for(self._scan(tenant, job_id, claimed_at), SCAN_TIMEOUT_S)
        )

    async def _scan(self, tenant: str, job_id: str, claimed_at: float) -> bool:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False
        )
        await consumer.start()
        try:
            topic = self.names.results_topic
            await consumer.topics()
            numbers = consumer.partitions_for_topic(topic) or set()
            partitions = [TopicPartition(topic, number) for number in sorted(numbers)]
            if not partitions:
                return False
            consumer.assign(partitions)
            ends = await consumer.end_offsets(partitions)
            since_ms = int((claimed_at - CLOCK_SKEW_S) * 1000)
            starts = await consumer.offsets_for_times({tp: since_ms for tp in partitions})
            for tp in partitions:
                found = starts.get(tp)
                # No record that late: nothing to read there. (Some brokers answer offset 0
                # for any time; reading from there is slower, never wrong.)
                consumer.seek(tp, ends[tp] if found is None else found.offset)
            key = job_id.encode()
            while any(await consumer.position(tp) < ends[tp] for tp in partitions):
                batches = await consumer.getmany(*partitions, timeout_ms=SCAN_POLL_MS)
                for records in batches.values():
                    for record in records:
                        if record.key == key and _names_tenant(record.value, tenant):
                            return True
            return False
        finally:
            await consumer.stop()


def _names_tenant(value: bytes | None, tenant: str) -> bool:
    if not value:
        return False
    try:
        return JobResult.model_validate_json(value).tenant == tenant
    except ValueError:
        return False
