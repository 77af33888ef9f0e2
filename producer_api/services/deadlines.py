"""A request's deadline: from its headers, its body, or its route's default.

Clients say it in any of these ways; the earliest one given wins, and the route's
default (``ApiSettings``'s ``*_timeout_s``, off unless set) applies only when none
is given. The jobs carry it as an absolute ``deadline``, so every worker and a
batch line's retry read the same moment.

- ``Request-Timeout-Ms``: milliseconds from now, and ``Request-Deadline-Ms``:
  milliseconds since the Unix epoch (the headers of Baseten's proposal for
  OpenAI's clients, which some gateways send);
- ``timeout_s`` in the body (seconds from now; ``/v1/jobs``, and an extra field
  of the OpenAI bodies, e.g. through the openai client's ``extra_body``), and
  ``deadline`` (an ISO 8601 time) in a ``/v1/jobs`` body.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import Header

from queue_schemas.jobs import MAX_TIMEOUT_S
from queue_schemas.messages import now

TIMEOUT_HEADER = "Request-Timeout-Ms"
DEADLINE_HEADER = "Request-Deadline-Ms"
MAX_TIMEOUT_MS = int(MAX_TIMEOUT_S * 1000)
# Epoch milliseconds up to the year 9999, the last a datetime holds.
MAX_EPOCH_MS = 253_402_300_799_000


@dataclass(frozen=True)
class DeadlineHeaders:
    timeout_ms: int | None = None
    deadline_ms: int | None = None

    def deadline(
        self,
        body_deadline: datetime | None = None,
        body_timeout_s: float | None = None,
        default_timeout_s: float | None = None,
    ) -> datetime | None:
        """The earliest deadline given, else the route's default (None: no deadline)."""
        start = now()
        given = [body_deadline] if body_deadline is not None else []
        if body_timeout_s is not None:
            given.append(start + timedelta(seconds=body_timeout_s))
        if self.timeout_ms is not None:
            given.append(start + timedelta(milliseconds=self.timeout_ms))
        if self.deadline_ms is not None:
            given.append(datetime.fromtimestamp(self.deadline_ms / 1000, UTC))
        if not given and default_timeout_s is not None:
            given.append(start + timedelta(seconds=default_timeout_s))
        return min(given, default=None)


def deadline_headers(
    timeout_ms: Annotated[
        int | None,
        Header(alias=TIMEOUT_HEADER, gt=0, le=MAX_TIMEOUT_MS, description="deadline, from now"),
    ] = None,
    deadline_ms: Annotated[
        int | None,
        Header(alias=DEADLINE_HEADER, ge=0, le=MAX_EPOCH_MS, description="deadline, epoch ms"),
    ] = None,
) -> DeadlineHeaders:
    return DeadlineHeaders(timeout_ms, deadline_ms)
