"""Kafka and Redis as the integration tests read and write them: a plain producer, a
reader of a whole topic, and a job's stored state and events."""

import json
import random
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from redis.asyncio import Redis

from queue_schemas import JobResult, Names, TokenEvent

TIMEOUT_S = 180


async def produce_records(bootstrap: str, topic: str, records: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for raw in records:
            await producer.send_and_wait(topic, raw)
    finally:
        await producer.stop()


async def read_topic(
    bootstrap: str, topic: str, until: Callable[[list[bytes]], bool]
) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        while not until(values):
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                values += [r.value for r in records]
    finally:
        await consumer.stop()
    return values


async def stored(
    redis_url: str, names: Names, job_id: str
) -> tuple[dict[bytes, bytes], list[TokenEvent]]:
    """The job's Redis hash and the token events of its stream."""
    client = Redis.from_url(redis_url)
    try:
        state = await client.hgetall(names.job_key("default", job_id))
        entries = await client.xrange(names.events_stream("default", job_id))
    finally:
        await client.aclose()
    parsed = [json.loads(fields[b"event"]) for _, fields in entries]
    return state, [TokenEvent.model_validate(e) for e in parsed if e["kind"] == "token"]


def random_job(job_id: str, rng: random.Random) -> bytes:
    return json.dumps(
        {
            "job_id": job_id,
            "messages": [{"role": "user", "content": f"Tell me about the number {job_id}."}],
            "sampling": {"temperature": 0, "max_tokens": rng.randint(3, 24), "ignore_eos": True},
            "priority": rng.choice([0, 1, 2]),
            "metadata": {"n": job_id},
        }
    ).encode()


def long_job(job_id: str, max_tokens: int) -> bytes:
    return json.dumps(
        {
            "job_id": job_id,
            "prompt": f"Once upon a time, job {job_id}",
            "sampling": {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True},
        }
    ).encode()


def results_by_id(raw: list[bytes]) -> dict[str, list[JobResult]]:
    by_id: dict[str, list[JobResult]] = {}
    for value in raw:
        result = JobResult.model_validate_json(value)
        by_id.setdefault(result.job_id, []).append(result)
    return by_id


def all_ids(ids: list[str]) -> Callable[[list[bytes]], bool]:
    return lambda values: {json.loads(v)["job_id"] for v in values} >= set(ids)
