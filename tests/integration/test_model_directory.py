"""Which models the API serves: what live workers announce in a real Redis, nothing
that a dead worker announced, and OpenAI's 404 for the rest."""

import asyncio
import time

import pytest
from redis.asyncio import Redis

from producer_api.errors import ApiError
from producer_api.services.models import ModelDirectory
from queue_schemas import Names
from queue_schemas.announcements import ANNOUNCEMENT_TTL_S, WorkerAnnouncement, announce, withdraw


def _announcement(worker: str, model: str, default_lanes: bool, at: float) -> WorkerAnnouncement:
    return WorkerAnnouncement(
        worker_id=worker, model=model, default_lanes=default_lanes,
        max_model_len=2048, kv_blocks_total=8, kv_blocks_free=8, running=0, waiting=0,
        announced_at=at,
    )  # fmt: skip


def test_live_named_workers_are_served_and_dead_or_withdrawn_ones_are_not(services, prefix) -> None:
    names = Names(prefix)

    async def scenario() -> None:
        redis = Redis.from_url(services[1].address)
        now = time.time()
        pipe = redis.pipeline()
        announce(pipe, names, _announcement("w-old", "gone", False, now - 2 * ANNOUNCEMENT_TTL_S))
        announce(pipe, names, _announcement("w-coder", "coder", False, now))
        announce(pipe, names, _announcement("w-default", "chat", True, now))
        await pipe.execute()
        # The dead worker's id left the set when the live ones announced.
        assert await redis.zscore(names.live_workers_key, "w-old") is None
        directory = ModelDirectory(redis, names, "chat")
        assert await directory.served_models() == ["chat", "coder"]
        assert await directory.context_lengths(["chat", "coder"]) == {"chat": 2048, "coder": 2048}
        assert await directory.resolve("coder") == "coder"
        assert await directory.resolve(None) == "chat"
        assert directory.lanes("coder") == names.for_model("coder")
        assert directory.lanes("chat") == names
        for unknown in ("gone", "nobody"):
            with pytest.raises(ApiError) as refused:
                await directory.resolve(unknown)
            assert (refused.value.status, refused.value.code) == (404, "model_not_found")
        # A worker that starts after a miss is found by the next request at once.
        late = ModelDirectory(redis, names, "chat")
        assert await late.served_models() == ["chat", "coder"]
        pipe = redis.pipeline()
        announce(pipe, names, _announcement("w-late", "late", False, time.time()))
        withdraw(pipe, names, "w-coder")
        await pipe.execute()
        assert await late.resolve("late") == "late"
        assert await ModelDirectory(redis, names, "chat").served_models() == ["chat", "late"]
        await redis.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_context_length_missing_from_the_last_read_is_read_again(services, prefix) -> None:
    """A fleet starting: the API read the announcements between its workers' first ones
    (the named model's, not yet the default's). Listing both must not leave the
    default without its ``max_model_len`` for the rest of that read's life."""
    names = Names(prefix)

    async def scenario() -> None:
        redis = Redis.from_url(services[1].address)
        directory = ModelDirectory(redis, names, "chat")
        pipe = redis.pipeline()
        announce(pipe, names, _announcement("w-coder", "coder", False, time.time()))
        await pipe.execute()
        assert await directory.served_models() == ["chat", "coder"]  # read: coder's alone
        pipe = redis.pipeline()
        announce(pipe, names, _announcement("w-default", "chat", True, time.time()))
        await pipe.execute()
        lengths = await directory.context_lengths(["chat", "coder"])
        assert lengths == {"chat": 2048, "coder": 2048}
        # A model no live worker serves stays without one (and costs one read more).
        assert await directory.context_lengths(["chat", "absent"]) == {"chat": 2048}
        await redis.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 30))
