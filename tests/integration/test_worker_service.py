"""The worker service against the real broker and Redis."""

import asyncio
import json
import random
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from redis.asyncio import Redis

from genfleet.chaos.target import Results, Target, job_record, produce
from queue_schemas import CancelJob, DeadLetter, JobResult, JobStatus, Names, TokenEvent
from queue_schemas.messages import now
from queue_schemas.redis_records import FINISH_SCRIPT, RESULT_SENT_FIELD, finish_call

TIMEOUT_S = 180


async def _produce(bootstrap: str, topic: str, records: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for raw in records:
            await producer.send_and_wait(topic, raw)
    finally:
        await producer.stop()


async def _read(bootstrap: str, topic: str, until: Callable[[list[bytes]], bool]) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        while not until(values):
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                values += [r.value for r in records]
    finally:
        await consumer.stop()
    return values


async def _stored(
    redis_url: str, names: Names, job_id: str
) -> tuple[dict[bytes, bytes], list[TokenEvent]]:
    """The job's Redis hash and the token events of its stream."""
    client = Redis.from_url(redis_url)
    try:
        state = await client.hgetall(names.job_key("default", job_id))
        entries = await client.xrange(names.events_stream("default", job_id))
    finally:
        await client.aclose()
    parsed = [json.loads(fields[b"event"]) for _, fields in entries]
    return state, [TokenEvent.model_validate(e) for e in parsed if e["kind"] == "token"]


def _job(job_id: str, rng: random.Random) -> bytes:
    return json.dumps(
        {
            "job_id": job_id,
            "messages": [{"role": "user", "content": f"Tell me about the number {job_id}."}],
            "sampling": {"temperature": 0, "max_tokens": rng.randint(3, 24), "ignore_eos": True},
            "priority": rng.choice([0, 1, 2]),
            "metadata": {"n": job_id},
        }
    ).encode()


def test_fifty_jobs_from_a_plain_producer_all_complete(services, start_worker, prefix) -> None:
    kafka, redis = services
    names = Names(prefix)
    worker = start_worker()
    rng = random.Random(0)
    ids = [f"job-{i}" for i in range(50)]

    async def scenario() -> list[JobResult]:
        await _produce(kafka.address, names.jobs_topic, [_job(i, rng) for i in ids])
        raw = await _read(
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
        state, events = asyncio.run(_stored(redis.address, names, job_id))
        assert state[b"status"] == b"completed" and state[b"text"].decode() == result.text
        unique = {e.token_index: e for e in events}
        assert "".join(unique[i].text for i in sorted(unique)) == result.text


def test_bad_records_go_to_the_dead_letter_topic(services, start_worker, prefix) -> None:
    kafka, _ = services
    names = Names(prefix)
    start_worker("--max-num-batched-tokens", "64")
    bad = {
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
        "no-prompt": "exactly one of prompt",
    }  # fmt: skip
    good = json.dumps(
        {"job_id": "good-after", "prompt": "Hello", "sampling": {"max_tokens": 4}}
    ).encode()

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        await _produce(kafka.address, names.jobs_topic, [*bad, good])
        letters = await _read(
            kafka.address, names.dead_letter_topic, lambda values: len(values) >= len(bad)
        )
        results = await _read(
            kafka.address, names.results_topic, _all_ids([*readable, "good-after"])
        )
        return letters, results

    letters, results = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    parsed = [DeadLetter.model_validate_json(v) for v in letters]
    for raw, reason in bad.items():
        letter = next(letter for letter in parsed if letter.raw == raw)
        assert reason in letter.reason
    by_id = _results_by_id(results)
    assert by_id["good-after"][0].status is JobStatus.COMPLETED
    # A bad job whose id is readable also fails visibly, for whoever waits on it.
    for job_id, reason in readable.items():
        failure = by_id[job_id][0]
        assert failure.status is JobStatus.FAILED and reason in failure.error


def _long_job(job_id: str, max_tokens: int) -> bytes:
    return json.dumps(
        {
            "job_id": job_id,
            "prompt": f"Once upon a time, job {job_id}",
            "sampling": {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True},
        }
    ).encode()


def _results_by_id(raw: list[bytes]) -> dict[str, list[JobResult]]:
    by_id: dict[str, list[JobResult]] = {}
    for value in raw:
        result = JobResult.model_validate_json(value)
        by_id.setdefault(result.job_id, []).append(result)
    return by_id


def _all_ids(ids: list[str]) -> Callable[[list[bytes]], bool]:
    return lambda values: {json.loads(v)["job_id"] for v in values} >= set(ids)


def test_a_killed_worker_loses_no_job(services, start_worker, prefix) -> None:
    kafka, _ = services
    names = Names(prefix)
    ids = [f"k{i}" for i in range(24)]
    # Small steps keep both workers busy long enough for the kill to hit running jobs.
    first = start_worker("--max-num-seqs", "4")
    second = start_worker("--max-num-seqs", "4")

    async def scenario() -> list[bytes]:
        await _produce(kafka.address, names.jobs_topic, [_long_job(i, 150) for i in ids])
        await _read(kafka.address, names.results_topic, lambda values: len(values) >= 2)
        first.process.kill()
        return await _read(kafka.address, names.results_topic, _all_ids(ids))

    by_id = _results_by_id(asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S)))
    assert sorted(by_id) == sorted(ids), second.log()
    # The survivor took over the dead worker's partitions in a second assignment.
    assert second.log().count("assigned") >= 2, second.log()
    duplicates = sum(len(rs) - 1 for rs in by_id.values())
    print(f"duplicate results after kill -9: {duplicates}")
    assert all(len({r.text for r in rs}) == 1 for rs in by_id.values())
    assert all(rs[0].status is JobStatus.COMPLETED for rs in by_id.values())


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
        await _produce(kafka.address, names.jobs_topic, [_long_job(i, 40) for i in ids])
        return await _read(kafka.address, names.results_topic, _all_ids(ids))

    by_id = _results_by_id(asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S)))
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
            await _produce(kafka.address, names.jobs_topic, [_long_job("c1", 900)])
            stream = names.events_stream("default", "c1")
            while not await client.xlen(stream):
                await asyncio.sleep(0.05)
            # A running job's stream already has its lifetime (its result would set it
            # too, but a job that never finishes must not leave its stream for ever).
            assert 0 < await client.ttl(stream) <= 86_400
            await client.set(names.cancel_key("default", "c1"), 1)
            await client.publish(names.control_channel, CancelJob(cancel="c1").model_dump_json())
            raw = await _read(kafka.address, names.results_topic, lambda values: len(values) >= 1)
            status = await client.hget(names.job_key("default", "c1"), "status")
        finally:
            await client.aclose()
        assert status == b"cancelled"
        return JobResult.model_validate_json(raw[0])

    result = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    assert result.status is JobStatus.CANCELLED
    assert 0 < result.usage.completion_tokens < 900
    assert "cancelled c1: 64/64 KV blocks free" in worker.log()


