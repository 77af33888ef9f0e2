"""Calls to Redis and Kafka that wait out an outage instead of failing the worker.

A ``Dependency`` retries a call with capped exponential backoff while the
failure is one of its transient errors, logs the outage once when it starts
and once when it ends, and counts outages so that callers can repair what an
outage may have lost (Redis restarted empty).
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger("genfleet.worker")
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 2.0
T = TypeVar("T")


class Dependency:
    """``transient(error)`` says whether an error is an outage worth waiting out."""

    def __init__(self, name: str, transient: Callable[[BaseException], bool]) -> None:
        self.name = name
        self.transient = transient
        self.down_since: float | None = None
        self.outages = 0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, error: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.outages += 1
            log.warning("%s unavailable (%r): retrying with backoff", self.name, error)

    def answered(self) -> None:
        if self.down_since is not None:
            log.info("%s back after %.1f s", self.name, time.monotonic() - self.down_since)
            self.down_since = None

    async def call(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` until it returns; only non-transient errors propagate."""
        delay = FIRST_DELAY_S
        while True:
            try:
                result = await attempt()
            except Exception as error:
                if not self.transient(error):
                    raise
                self.failed(error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_DELAY_S)
                continue
            self.answered()
            return result
