"""A job's deadline: not started once it has passed, stopped when it passes while running.

A job record may carry a ``deadline`` and a ``timeout_s`` (``JobRequest.expires_at``).
One that a worker reads too late ends ``expired`` without reaching the engine; one
that is running when its deadline comes is aborted then (its KV blocks are freed at
once) and ends ``expired`` with the tokens it has. A timer per running job keeps
the stop on time; one far away costs nothing until it fires.
"""

import asyncio
from collections.abc import Callable
from datetime import datetime

from queue_schemas.messages import now
from worker.service.flights import InFlight


def has_passed(expires_at: datetime | None) -> bool:
    return expires_at is not None and expires_at <= now()


def stop_at_deadline(flight: InFlight, abort: Callable[[InFlight], None]) -> None:
    """Abort the flight when its deadline passes (at once if it has)."""
    if flight.expires_at is None:
        return

    def expire() -> None:
        flight.expired = True
        abort(flight)

    delay = max(0.0, (flight.expires_at - now()).total_seconds())
    flight.timer = asyncio.get_running_loop().call_later(delay, expire)
