"""The scenarios: each attacks the target one way and returns a ``Verdict``.

Every scenario uses job ids of its own run, so they can follow each other on
one fleet. Counts are read where a fleet's users read them: results and dead
letters on their topics, states and event streams in Redis.
"""

import asyncio
import time
from datetime import UTC, datetime

from genfleet.chaos.failover import failover
from genfleet.chaos.records import bad_records
from genfleet.chaos.target import (
    DeadLetters,
    JobStates,
    Results,
    Target,
    Verdict,
    alive,
    job_record,
    produce,
    run_id,
    skipped,
    wait_for,
    workers_kept,
)
from queue_schemas import JobStatus

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def _foreign_produce(target: Target, codec: str, records: list[tuple[bytes | None, bytes | None]]):
    """Produce with confluent-kafka (librdkafka), another client than the fleet's own."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": target.kafka_bootstrap,
            "compression.type": codec,
            "enable.idempotence": False,
            "acks": "all",
            "message.max.bytes": 16 * 1024 * 1024,
            "log_level": 0,
        }
    )
    for key, value in records:
        producer.produce(target.names.jobs_topic, value=value, key=key)
    left = producer.flush(60)
    if left:
        raise RuntimeError(f"{left} records not acknowledged by the broker")


async def poison_records(target: Target, good: int = 100, context_tokens: int = 1024) -> Verdict:
    """Bad records of every kind among good ones, spread over every compression codec."""
    name = "poison records"
    run = run_id()
    bad = bad_records(run, context_tokens)
    good_ids = [f"{run}-good-{i}" for i in range(good)]
    workers_before = alive(target)
    async with Results(target) as results, DeadLetters(target) as letters:
        for i, codec in enumerate(CODECS):
            records = [(job_id.encode(), job_record(job_id, 3)) for job_id in good_ids[i::5]]
            records += [(record.key, record.value) for record in bad[i :: len(CODECS)]]
            await asyncio.to_thread(_foreign_produce, target, codec, records)
        readable = [record.job_id for record in bad if record.job_id]

        def settled() -> bool:
            counts = results.counts()
            return all(counts[j] for j in [*good_ids, *readable]) and len(letters.values) >= len(
                bad
            )

        await wait_for(settled, target.timeout_s)
        await asyncio.sleep(2.0)  # anything sent twice would arrive by now
        counts = results.counts()
        by_id = results.by_id()
        dead = letters.parsed()
    served_once = sum(counts[j] == 1 and by_id[j].status is JobStatus.COMPLETED for j in good_ids)
    lettered = 0
    missing: list[str] = []
    for record in bad:
        if any(_letter_of(letter, record) and letter.reason for letter in dead):
            lettered += 1
        else:
            missing.append(record.label)
    failed_visibly = sum(
        counts[j] == 1 and by_id[j].status is JobStatus.FAILED and bool(by_id[j].error)
        for j in readable
    )
    kept_workers, workers_note = workers_kept(target, workers_before)
    passed = (
        served_once == good
        and lettered == len(bad)
        and failed_visibly == len(readable)
        and kept_workers
    )
    detail = (
        f"good served once {served_once}/{good}; dead-lettered {lettered}/{len(bad)}"
        f"{' (missing: ' + ', '.join(missing) + ')' if missing else ''}; "
        f"failed visibly {failed_visibly}/{len(readable)}; codecs {','.join(CODECS)}"
        f"{workers_note}"
    )
    return Verdict(name, passed, detail)


def _letter_of(letter, record) -> bool:
    import hashlib

    if record.value is None:
        return letter.value_null and letter.key_base64 is not None
    return letter.raw_sha256 == hashlib.sha256(record.value).hexdigest()


async def exactly_once(target: Target, jobs: int = 2000) -> Verdict:
    """Thousands of short jobs through a broker freeze and a kill -9: one result each."""
    name = "exactly one result"
    faults = target.faults
    if faults.kill_worker is None or faults.pause_broker is None:
        return skipped(name, "kill a worker and pause the broker")
    run = run_id()
    ids = [f"{run}-{i}" for i in range(jobs)]
    async with Results(target) as results:
        await produce(target, [(job_id.encode(), job_record(job_id, 2)) for job_id in ids])
        await wait_for(lambda: len(results.values) >= jobs // 4, target.timeout_s)
        await asyncio.to_thread(faults.pause_broker, 1.5)
        await wait_for(lambda: len(results.values) >= jobs // 2, target.timeout_s)
        killed = await asyncio.to_thread(faults.kill_worker, None)
        await wait_for(lambda: len(results.counts()) >= jobs, target.timeout_s)
        await asyncio.sleep(3.0)
        counts = results.counts()
    once = sum(counts[j] == 1 for j in ids)
    twice = sum(counts[j] > 1 for j in ids)
    lost = sum(counts[j] == 0 for j in ids)
    detail = (
        f"{jobs} jobs, broker frozen 1.5 s, {killed} killed: exactly once {once}, "
        f"more than once {twice}, none {lost}"
    )
    return Verdict(name, once == jobs, detail)


async def redis_restart(target: Target, jobs: int = 12, tokens: int = 600) -> Verdict:
    """Redis stopped for 3 s while jobs generate: every job ends with one result, and
    its state and whole event stream are in Redis again (but for jobs that ended before
    the stop, when Redis came back without its data)."""
    name = "redis restart"
    faults = target.faults
    if faults.restart_redis is None:
        return skipped(name, "restart Redis")
    run = run_id()
    ids = [f"{run}-{i}" for i in range(jobs)]
    workers_before = alive(target)
    states = JobStates(target)
    try:
        async with Results(target) as results:
            await produce(target, [(job_id.encode(), job_record(job_id, tokens)) for job_id in ids])
            await _until(states, ids, {"running"}, target.timeout_s, at_least=min(jobs, 4))
            stopped_at = datetime.now(UTC)
            await asyncio.to_thread(faults.restart_redis, 3.0)
            await wait_for(lambda: len(results.counts()) >= jobs, target.timeout_s)
            await asyncio.sleep(1.0)
            counts = results.counts()
            by_id = results.by_id()
        final = await states.states(ids)
        texts = {j: await states.streamed_text(j) for j in ids}
    finally:
        await states.close()
    ended = [j for j in ids if j in by_id]
    completed = sum(by_id[j].status is JobStatus.COMPLETED for j in ended)
    once = sum(counts[j] == 1 for j in ids)
    after = [j for j in ended if (by_id[j].finished_at or stopped_at) >= stopped_at]
    kept = sum(bool(final[j]) and final[j]["status"] == by_id[j].status.value for j in after)  # type: ignore[index]
    whole = sum(texts[j] == by_id[j].text for j in after)
    kept_workers, workers_note = workers_kept(target, workers_before)
    passed = once == jobs and len(ended) == jobs and kept == whole == len(after) and kept_workers
    detail = (
        f"{jobs} jobs: completed {completed}, failed {len(ended) - completed}, "
        f"one result {once}/{jobs}; ended after the stop {len(after)}: final state in Redis "
        f"{kept}, whole event stream {whole}{workers_note}"
    )
    return Verdict(name, passed, detail)


async def broker_restart(target: Target, jobs: int = 8, tokens: int = 150) -> Verdict:
    """The broker restarts while jobs generate: they finish, and new jobs run.

    Job states are read in Redis, where SSE clients read them. A broker that comes
    back empty (the local in-memory one) loses the results produced to it before
    the workers re-created the topics, and a reader of its results topic may miss
    later ones too: that count is printed, not judged.
    """
    name = "broker restart"
    faults = target.faults
    if faults.restart_broker is None:
        return skipped(name, "restart the broker")
    run = run_id()
    ids = [f"{run}-{i}" for i in range(jobs)]
    fresh = [f"{run}-after-{i}" for i in range(5)]
    workers_before = alive(target)
    states = JobStates(target)
    try:
        await produce(target, [(job_id.encode(), job_record(job_id, tokens)) for job_id in ids])
        await _until(states, ids, {"running", *FINAL}, target.timeout_s)
        await asyncio.to_thread(faults.restart_broker)
        ended = await _until(states, ids, FINAL, target.timeout_s)
        async with Results(target) as results:
            await produce(target, [(j.encode(), job_record(j, 4)) for j in fresh])
            served = await _until(states, fresh, {"completed"}, target.timeout_s)
            await wait_for(lambda: set(results.counts()) >= set(fresh), 5.0)
            on_topic = sum(results.counts()[j] == 1 for j in fresh)
    finally:
        await states.close()
    kept_workers, workers_note = workers_kept(target, workers_before)
    passed = ended == jobs and served == len(fresh) and kept_workers
    detail = (
        f"running at the restart {jobs}, ended after it {ended}; new jobs after it "
        f"completed {served}/{len(fresh)} (their results on the topic {on_topic})"
        f"{workers_note}"
    )
    return Verdict(name, passed, detail)


FINAL = {status.value for status in JobStatus if status.is_final}


async def _until(
    states: JobStates, ids: list[str], wanted: set[str], timeout_s: float, at_least: int = 0
) -> int:
    """Wait until ``at_least`` (default: all) jobs have a status in Redis among
    ``wanted``; how many have."""

    async def count() -> int:
        found = await states.states(ids)
        return sum(bool(s) and s["status"] in wanted for s in found.values())

    deadline = time.monotonic() + timeout_s
    while (reached := await count()) < (at_least or len(ids)) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return reached


ALL = (poison_records, exactly_once, redis_restart, broker_restart, failover)
