"""The worker service against the real broker and Redis."""

import asyncio
import hashlib
import json
import random

from redis.asyncio import Redis

from genfleet.chaos.target import job_record
from queue_schemas import CancelJob, DeadLetter, JobResult, JobStatus, Names
from tests.integration.kafka_helpers import (
    TIMEOUT_S,
    all_ids,
    long_job,
    produce_records,
    random_job,
    read_topic,
    results_by_id,
    stored,
)


def test_fifty_jobs_from_a_plain_producer_all_complete(services, start_worker, prefix) -> None:
    kafka, redis = services
    names = Names(prefix)
    worker = start_worker()
    rng = random.Random(0)
    ids = [f"job-{i}" for i in range(50)]

    async def scenario() -> list[JobResult]:
        await produce_records(kafka.address, names.jobs_topic, [random_job(i, rng) for i in ids])
        raw = await read_topic(
            kafka.address,
            names.results_topic,
            lambda values: len({json.loads(v)["job_id"] for v in values}) >= len(ids),
        )
        return [JobResult.model_validate_json(v) for v in raw]

    results = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    by_id: dict[str, list[JobResult]] = {}
    for result in results:
        by_id.setdefault(result.job_id, []).append(result)
    assert sorted(by_id) == sorted(ids), worker.log()
    assert all(len(rs) == 1 for rs in by_id.values())  # no crash here: exactly one each
    for job_id, (result,) in by_id.items():
        assert result.status is JobStatus.COMPLETED
        assert result.metadata == {"n": job_id}
        assert result.usage.completion_tokens == len(result.token_ids) > 0
        state, events = asyncio.run(stored(redis.address, names, job_id))
        assert state[b"status"] == b"completed" and state[b"text"].decode() == result.text
        unique = {e.token_index: e for e in events}
        assert "".join(unique[i].text for i in sorted(unique)) == result.text


def test_bad_records_go_to_the_dead_letter_topic(services, start_worker, prefix) -> None:
    kafka, _ = services
    names = Names(prefix)
    start_worker("--max-num-batched-tokens", "64", "--max-record-bytes", "8192")
    oversized = {"job_id": "oversized", "tenant": "default", "prompt": "x" * 10_000}
    bad = {
        # Over the cap: the job its first members name ends failed; one named only
        # past the first 64 KiB cannot be, and stays a dead letter.
        json.dumps(oversized).encode(): "larger than the limit of 8192",
        json.dumps({"prompt": "x" * 70_000, "job_id": "named-late"}).encode(): "larger than",
        b"\xff\xfe\x00 not utf-8": "invalid UTF-8",
        b"{not json": "not JSON",
        json.dumps({"job_id": "wrong-types", "prompt": 5}).encode(): "prompt",
        json.dumps(
            {"job_id": "future", "prompt": "x", "schema_version": 9}
        ).encode(): "schema_version",
        json.dumps({"job_id": "too-long", "prompt_token_ids": [5] * 2000}).encode(): "context",
        json.dumps({"job_id": "no-prompt"}).encode(): "exactly one of prompt",
    }
    readable = {
        "wrong-types": "prompt", "future": "schema_version", "too-long": "context",
        "no-prompt": "exactly one of prompt", "oversized": "larger than the limit",
    }  # fmt: skip
    good = json.dumps(
        {"job_id": "good-after", "prompt": "Hello", "sampling": {"max_tokens": 4}}
    ).encode()

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        await produce_records(kafka.address, names.jobs_topic, [*bad, good])
        letters = await read_topic(
            kafka.address, names.dead_letter_topic, lambda values: len(values) >= len(bad)
        )
        results = await read_topic(
            kafka.address, names.results_topic, all_ids([*readable, "good-after"])
        )
        return letters, results

    letters, results = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    parsed = [DeadLetter.model_validate_json(v) for v in letters]
    for raw, reason in bad.items():
        digest = hashlib.sha256(raw).hexdigest()  # a large record's letter holds its start
        letter = next(letter for letter in parsed if letter.raw_sha256 == digest)
        assert reason in letter.reason
    by_id = results_by_id(results)
    assert by_id["good-after"][0].status is JobStatus.COMPLETED
    # A bad job whose id is readable also fails visibly, for whoever waits on it.
    for job_id, reason in readable.items():
        (failure,) = by_id[job_id]  # exactly once
        assert failure.status is JobStatus.FAILED and reason in failure.error
    assert "named-late" not in by_id


def test_backpressure_pauses_and_resumes_and_finishes_everything(
    services, start_worker, prefix
) -> None:
    kafka, _ = services
    names = Names(prefix)
    ids = [f"b{i}" for i in range(40)]
    # 16 blocks of 16 slots: room for about four of these jobs at once.
    worker = start_worker(
        "--num-gpu-blocks-override", "16", "--max-waiting", "4",
        "--low-watermark", "0.1", "--high-watermark", "0.3",
    )  # fmt: skip

    async def scenario() -> list[bytes]:
        await produce_records(kafka.address, names.jobs_topic, [long_job(i, 40) for i in ids])
        return await read_topic(kafka.address, names.results_topic, all_ids(ids))

    by_id = results_by_id(asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S)))
    assert sorted(by_id) == sorted(ids)
    log = worker.log()
    assert "paused intake" in log and "resumed intake" in log, log
    assert "Traceback" not in log


def test_cancelling_a_running_job_frees_its_blocks(services, start_worker, prefix) -> None:
    kafka, redis = services
    names = Names(prefix)
    worker = start_worker("--num-gpu-blocks-override", "64")

    async def scenario() -> JobResult:
        client = Redis.from_url(redis.address)
        try:
            await produce_records(kafka.address, names.jobs_topic, [long_job("c1", 900)])
            stream = names.events_stream("default", "c1")
            while not await client.xlen(stream):
                await asyncio.sleep(0.05)
            # A running job's stream already has its lifetime (its result would set it
            # too, but a job that never finishes must not leave its stream for ever).
            assert 0 < await client.ttl(stream) <= 86_400
            await client.set(names.cancel_key("default", "c1"), 1)
            await client.publish(names.control_channel, CancelJob(cancel="c1").model_dump_json())
            raw = await read_topic(
                kafka.address, names.results_topic, lambda values: len(values) >= 1
            )
            status = await client.hget(names.job_key("default", "c1"), "status")
        finally:
            await client.aclose()
        assert status == b"cancelled"
        return JobResult.model_validate_json(raw[0])

    result = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    assert result.status is JobStatus.CANCELLED
    assert 0 < result.usage.completion_tokens < 900
    assert "cancelled c1: 64/64 KV blocks free" in worker.log()


def test_a_long_waiting_queue_takes_more_jobs_than_redis_connections(
    services, start_worker, prefix
) -> None:
    """256 waiting jobs on a pool of 16 Redis connections: a fetch is one pipeline."""
    kafka, _ = services
    names = Names(prefix)
    worker = start_worker("--max-waiting", "256", "--redis-max-connections", "16")
    ids = [f"q{i}" for i in range(400)]

    async def scenario() -> list[bytes]:
        await produce_records(kafka.address, names.jobs_topic, [job_record(i, 2) for i in ids])
        return await read_topic(kafka.address, names.results_topic, all_ids(ids))

    raw = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    assert {job_id: len(found) for job_id, found in results_by_id(raw).items()} == dict.fromkeys(
        ids, 1
    )
    assert worker.alive
