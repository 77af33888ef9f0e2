"""Live events for every stream client of this process over one Redis pub/sub connection.

A client registers for a job's channel and gets a bounded queue. One reader
task takes each message off the shared connection and offers it to the
channel's queues without waiting: a client whose queue is full is dropped
(its stream ends and it can resume with ``Last-Event-ID``), so one slow
reader never holds up the others. Channels are subscribed while at least one
client listens, and a registration returns only after Redis confirmed the
subscription, so a reader that then reads the job's history misses nothing.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from queue_schemas.tasks import cancel_and_wait

log = logging.getLogger("genfleet.api")
CLIENT_NAME = "genfleet-api-fanout"
CONFIRM_TIMEOUT_S = 5.0


class SlowReader(Exception):
    """The client fell a whole buffer behind and was dropped."""


class Listener:
    def __init__(self, buffer: int) -> None:
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(buffer)
        self.dropped = False

    def offer(self, payload: bytes) -> None:
        if self.dropped:
            return
        try:
            self._queue.put_nowait(payload)
        except asyncio.QueueFull:
            self.dropped = True

    async def get(self) -> bytes:
        # A dropped listener's queue is full, so this never waits on a dead client.
        if self.dropped:
            raise SlowReader
        return await self._queue.get()


@dataclass
class _Channel:
    listeners: set[Listener] = field(default_factory=set)
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)


class LiveFanout:
    def __init__(self, redis_url: str, home_channel: str, buffer: int) -> None:
        self.redis = Redis.from_url(redis_url, client_name=CLIENT_NAME)
        self.pubsub = self.redis.pubsub()
        # Always subscribed: the connection is up from the start and the reader never idles.
        self.home_channel = home_channel
        self.buffer = buffer
        self.channels: dict[str, _Channel] = {}
        self._reader: asyncio.Task | None = None

    async def start(self) -> None:
        """Start reading; Redis may still be away (the API starts anyway, /readyz says so)."""
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if self._reader is not None:
            await cancel_and_wait([self._reader])
        await self.pubsub.aclose()
        await self.redis.aclose()

    @contextlib.asynccontextmanager
    async def listen(self, channel_name: str) -> AsyncIterator[Listener]:
        listener = Listener(self.buffer)
        new = channel_name not in self.channels
        channel = self.channels.setdefault(channel_name, _Channel())
        channel.listeners.add(listener)
        try:
            if new:
                await self.pubsub.subscribe(channel_name)
            try:
                await asyncio.wait_for(channel.confirmed.wait(), CONFIRM_TIMEOUT_S)
            except TimeoutError as error:
                raise RedisConnectionError(
                    f"no SUBSCRIBE confirmation for {channel_name}"
                ) from error
            yield listener
        finally:
            channel.listeners.discard(listener)
            if not channel.listeners and self.channels.get(channel_name) is channel:
                del self.channels[channel_name]
                await self.pubsub.unsubscribe(channel_name)

    async def _read(self) -> None:
        while True:
            try:
                if not self.pubsub.subscribed:
                    await self.pubsub.subscribe(self.home_channel)
                message = await self.pubsub.get_message(timeout=1.0)
            except Exception as error:  # Redis away: readers re-check the streams
                log.warning("live fan-out: %r; retrying", error)
                await asyncio.sleep(1.0)
                continue
            if message is None:
                continue
            name = message["channel"].decode()
            channel = self.channels.get(name)
            if channel is None:
                continue
            if message["type"] == "subscribe":
                channel.confirmed.set()
            elif message["type"] == "message":
                for listener in channel.listeners:
                    listener.offer(message["data"])
