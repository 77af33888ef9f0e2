"""The worker's side of Redis: events, job states, result claims, and repair after an outage.

Each engine step's events and any finished jobs' claims go out in one pipeline
(``queue_schemas.redis_records`` has the layout and the claim protocol). Every
call waits out a Redis outage (``Dependency``) rather than failing the worker;
events of the steps run meanwhile are written, in order, when Redis is back.

Whether Redis came back without its data is told by a key of this worker's
that it sets at start: gone after an outage, Redis lost everything, and the
state and every event of each job the worker holds are written again before
anything else, so a reader of a running job misses nothing.
"""

import logging
import time
from collections.abc import Callable, Sequence

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from queue_schemas import JobResult, JobState, JobStatus, Names, TokenEvent
from queue_schemas.announcements import WorkerAnnouncement, announce, withdraw
from queue_schemas.messages import now
from queue_schemas.redis_records import (
    DELIVERY_FIELDS,
    FINISH_SCRIPT,
    START_SCRIPT,
    Delivery,
    append_event,
    delivery,
    finish_call,
    mark_sent,
    start_call,
    streamed_output,
    write_state,
)
from worker.service.retry import Dependency

TenantEvent = tuple[str, TokenEvent]  # the tenant the job belongs to, one of its events
History = tuple[str, str, list[TokenEvent]]  # tenant, job id, every event so far


log = logging.getLogger("genfleet.worker")


def redis_outage(error: BaseException) -> bool:
    return isinstance(error, RedisConnectionError | RedisTimeoutError | OSError)


