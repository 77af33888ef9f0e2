"""The batch runner's reader of the results topic: every batch job's result recorded once.

It reads in a consumer group of its own and commits only what it has recorded in
Redis (``BatchStore.record_result``, once per job id), so a restarted runner reads
on where the last one stopped and a result read twice counts once. An outage of
Redis or Kafka stops nothing: it rewinds to the last commit and reads again.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from producer_api.batch_runner.lines import batch_of
from producer_api.errors import ApiError
from producer_api.settings import ApiSettings
from producer_api.stores.batches import BatchStore
from queue_schemas import JobResult
from queue_schemas.topics import ensure_topics

log = logging.getLogger("genfleet.batch")
RETRY_S = 1.0
# What an outage of Redis, Kafka or the files folder raises: waited out, never fatal.
OUTAGES = (RedisError, KafkaError, OSError, ApiError)


class ResultsReader:
    """``on_result(batch id, result)`` hears each batch job's recorded result, every
    time it is read: a result whose recording an outage interrupted is read again, and
    the runner must hear it then (it keeps the first per job)."""

    def __init__(
        self,
        settings: ApiSettings,
        store: BatchStore,
        on_result: Callable[[str, JobResult], None],
    ) -> None:
        self.settings = settings
        self.names = settings.names
        self.store = store
        self.on_result = on_result
        self.consumer = AIOKafkaConsumer(
            self.names.results_topic,
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=self.names.batch_runner_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # A runner that died hands the results over to its successor this soon.
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )

    async def start(self, stop: asyncio.Event) -> None:
        """The topics made and the consumer started, waiting out a broker away."""
        while not stop.is_set():
            try:
                await ensure_topics(
                    self.settings.kafka_bootstrap, self.names, self.settings.jobs_partitions
                )
                await self.consumer.start()
                log.info("batch runner reading %s", self.names.results_topic)
                return
            except (KafkaError, OSError) as error:
                log.warning("batch runner: broker unavailable (%r); retrying", error)
                await asyncio.sleep(RETRY_S)

    async def stop(self) -> None:
        await self.consumer.stop()

    async def run(self, stop: asyncio.Event) -> None:
        """Record every batch job's result, committing only what is recorded."""
        while not stop.is_set():
            try:
                fetched = await self.consumer.getmany(timeout_ms=500)
                for records in fetched.values():
                    for record in records:
                        await self.take(record.value)
                if fetched:
                    await self.consumer.commit()
            except OUTAGES as error:
                log.warning("batch runner, results: %r; reading again", error)
                await self._rewind()
                await asyncio.sleep(RETRY_S)

    async def _rewind(self) -> None:
        """Back to the last commit, so the results of a failed fetch are not skipped."""
        for partition in self.consumer.assignment():
            with contextlib.suppress(*OUTAGES):
                committed = await self.consumer.committed(partition)
                if committed is None:
                    await self.consumer.seek_to_beginning(partition)
                else:
                    self.consumer.seek(partition, committed)

    async def take(self, value: bytes | None) -> None:
        """Record a result record's value (when it is a batch job's) and pass it on."""
        try:
            result = JobResult.model_validate_json(value or b"")
        except ValueError:
            return  # not a result this runner can read; the workers dead-letter their own
        batch_id = batch_of(result.job_id)
        if batch_id is None or not await self.store.exists(result.tenant, batch_id):
            return  # not a batch's job, or a batch this fleet never made
        self.on_result(batch_id, await self.store.record_result(result.tenant, batch_id, result))
