"""Stopping tasks that lose a cancel (``queue_schemas.tasks``)."""

import asyncio
import contextlib
import time

from queue_schemas import tasks
from queue_schemas.tasks import cancel_and_wait


async def _drops_the_first_cancel(cleaned: list[str]) -> None:
    # As Python 3.11's wait_for does when its operation completes at the cancel:
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(3600)
    try:
        await asyncio.sleep(3600)
    finally:
        cleaned.append("done")


def test_a_task_that_drops_a_cancel_is_cancelled_again_until_it_ends(monkeypatch) -> None:
    monkeypatch.setattr(tasks, "RECANCEL_EVERY_S", 0.05)

    async def scenario() -> tuple[set[asyncio.Task], bool, list[str], float]:
        cleaned: list[str] = []
        task = asyncio.create_task(_drops_the_first_cancel(cleaned))
        await asyncio.sleep(0)
        began = time.monotonic()
        left = await cancel_and_wait([task], timeout_s=5)
        return left, task.cancelled(), cleaned, time.monotonic() - began

    left, cancelled, cleaned, took = asyncio.run(scenario())
    assert not left and cancelled and cleaned == ["done"]
    assert took < 1.0


def test_cleanup_shorter_than_the_interval_is_not_interrupted() -> None:
    async def cleans_up_slowly(cleaned: list[str]) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.2)  # e.g. a last commit
            cleaned.append("done")

    async def scenario() -> tuple[set[asyncio.Task], list[str]]:
        cleaned: list[str] = []
        task = asyncio.create_task(cleans_up_slowly(cleaned))
        await asyncio.sleep(0)
        return await cancel_and_wait([task], timeout_s=5), cleaned

    left, cleaned = asyncio.run(scenario())
    assert not left and cleaned == ["done"]


def test_a_task_that_never_ends_is_returned_after_the_timeout(monkeypatch) -> None:
    monkeypatch.setattr(tasks, "RECANCEL_EVERY_S", 0.05)

    async def ignores_cancels(stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await stop.wait()

    async def scenario() -> tuple[int, float]:
        stop = asyncio.Event()
        task = asyncio.create_task(ignores_cancels(stop))
        await asyncio.sleep(0)
        began = time.monotonic()
        left = await cancel_and_wait([task], timeout_s=0.3)
        took = time.monotonic() - began
        stop.set()
        await task
        return len(left), took

    left, took = asyncio.run(scenario())
    assert left == 1 and 0.3 <= took < 1.0
