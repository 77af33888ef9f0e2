"""Tasks that talk to a real Redis through redis-py stop when the fleet stops them."""

import asyncio
import random

from redis.asyncio import Redis

from queue_schemas import tasks
from queue_schemas.tasks import cancel_and_wait


def test_every_task_writing_to_redis_ends_when_cancelled(services, prefix, monkeypatch) -> None:
    """With a socket timeout, as the fleet's clients have, redis-py's writes go through
    ``asyncio.wait_for``, which on Python 3.11 drops a cancel that arrives as the write
    completes (here about a third of them): each task must end all the same."""
    monkeypatch.setattr(tasks, "RECANCEL_EVERY_S", 0.02)
    _, redis = services
    random.seed(0)

    async def announce_until(stop: asyncio.Event, client: Redis) -> None:
        while not stop.is_set():
            pipe = client.pipeline(transaction=True)
            pipe.set(f"{prefix}alive", "1")
            pipe.expire(f"{prefix}alive", 10)
            await pipe.execute()
            await asyncio.sleep(0.001)

    async def scenario() -> int:
        client = Redis.from_url(redis.address, socket_timeout=5.0)
        stop = asyncio.Event()
        left: set[asyncio.Task] = set()
        for _ in range(100):
            task = asyncio.create_task(announce_until(stop, client))
            await asyncio.sleep(random.random() * 0.01)
            left |= await cancel_and_wait([task], timeout_s=0.5)
        stop.set()  # what carried on ends at its loop's next turn
        await asyncio.gather(*left, return_exceptions=True)
        await client.aclose()
        return len(left)

    assert asyncio.run(scenario()) == 0
