"""Streams through the API at scale and from the command line, on the shared fleet."""

import asyncio
import json
import subprocess
import sys

import httpx
from redis import Redis

from tests.integration.api_helpers import aread_events, auth
from tests.integration.conftest import ALICE


def test_200_concurrent_streams_share_one_pubsub_connection(api_fleet) -> None:
    api, _, _, redis_url = api_fleet
    redis = Redis.from_url(redis_url)
    fanout_connections: list[int] = []
    subscriptions: list[int] = []

    def watch() -> None:
        clients = redis.client_list()
        fanout = [c for c in clients if c["name"] == "genfleet-api-fanout"]
        fanout_connections.append(len(fanout))
        subscriptions.append(sum(int(c["sub"]) for c in fanout))

    async def scenario() -> list:
        limits = httpx.Limits(max_connections=250)
        async with httpx.AsyncClient(
            base_url=api.url, headers=auth(ALICE), timeout=180, limits=limits
        ) as client:
            body = {"messages": [{"role": "user", "content": "Hello"}],
                    "sampling": {"max_tokens": 24, "ignore_eos": True}}  # fmt: skip
            posts = await asyncio.gather(*(client.post("/v1/jobs", json=body) for _ in range(200)))
            assert all(p.status_code == 202 for p in posts)
            streams = asyncio.gather(*(aread_events(client, p.json()["id"]) for p in posts))
            while not streams.done():
                await asyncio.to_thread(watch)
                await asyncio.sleep(0.1)
            return await streams

    results = asyncio.run(scenario())
    assert len(results) == 200
    for streamed in results:
        assert streamed.final_event == "completed"
        assert streamed.text == streamed.result.text
        assert sum(len(e.token_ids) for e in streamed.tokens) == 24
    assert max(fanout_connections) == 1
    assert max(subscriptions) > 50  # many job channels, all on that one connection
    api_connections = [c for c in redis.client_list() if c["name"] == "genfleet-api"]
    assert len(api_connections) <= 32
    redis.close()


def test_genfleet_submit_prints_tokens_as_they_arrive(api_fleet) -> None:
    api, _, _, _ = api_fleet
    result = subprocess.run(
        [sys.executable, "-m", "genfleet.cli", "submit", "Hello there", "--stream",
         "--url", api.url, "--api-key", ALICE, "--max-tokens", "12"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) > 0
    queued = subprocess.run(
        [sys.executable, "-m", "genfleet.cli", "submit", "Hi", "--url", api.url,
         "--api-key", ALICE, "--max-tokens", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert json.loads(queued.stdout)["status"] == "queued"
