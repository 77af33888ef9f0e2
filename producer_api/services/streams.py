"""Server-sent event plumbing shared by the job events route and the OpenAI streams."""

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent

from producer_api.services.fanout import SlowReader
from producer_api.services.fleet import Fleet
from producer_api.services.job_events import job_events
from queue_schemas import TokenEvent
from queue_schemas.redis_records import JobEvent
from queue_schemas.tasks import cancel_and_wait

_END = object()


async def _job_events(
    fleet: Fleet, tenant: str, job_id: str, after: int, resume_when_slow: bool
) -> AsyncGenerator[JobEvent, None]:
    """One job's events past ``after``; a reader dropped as slow carries on from the
    stored history where ``resume_when_slow`` says so."""
    last = after
    while True:
        try:
            async for event in job_events(fleet.store, fleet.fanout, tenant, job_id, last):
                if isinstance(event, TokenEvent):
                    last = event.last_index
                yield event
            return
        except SlowReader:
            if not resume_when_slow:
                raise


async def merged_events(
    fleet: Fleet,
    tenant: str,
    job_ids: list[str],
    after: int = -1,
    *,
    resume_when_slow: bool = False,
) -> AsyncIterator[tuple[int, JobEvent]]:
    """The events of several jobs (an OpenAI request's n choices) as they come, each
    tagged with its job's position; ends when every job has its result.

    A reader that falls a whole buffer behind gets ``SlowReader``, or, with
    ``resume_when_slow`` (clients that cannot resume themselves), carries on
    from the job's stored history.
    """
    streams = [_job_events(fleet, tenant, job_id, after, resume_when_slow) for job_id in job_ids]
    if len(streams) == 1:
        # NOTE: the usual request has one job: its events go straight through, with no
        # task and queue between Redis and the reader (a token costs a context switch less).
        async with contextlib.aclosing(streams[0]) as events:
            async for event in events:
                yield 0, event
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(position: int, events: AsyncIterator[JobEvent]) -> None:
        try:
            async for event in events:
                await queue.put((position, event))
            await queue.put((position, _END))
        except Exception as error:  # handed to the reader, which raises it
            await queue.put((position, error))

    pumps = [asyncio.create_task(pump(i, events)) for i, events in enumerate(streams)]
    try:
        remaining = len(pumps)
        while remaining:
            position, item = await queue.get()
            if item is _END:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield position, item  # type: ignore[misc]
    finally:
        await cancel_and_wait(pumps)


def event_stream(
    fleet: Fleet,
    events: AsyncIterator[ServerSentEvent],
    on_hang_up: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> EventSourceResponse:
    """An SSE response with keep-alive comments, counted while open. ``on_hang_up`` runs
    (in the background) when the client leaves before the events ran out."""
    gauge = fleet.metrics.streams_open

    async def counted() -> AsyncIterator[ServerSentEvent]:
        gauge.inc()
        finished = False
        try:
            async for event in events:
                yield event
            finished = True
        finally:
            gauge.dec()
            if not finished and on_hang_up is not None:
                # This generator is being cancelled: do the work in a task of its own.
                fleet.spawn(on_hang_up())

    return EventSourceResponse(counted(), ping=fleet.settings.sse_ping_s)
