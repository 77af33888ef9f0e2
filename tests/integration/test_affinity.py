"""Affinity in the fleet: a conversation's turns share a record key (so a partition, so
a worker's prefix cache); a hot key spills over partitions, counted in a real Redis
that every API process shares."""

import asyncio
import json
import re
import time

from aiokafka.partitioner import DefaultPartitioner
from openai import OpenAI
from redis.asyncio import Redis

from producer_api.services.affinity import Spill
from queue_schemas import Names
from tests.integration.conftest import ALICE

PARTITIONS = 4


def test_a_hot_key_spills_over_partitions_and_a_calm_one_never_does(services, prefix) -> None:
    _, redis_service = services

    async def scenario() -> tuple[list[str], list[str]]:
        redis = Redis.from_url(redis_service.address)
        # Two API processes; an hour's window, so the test cannot straddle two.
        first, second = (Spill(redis, Names(prefix), spill_after=8, window_s=3600) for _ in "ab")
        lanes = await first.lanes(["t/hot"] * 20 + ["t/calm"])
        lanes += await second.lanes(["t/hot"] * 44 + ["t/calm"])
        await redis.aclose()
        return lanes[:21], lanes[21:]

    one, two = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert one == ["t/hot"] * 8 + ["t/hot#1"] * 8 + ["t/hot#2"] * 4 + ["t/calm"]
    # The second process counts on from the first's jobs.
    assert two[:4] == ["t/hot#2"] * 4 and two[4:12] == ["t/hot#3"] * 8 and two[-1] == "t/calm"
    hot_lanes = sorted(set(one + two) - {"t/calm"})
    assert len(hot_lanes) == 8
    partitions = {
        DefaultPartitioner()(lane.encode(), list(range(PARTITIONS)), []) for lane in hot_lanes
    }
    assert len(partitions) >= 3, partitions


def _keys(worker_log: str, run_id: str) -> set[tuple[str, int]]:
    """The record keys and partitions the worker logged for a request's jobs."""
    found = set()
    for line in worker_log.splitlines():
        if line.startswith("{") and f'"{run_id}-' in line:
            record = json.loads(line)
            if re.fullmatch(rf"{run_id}-\d+", record.get("job_id", "")) and "key" in record:
                found.add((record["key"], record["partition"]))
    return found


def test_the_turns_of_a_conversation_share_a_key_and_a_partition(api_fleet) -> None:
    api, worker, _, _ = api_fleet
    client = OpenAI(base_url=f"{api.url}/v1", api_key=ALICE, max_retries=0, timeout=120)

    def ask(messages: list[dict[str, str]], **extra) -> str:
        answer = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=messages, max_tokens=3, temperature=0, **extra
        )
        return answer.id

    system = {"role": "system", "content": "Answer in one word."}
    turn1 = [system, {"role": "user", "content": "Name a colour."}]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?"},
    ]
    other = [system, {"role": "user", "content": "Name a fruit."}]
    runs = {
        "turn1": ask(turn1),
        "turn2": ask(turn2),
        "other": ask(other),
        "n2": ask(other, n=2),
        "hinted": ask(turn1, extra_body={"prompt_cache_key": "session-1"}),
        "hinted_other": ask(other, extra_body={"prompt_cache_key": "session-1"}),
    }
    # The worker logs a job after its result went out: the client may be faster.
    deadline = time.monotonic() + 30
    while True:
        log = worker.log()
        keys = {name: _keys(log, run_id) for name, run_id in runs.items()}
        if all(keys.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert all(len(found) == 1 for found in keys.values()), keys
    assert keys["turn1"] == keys["turn2"]
    assert keys["other"] == keys["n2"] != keys["turn1"]
    assert keys["hinted"] == keys["hinted_other"] != keys["turn1"]
    ((key, _),) = keys["turn1"]
    assert key.startswith("alice/")
