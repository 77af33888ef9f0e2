"""One job's events for a reader: the stored history first, then live ones from the
fan-out, with no gap and no repeat.

A stream outlives a Redis outage: reads are retried until Redis answers again. A
stream whose job's state is gone for good (Redis restarted without its data and no
worker rewrote it) ends with a ``failed`` result that says so.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from producer_api.services.fanout import LiveFanout
from producer_api.stores.jobs import JobStore
from queue_schemas import JobResult, JobStatus
from queue_schemas.messages import now
from queue_schemas.redis_records import EventCursor, JobEvent, read_event

log = logging.getLogger("genfleet.api")
# A live channel silent this long: look at the stream again (pub/sub is at most once).
RECHECK_S = 2.0
# A streamed job whose state stays missing this long was lost with Redis's data.
LOST_AFTER_S = 30.0
OUTAGE_RETRY_S = 1.0


async def job_events(
    store: JobStore, fanout: LiveFanout, tenant: str, job_id: str, after: int = -1
) -> AsyncIterator[JobEvent]:
    """Every event of the job with a token index past ``after``, in order, ending with
    its result: the stored history first, then live ones, with no gap and no repeat.

    Raises ``SlowReader`` when the caller falls a whole buffer behind.
    """
    cursor = EventCursor(after)
    missing_since: float | None = None
    while True:
        try:
            # Subscribed (and confirmed) before reading the history: nothing falls
            # in between.
            async with fanout.listen(store.names.events_channel(tenant, job_id)) as live:
                while True:
                    for event in await store.history(tenant, job_id, cursor):
                        yield event
                        if isinstance(event, JobResult):
                            return
                    try:
                        while True:
                            async with asyncio.timeout(RECHECK_S):  # no task per token
                                payload = await live.get()
                            event = read_event(payload)
                            if cursor.is_new(event):
                                yield event
                                if isinstance(event, JobResult):
                                    return
                    except TimeoutError:
                        pass
                    if await store.exists(tenant, job_id):
                        missing_since = None
                        continue
                    missing_since = missing_since or time.monotonic()
                    if time.monotonic() - missing_since > LOST_AFTER_S:
                        yield _lost(tenant, job_id)
                        return
        except (RedisConnectionError, RedisTimeoutError) as error:
            log.warning("job %s stream: redis unavailable (%r); retrying", job_id, error)
            await asyncio.sleep(OUTAGE_RETRY_S)


def _lost(tenant: str, job_id: str) -> JobResult:
    return JobResult(
        job_id=job_id,
        tenant=tenant,
        status=JobStatus.FAILED,
        finish_reason="error",
        error="the job's state was lost from Redis; its result, if any, is on the results topic",
        finished_at=now(),
    )