class RedisPublisher:
    def __init__(self, redis: Redis, names: Names, maxlen: int, ttl_s: int, worker: str) -> None:
        self.client = redis
        self.worker = worker
        self.names = names
        self.maxlen = maxlen
        self.ttl_s = ttl_s
        self.available = Dependency("redis", redis_outage)
        self._finish = redis.register_script(FINISH_SCRIPT)
        self._start = redis.register_script(START_SCRIPT)
        self._marker = names.worker_marker(worker)
        self._outages_checked = 0

    async def probe(self) -> None:
        """One PING while Redis is marked away. Calls in flight find it back on their
        own; an idle worker has none, and would keep its intake paused for ever."""
        try:
            await self.client.ping()
        except Exception as error:
            if not redis_outage(error):
                raise
            return
        self.available.answered()

    async def mark(self) -> None:
        """Set the marker whose absence after an outage means Redis lost its data."""
        await self.available.call(lambda: self.client.set(self._marker, 1))

    async def announce(self, announcement: WorkerAnnouncement) -> None:
        """Tell the API this worker is alive, what it serves and how loaded it is."""

        async def attempt() -> None:
            pipe = self.client.pipeline(transaction=True)
            announce(pipe, self.names, announcement)
            await pipe.execute()

        await self.available.call(attempt)

    async def withdraw(self) -> None:
        """Out of the live workers at once (a clean stop), rather than after the TTL."""
        pipe = self.client.pipeline(transaction=True)
        withdraw(pipe, self.names, self.worker)
        await pipe.execute()

    async def publish(
        self,
        events: Sequence[TenantEvent],
        finished: Sequence[tuple[JobResult, str]],
        history: Callable[[], list[History]],
    ) -> list[bool]:
        """One step's events, then a claim for each (result, claimant); True where this
        claimant won the job's result and so must send it to the results topic.
        ``history`` gives every job the worker holds, to rewrite if Redis lost it."""
        if not events and not finished:
            return []

        async def attempt() -> list[bool]:
            if self._outages_checked != self.available.outages:
                if await self.client.set(self._marker, 1, nx=True):
                    await self._rewrite(history())
                self._outages_checked = self.available.outages
            pipe = self.client.pipeline(transaction=False)
            for tenant, event in events:
                append_event(pipe, self.names, tenant, event, self.maxlen, self.ttl_s)
            claimed_at = time.time()
            for result, claimant in finished:
                keys, args = finish_call(
                    self.names, result, self.maxlen, self.ttl_s, claimed_at, claimant
                )
                await self._finish(keys=keys, args=args, client=pipe)
            replies = await pipe.execute()
            return [bool(reply) for reply in replies[len(replies) - len(finished) :]]

        return await self.available.call(attempt)

    async def streamed(self, jobs: Sequence[tuple[str, str]]) -> list[list[TokenEvent]]:
        """What readers hold of each (tenant, job id)'s output: earlier attempts' token
        events as a reader de-duplicates them, contiguous from index 0."""

        async def attempt() -> list[list[TokenEvent]]:
            pipe = self.client.pipeline(transaction=False)
            for tenant, job_id in jobs:
                pipe.xrange(self.names.events_stream(tenant, job_id), "-", "+")
            return [streamed_output(entries or []) for entries in await pipe.execute()]

        return await self.available.call(attempt)

    async def mark_sent(self, jobs: Sequence[tuple[str, str]]) -> None:
        """These (tenant, job id)s have their result on the results topic."""
        if not jobs:
            return

        async def attempt() -> None:
            pipe = self.client.pipeline(transaction=False)
            for tenant, job_id in jobs:
                mark_sent(pipe, self.names, tenant, job_id)
            await pipe.execute()

        await self.available.call(attempt)

    async def start(self, jobs: Sequence[tuple[str, str]]) -> list[bool]:
        """State ``running`` for these (tenant, job id)s; False for a job that became final
        in the meantime (and so is not to be run)."""
        if not jobs:
            return []

        async def attempt() -> list[bool]:
            pipe = self.client.pipeline(transaction=False)
            for tenant, job_id in jobs:
                state = self._running(tenant, job_id)
                keys, args = start_call(self.names, state, self.ttl_s)
                await self._start(keys=keys, args=args, client=pipe)
            return [bool(reply) for reply in await pipe.execute()]

        return await self.available.call(attempt)

    def _running(self, tenant: str, job_id: str) -> JobState:
        return JobState(
            job_id=job_id,
            tenant=tenant,
            status=JobStatus.RUNNING,
            updated_at=now(),
            worker=self.worker,
        )

    async def deliveries(self, jobs: Sequence[tuple[str, str]]) -> list[Delivery]:
        """For each (tenant, job id): what earlier deliveries of the job left in Redis."""
        if not jobs:
            return []

        async def attempt() -> list[Delivery]:
            pipe = self.client.pipeline(transaction=False)
            for tenant, job_id in jobs:
                pipe.hmget(self.names.job_key(tenant, job_id), list(DELIVERY_FIELDS))
                pipe.exists(self.names.cancel_key(tenant, job_id))
            replies = await pipe.execute()
            return [delivery(replies[i], bool(replies[i + 1])) for i in range(0, len(replies), 2)]

        return await self.available.call(attempt)

    async def cancelled(self, jobs: Sequence[tuple[str, str]]) -> list[bool]:
        """Which of these (tenant, job id)s carry a cancel mark."""
        if not jobs:
            return []

        async def attempt() -> list[bool]:
            pipe = self.client.pipeline(transaction=False)
            for tenant, job_id in jobs:
                pipe.exists(self.names.cancel_key(tenant, job_id))
            return [bool(reply) for reply in await pipe.execute()]

        return await self.available.call(attempt)

    async def _rewrite(self, jobs: list[History]) -> None:
        log.warning("redis lost its data: writing the state and events of %d jobs again", len(jobs))
        pipe = self.client.pipeline(transaction=False)
        for tenant, job_id, events in jobs:
            write_state(pipe, self.names, self._running(tenant, job_id), self.ttl_s)
            for event in events:
                append_event(pipe, self.names, tenant, event, self.maxlen, self.ttl_s)
        await pipe.execute()
