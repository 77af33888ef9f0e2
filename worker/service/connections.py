"""The worker's clients of Redis and Kafka: opened together, closed together, and a
client that does not answer never holds the exit up."""

import asyncio
import logging
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from redis.asyncio import BlockingConnectionPool, Redis

from queue_schemas import Names
from worker.service.kafka_out import KafkaOut
from worker.service.lane_assignor import StickyLanesAssignor
from worker.service.publisher import RedisPublisher
from worker.service.settings import WorkerSettings

log = logging.getLogger("genfleet.worker")
STOP_TIMEOUT_S = 10.0
ASSIGNORS = {
    "sticky-lanes": StickyLanesAssignor,
    "sticky": StickyPartitionAssignor,
    "roundrobin": RoundRobinPartitionAssignor,
}


@dataclass
class Connections:
    """The worker's clients of Redis and Kafka."""

    redis: Redis
    listener: Redis  # the control channel's pub/sub connection
    publisher: RedisPublisher
    kafka: KafkaOut
    consumer: AIOKafkaConsumer

    @classmethod
    def open(cls, settings: WorkerSettings, names: Names) -> "Connections":
        pool = BlockingConnectionPool.from_url(
            settings.redis_url,
            max_connections=settings.redis_max_connections,
            socket_timeout=settings.redis_timeout_s,
            socket_connect_timeout=settings.redis_timeout_s,
        )
        redis = Redis(connection_pool=pool)
        publisher = RedisPublisher(
            redis, names, settings.event_stream_maxlen, settings.result_ttl_s, settings.worker_id
        )
        kafka = KafkaOut(
            settings.kafka_bootstrap, names, settings.jobs_partitions, settings.kafka_idempotence
        )
        return cls(
            redis=redis,
            listener=Redis.from_url(
                settings.redis_url, socket_connect_timeout=settings.redis_timeout_s
            ),
            publisher=publisher,
            kafka=kafka,
            consumer=AIOKafkaConsumer(
                bootstrap_servers=settings.kafka_bootstrap,
                group_id=names.consumer_group,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=settings.kafka_session_timeout_ms,
                heartbeat_interval_ms=settings.kafka_heartbeat_interval_ms,
                fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
                max_partition_fetch_bytes=max(1_048_576, 2 * settings.max_record_bytes),
                # Sticky per lane (``lane_assignor``): a rebalance moves as few partitions
                # as it can, so the conversations keyed to the rest stay with the cache
                # that holds them, and every worker gets its share of each lane.
                partition_assignment_strategy=tuple(
                    ASSIGNORS[name] for name in settings.kafka_assignors.split(",")
                ),
            ),
        )

    async def close(self) -> None:
        for name, stop in (("consumer", self.consumer.stop), ("producer", self.kafka.stop)):
            try:  # a broker that does not answer does not hold the exit up
                await asyncio.wait_for(stop(), STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("the Kafka %s did not stop within %.0f s", name, STOP_TIMEOUT_S)
        for name, close in (("pub/sub", self.listener.aclose), ("Redis", self.redis.aclose)):
            try:
                await asyncio.wait_for(close(), STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("the %s connection did not close within %.0f s", name, STOP_TIMEOUT_S)
