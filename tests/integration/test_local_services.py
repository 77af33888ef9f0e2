"""The real broker and the real Redis start here, and speak Kafka and Redis."""

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from redis.asyncio import Redis

from genfleet.local_services import local_services


async def _kafka_round_trip(bootstrap: str) -> list[bytes]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(3):
            await producer.send_and_wait("smoke", f"job-{i}".encode(), key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        "smoke",
        bootstrap_servers=bootstrap,
        group_id="smoke-group",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        values: list[bytes] = []
        partitions: set[TopicPartition] = set()
        while len(values) < 3:
            batches = await consumer.getmany(timeout_ms=1000)
            for partition, records in batches.items():
                values += [r.value for r in records]
                partitions.add(partition)
        await consumer.commit()
        # One key, so one partition, committed past all three records.
        assert [await consumer.committed(p) for p in partitions] == [3]
        return values
    finally:
        await consumer.stop()


async def _redis_round_trip(url: str) -> bytes | None:
    client = Redis.from_url(url)
    try:
        await client.set("smoke", "ok")
        return await client.get("smoke")
    finally:
        await client.aclose()


def test_kafka_and_redis_start_and_answer() -> None:
    with local_services() as (kafka, redis):
        values = asyncio.run(asyncio.wait_for(_kafka_round_trip(kafka.address), 60))
        assert values == [b"job-0", b"job-1", b"job-2"]
        assert asyncio.run(_redis_round_trip(redis.address)) == b"ok"
    assert kafka.process.poll() is not None and redis.process.poll() is not None
