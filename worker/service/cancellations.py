"""Cancellations from the control channel, applied to the jobs this worker runs.

After a Redis outage the cancel marks of running jobs are read again: a message
published meanwhile is lost, the mark is not.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable

from pydantic import ValidationError
from redis.asyncio import Redis

from queue_schemas import CancelJob
from worker.service.flights import Flights, InFlight
from worker.service.publisher import RedisPublisher, redis_outage

log = logging.getLogger("genfleet.worker")
RECONNECT_DELAY_S = 1.0


class Cancellations:
    def __init__(
        self,
        listener: Redis,
        channel: str,
        publisher: RedisPublisher,
        running: Flights,
        abort: Callable[[InFlight], None],
    ) -> None:
        self.listener = listener
        self.channel = channel
        self.publisher = publisher
        self.running = running
        self.abort = abort

    async def run(self) -> None:
        while True:
            pubsub = self.listener.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                await self._recheck()
                async for message in pubsub.listen():
                    if message["type"] == "message":
                        self.on_message(message["data"])
            except Exception as error:
                if not redis_outage(error):
                    raise
                self.publisher.available.failed(error)
                await asyncio.sleep(RECONNECT_DELAY_S)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    def on_message(self, data: bytes) -> None:
        try:
            cancel = CancelJob.model_validate_json(data)
        except ValidationError:
            log.warning("ignoring control message %r", data[:200])
            return
        flight = self.running.get((cancel.tenant, cancel.cancel))
        if flight is not None:
            log.info("cancelling %s", cancel.cancel)
            self.abort(flight)

    async def _recheck(self) -> None:
        flights = list(self.running)
        marks = await self.publisher.cancelled([flight.key for flight in flights])
        for flight, cancelled in zip(flights, marks, strict=True):
            if cancelled:
                log.info("cancelling %s", flight.job.job_id)
                self.abort(flight)
