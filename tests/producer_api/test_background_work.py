"""Work the API runs past its request (a cancel on hang-up) says why it failed."""

import asyncio
import gc
import logging

from producer_api.metrics import ApiMetrics
from producer_api.services.fleet import Fleet
from producer_api.settings import ApiSettings


def test_failed_background_work_is_logged_once_with_its_reason(caplog) -> None:
    async def scenario() -> None:
        fleet = Fleet(ApiSettings(), ApiMetrics())

        async def cancel_while_redis_is_away() -> None:
            raise ConnectionError("Error 111 connecting to redis")

        async def finishes() -> None:
            await asyncio.sleep(0)

        fleet.spawn(cancel_while_redis_is_away())
        fleet.spawn(finishes())
        await asyncio.sleep(0.05)
        assert not fleet._background  # both done and let go
        await fleet.redis.aclose()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
        gc.collect()  # where asyncio would log an exception nobody retrieved
    failed = [r for r in caplog.records if "background work failed" in r.getMessage()]
    assert len(failed) == 1 and "Error 111" in failed[0].getMessage()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_cancelled_background_work_is_not_a_failure(caplog) -> None:
    async def scenario() -> None:
        fleet = Fleet(ApiSettings(), ApiMetrics())
        fleet.spawn(asyncio.sleep(60))
        await asyncio.sleep(0)
        for task in list(fleet._background):
            task.cancel()
        await asyncio.sleep(0.01)
        assert not fleet._background
        await fleet.redis.aclose()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if "background work failed" in r.getMessage()]
