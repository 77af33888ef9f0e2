"""The worker's records onto Kafka (results, dead letters), and a look back at the results topic.

Sends wait out a broker outage or restart: a failed send is retried with
backoff, and a topic the (restarted, empty) broker no longer has is created
again before the next try. Nothing here fails the worker.
"""

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
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


# What a broker will refuse however often it is asked. Anything else is waited out: a
# restarting broker answers with errors that aiokafka calls final (UnknownError).
TOO_LARGE = (MessageSizeTooLargeError, RecordTooLargeError)
REFUSED = (
    *TOO_LARGE, InvalidTopicError, TopicAuthorizationFailedError, ClusterAuthorizationFailedError,
)  # fmt: skip
# Results this large go out without their text and token ids (Redis keeps those).
MAX_RESULT_BYTES = 8 * 1024 * 1024


def kafka_outage(error: BaseException) -> bool:
    """A broker away or restarting, as opposed to a request it will never take."""
    if isinstance(error, REFUSED):
        return False
    return isinstance(error, KafkaError | TimeoutError | OSError)


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
            max_request_size=MAX_RESULT_BYTES + 65_536,
        )
        # Sends that all find the topic missing create it once, not each on its own.
        self._creating = asyncio.Lock()

    async def start(self) -> None:
        await self.available.call(self.ensure_topics)
        await self.available.call(self.producer.start)

    async def stop(self) -> None:
        await self.producer.stop()

    async def ensure_topics(self) -> None:
        async with self._creating:
            await ensure_topics(self.bootstrap, self.names, self.jobs_partitions)

    async def _send(self, topic: str, value: bytes, key: bytes | None) -> None:
        async def attempt() -> None:
            if self.available.down:
                # The broker may be back from a restart without our topics; an
                # in-memory one takes records for a missing topic and then loses them.
                await self.ensure_topics()
            try:
                await self.producer.send_and_wait(topic, value, key=key)
            except UnknownTopicOrPartitionError:
                await self.ensure_topics()
                raise

        await self.available.call(attempt)

    async def send_result(self, result: JobResult) -> None:
        """The result; one the topic cannot take goes out without its text and token ids,
        with an error that says where they are."""
        value = result.model_dump_json().encode()
        try:
            if len(value) > MAX_RESULT_BYTES:
                raise MessageSizeTooLargeError(f"{len(value)} bytes")
            await self._send(self.names.results_topic, value, result.job_id.encode())
        except TOO_LARGE as error:
            log.warning("result of %s too large for the results topic: %r", result.job_id, error)
            note = (
                f"the result ({len(value)} bytes) is too large for the results topic; its text "
                "is in the job's state (GET /v1/jobs/{id}) until it expires"
            )
            slim = result.model_copy(update={"text": "", "token_ids": [], "error": note})
            await self._send(
                self.names.results_topic, slim.model_dump_json().encode(), result.job_id.encode()
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
            since_ms = int((claimed_at - CLOCK_SKEW_S) * 1000)
            starts = await consumer.offsets_for_times({tp: since_ms for tp in partitions})
            for tp in partitions:
                found = starts.get(tp)
                # No record that late: from the end. (Some brokers answer offset 0 for any
                # time; reading from there is slower, never wrong.)
                if found is None:
                    await consumer.seek_to_end(tp)
                else:
                    consumer.seek(tp, found.offset)
            key = job_id.encode()
            # The end as fetches report it (some brokers' ListOffsets answer short of it).
            while not await _all_at_end(consumer, partitions):
                batches = await consumer.getmany(*partitions, timeout_ms=SCAN_POLL_MS)
                for records in batches.values():
                    for record in records:
                        if record.key == key and _names_tenant(record.value, tenant):
                            return True
            return False
        finally:
            await consumer.stop()


async def _all_at_end(consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> bool:
    for tp in partitions:
        highwater = consumer.highwater(tp)
        if highwater is None or await consumer.position(tp) < highwater:
            return False
    return True


def _names_tenant(value: bytes | None, tenant: str) -> bool:
    if not value:
        return False
    try:
        return JobResult.model_validate_json(value).tenant == tenant
    except ValueError:
        return False