def test_sigterm_drains_and_exits_zero_without_losing_jobs(services, start_worker, prefix) -> None:
    kafka, _ = services
    names = Names(prefix)
    ids = [f"s{i}" for i in range(12)]
    worker = start_worker("--drain-deadline-s", "3", "--max-num-seqs", "4")

    async def first_results() -> None:
        await _produce(kafka.address, names.jobs_topic, [_long_job(i, 120) for i in ids])
        await _read(kafka.address, names.results_topic, lambda values: len(values) >= 1)

    asyncio.run(asyncio.wait_for(first_results(), TIMEOUT_S))
    worker.process.terminate()
    assert worker.process.wait(timeout=30) == 0, worker.log()
    start_worker()  # the jobs the first one left behind are redelivered here
    raw = asyncio.run(
        asyncio.wait_for(_read(kafka.address, names.results_topic, _all_ids(ids)), TIMEOUT_S)
    )
    assert sorted(_results_by_id(raw)) == sorted(ids)


def test_a_claimed_result_a_dead_worker_left_unsent_reaches_the_topic_once(
    services, start_worker, prefix
) -> None:
    """A worker claimed two results in Redis and died before marking them sent; one of
    them it had produced. Their redelivered records give exactly one result each."""
    kafka, redis = services
    target = Target(kafka.address, redis.address, prefix)
    names = target.names
    start_worker("--result-confirm-grace-s", "1")
    stored = {
        job_id: JobResult(
            job_id=job_id,
            status=JobStatus.COMPLETED,
            text=f"text of {job_id}",
            finish_reason="length",
            worker="the-dead-one",
            finished_at=now(),
        )
        for job_id in ("produced", "unproduced")
    }

    async def scenario() -> tuple[dict[str, list[JobResult]], list[bytes | None]]:
        client = Redis.from_url(redis.address)
        try:
            for result in stored.values():
                keys, args = finish_call(names, result, 100, 3600, time.time() - 30, "dead-0")
                assert await client.eval(FINISH_SCRIPT, len(keys), *keys, *args) == 1
            # As the dead worker produced it: keyed by the job id.
            producer = AIOKafkaProducer(bootstrap_servers=kafka.address, acks="all")
            await producer.start()
            try:
                produced = stored["produced"]
                value, key = produced.model_dump_json().encode(), produced.job_id.encode()
                await producer.send_and_wait(names.results_topic, value, key=key)
            finally:
                await producer.stop()
            async with Results(target) as results:
                await produce(target, [(None, job_record(job_id, 4)) for job_id in stored])

                async def marked() -> list[bytes | None]:
                    return [
                        await client.hget(names.job_key("default", j), RESULT_SENT_FIELD)
                        for j in stored
                    ]

                deadline = time.monotonic() + TIMEOUT_S
                while await marked() != [b"1", b"1"] and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                await asyncio.sleep(2.0)  # a second copy would arrive by now
                by_id: dict[str, list[JobResult]] = {}
                for result in results.parsed():
                    by_id.setdefault(result.job_id, []).append(result)
            return by_id, await marked()
        finally:
            await client.aclose()

    by_id, marks = asyncio.run(scenario())
    assert marks == [b"1", b"1"]
    assert {job_id: len(found) for job_id, found in by_id.items()} == {
        "produced": 1, "unproduced": 1,
    }  # fmt: skip
    # The result the dead worker claimed, not a new run of the job.
    assert by_id["unproduced"][0].text == "text of unproduced"


def test_a_long_waiting_queue_takes_more_jobs_than_redis_connections(
    services, start_worker, prefix
) -> None:
    """256 waiting jobs on a pool of 16 Redis connections: a fetch is one pipeline."""
    kafka, _ = services
    names = Names(prefix)
    worker = start_worker("--max-waiting", "256", "--redis-max-connections", "16")
    ids = [f"q{i}" for i in range(400)]

    async def scenario() -> list[bytes]:
        await _produce(kafka.address, names.jobs_topic, [job_record(i, 2) for i in ids])
        return await _read(kafka.address, names.results_topic, _all_ids(ids))

    raw = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    assert {job_id: len(found) for job_id, found in _results_by_id(raw).items()} == dict.fromkeys(
        ids, 1
    )
    assert worker.alive
