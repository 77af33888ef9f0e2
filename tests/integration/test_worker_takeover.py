"""A worker that dies or drains: its jobs go on elsewhere, each with exactly one result."""

import asyncio
import re
import time

from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from genfleet.chaos.target import Results, Target, job_record, produce
from queue_schemas import JobResult, JobStatus, Names
from queue_schemas.messages import now
from queue_schemas.redis_records import FINISH_SCRIPT, RESULT_SENT_FIELD, finish_call
from tests.integration.kafka_helpers import (
    TIMEOUT_S,
    all_ids,
    long_job,
    produce_records,
    read_topic,
    results_by_id,
)
from worker.engine_process.threads import threads_per_worker


def test_a_killed_worker_loses_no_job(services, start_worker, prefix) -> None:
    kafka, _ = services
    names = Names(prefix)
    ids = [f"k{i}" for i in range(24)]
    # Small steps keep both workers busy long enough for the kill to hit running jobs;
    # the two share the host's cores.
    share = ("--max-num-seqs", "4", "--engine-threads", str(threads_per_worker(2)))
    first = start_worker(*share)
    second = start_worker(*share)

    async def scenario() -> list[bytes]:
        await produce_records(kafka.address, names.jobs_topic, [long_job(i, 150) for i in ids])
        await read_topic(kafka.address, names.results_topic, lambda values: len(values) >= 2)
        first.process.kill()
        return await read_topic(kafka.address, names.results_topic, all_ids(ids))

    by_id = results_by_id(asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S)))
    assert sorted(by_id) == sorted(ids), second.log()
    # The survivor took over the dead worker's partitions in a second assignment.
    assert second.log().count("assigned") >= 2, second.log()
    duplicates = sum(len(rs) - 1 for rs in by_id.values())
    print(f"duplicate results after kill -9: {duplicates}")
    assert all(len({r.text for r in rs}) == 1 for rs in by_id.values())
    assert all(rs[0].status is JobStatus.COMPLETED for rs in by_id.values())


def _assignments(worker_log: str) -> list[set[str]]:
    """Each assignment the worker logged, as its ``topic:partition`` names."""
    return [
        set(re.findall(r"[\w.-]+:\d+", found))
        for found in re.findall(r"assigned \[([^\]]*)\]", worker_log)
    ]


def test_a_worker_that_drains_and_comes_back_loses_and_repeats_nothing(
    services, start_worker, prefix
) -> None:
    """SIGTERM drains and exits 0; the other worker takes the partitions over, and when
    the leaver comes back each worker gets half of each lane (the interactive lane is
    not left to one worker); every job has one result."""
    kafka, _ = services
    names = Names(prefix)
    ids = [f"s{i}" for i in range(16)]
    share = ("--max-num-seqs", "4", "--engine-threads", str(threads_per_worker(2)))
    staying = start_worker(*share)
    leaving = start_worker("--drain-deadline-s", "3", *share)

    async def first_results() -> None:
        await produce_records(kafka.address, names.jobs_topic, [long_job(i, 120) for i in ids])
        await read_topic(kafka.address, names.results_topic, lambda values: len(values) >= 2)

    asyncio.run(asyncio.wait_for(first_results(), TIMEOUT_S))
    leaving.process.terminate()
    assert leaving.process.wait(timeout=30) == 0, leaving.log()
    deadline = time.monotonic() + 30
    while not any(len(found) == 8 for found in _assignments(staying.log())):
        assert time.monotonic() < deadline, staying.log()
        time.sleep(0.2)
    returned = start_worker(*share)  # the jobs the leaver left are redelivered somewhere
    raw = asyncio.run(
        asyncio.wait_for(read_topic(kafka.address, names.results_topic, all_ids(ids)), TIMEOUT_S)
    )
    by_id = results_by_id(raw)
    assert sorted(by_id) == sorted(ids)
    assert all(len(results) == 1 for results in by_id.values()), by_id
    deadline = time.monotonic() + 30
    while len(after := _assignments(staying.log())[-1]) == 8:  # until it gives some back
        assert time.monotonic() < deadline, (staying.log(), returned.log())
        time.sleep(0.2)
    assert all(name.startswith(prefix) for name in after)
    lanes = [name.rsplit(":", 1)[0] for name in after]
    assert sorted(lanes) == sorted(list(names.lanes) * 2), after


async def _produce_as_the_dead_worker(bootstrap: str, names: Names, result: JobResult) -> None:
    """A result on the results topic as a worker produces it: keyed by the job id."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        value, key = result.model_dump_json().encode(), result.job_id.encode()
        await producer.send_and_wait(names.results_topic, value, key=key)
    finally:
        await producer.stop()


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
            await _produce_as_the_dead_worker(kafka.address, names, stored["produced"])
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
