"""A stream client's buffer is bounded: a client that falls behind is dropped, not waited on."""

import asyncio

import pytest

from producer_api.services.fanout import Listener, SlowReader


def test_a_listener_delivers_in_order_and_is_dropped_when_full() -> None:
    async def scenario() -> None:
        listener = Listener(buffer=3)
        for payload in (b"1", b"2"):
            listener.offer(payload)
        assert [await listener.get(), await listener.get()] == [b"1", b"2"]
        for payload in (b"3", b"4", b"5", b"6"):  # one more than the buffer holds
            listener.offer(payload)
        assert listener.dropped
        with pytest.raises(SlowReader):
            await listener.get()

    asyncio.run(scenario())
