"""A worker whose engine fails stops loudly and leaves its jobs to the fleet.

The engine is made to fail from outside: its process is killed with SIGKILL, or
a ``sitecustomize`` on the worker's path (tests only) makes ``LLMEngine.step``
raise once a trigger file exists.
"""

import asyncio
import os
import re
import signal
import time

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from redis.asyncio import Redis

from genfleet.chaos.target import JobStates, Results, Target, job_record, produce, wait_for
from queue_schemas import JobStatus, Names
from queue_schemas.redis_records import streamed_output

TIMEOUT_S = 180
EXIT_BAR_S = 10.0
STEP_FAILS_WHEN = """
import os

trigger = os.environ.get("GENFLEET_TEST_STEP_FAILS_WHEN")
if trigger:
    import worker.engine.llm_engine

    step = worker.engine.llm_engine.LLMEngine.step

    def failing_step(self):
        if os.path.exists(trigger):
            raise RuntimeError("injected step failure")
        return step(self)

    worker.engine.llm_engine.LLMEngine.step = failing_step
"""


def _engine_pid(log: str) -> int | None:
    found = re.search(r"engine process (\d+) loading", log)
    return int(found.group(1)) if found else None


def _second_rank_pid(log: str) -> int | None:
    found = re.search(r"tensor parallel: 2 ranks \(gloo\), pids \[\d+, (\d+)\]", log)
    return int(found.group(1)) if found else None


FAULTS = {
    "step raises": "injected step failure",
    "engine process killed": "killed by signal 9",
    # The worker's engine split over two ranks; the second is killed mid-step.
    "tensor-parallel rank killed": "rank 1 \\(pid \\d+\\) ended",
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_failed_engine_ends_its_worker_and_another_finishes_the_jobs(
    services, start_worker, prefix, tmp_path, fault
) -> None:
    kafka, redis = services
    target = Target(kafka.address, redis.address, prefix)
    trigger = tmp_path / "fail-now"
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(STEP_FAILS_WHEN)
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    env = {"GENFLEET_TEST_STEP_FAILS_WHEN": str(trigger), "PYTHONPATH": path}
    ranks = ["--tensor-parallel-size", "2"] if fault == "tensor-parallel rank killed" else []
    failing = start_worker("--worker-id", "failing", *ranks, env=env)
    ids = [f"f{i}" for i in range(8)]

    async def scenario() -> tuple[float, Results]:
        states = JobStates(target)
        async with Results(target) as results:
            if ranks:  # the split engine serves: a short job completes on it first
                await produce(target, [(b"served", job_record("served", 4))])
                assert await wait_for(lambda: "served" in results.counts(), TIMEOUT_S)
                served = await states.state("served")
                assert served is not None and served["worker"] == "failing", served
            await produce(target, [(i.encode(), job_record(i, 120)) for i in ids])

            async def running_on_failing() -> bool:
                for job_id in ids:
                    state = await states.state(job_id)
                    if state and state["status"] == "running" and state["worker"] == "failing":
                        return True
                return False

            while not await running_on_failing():
                await asyncio.sleep(0.1)
            failed_at = time.monotonic()
            if fault == "step raises":
                trigger.touch()
            else:
                find = _engine_pid if fault == "engine process killed" else _second_rank_pid
                pid = find(failing.log())
                assert pid is not None, failing.log()
                os.kill(pid, signal.SIGKILL)
            while failing.alive and time.monotonic() - failed_at < 30:
                await asyncio.sleep(0.1)
            exit_s = time.monotonic() - failed_at
            survivor = start_worker("--worker-id", "survivor")
            done = await wait_for(lambda: set(results.counts()) >= set(ids), TIMEOUT_S)
            assert done, f"{len(results.counts())}/{len(ids)} results\n{survivor.log()}"
            await asyncio.sleep(1.0)  # a duplicate would come right after
        await states.close()
        return exit_s, results

    exit_s, results = asyncio.run(asyncio.wait_for(scenario(), 2 * TIMEOUT_S))
    log = failing.log()
    assert failing.process.returncode not in (None, 0), log
    assert exit_s < EXIT_BAR_S, f"the worker took {exit_s:.1f} s to exit\n{log}"
    assert re.search(FAULTS[fault], log), log
    # Each job has exactly one result, completed: the failing worker wrote no failure.
    assert all(n == 1 for n in results.counts().values()), results.counts()
    assert all(r.status is JobStatus.COMPLETED for r in results.parsed())
    print(f"{fault}: the worker exited {exit_s:.1f} s after the fault")


def test_a_worker_whose_model_is_missing_exits_with_the_reason_and_commits_nothing(
    services, start_worker, prefix, tmp_path
) -> None:
    kafka, redis = services
    target = Target(kafka.address, redis.address, prefix)
    asyncio.run(produce(target, [(b"m1", job_record("m1", 8))]))
    missing = tmp_path / "no-such-model"
    worker = start_worker("--model", str(missing))
    assert worker.process.wait(timeout=60) != 0, worker.log()
    assert str(missing) in worker.log(), worker.log()

    async def committed() -> list[int | None]:
        names = Names(prefix)
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka.address, group_id=names.consumer_group)
        await consumer.start()
        try:
            partitions = consumer.partitions_for_topic(names.jobs_topic) or set()
            return [
                await consumer.committed(TopicPartition(names.jobs_topic, p)) for p in partitions
            ]
        finally:
            await consumer.stop()

    offsets = asyncio.run(asyncio.wait_for(committed(), 60))
    assert offsets and all(offset is None for offset in offsets), offsets


def test_a_taken_over_job_resumes_from_its_streamed_tokens(services, start_worker, prefix) -> None:
    """The worker running a 400-token job is killed after a third of it streamed: the
    survivor prefills the streamed tokens and decodes only the rest (its log says
    where it resumed), and the result is an uninterrupted greedy run's, its usage
    counted whole."""
    kafka, redis = services
    target = Target(kafka.address, redis.address, prefix)
    first = start_worker("--worker-id", "first")
    survivors = []
    tokens = 400

    async def scenario() -> tuple[int, Results]:
        client = Redis.from_url(redis.address)
        stream = target.names.events_stream("default", "long")
        async with Results(target) as results:
            await produce(target, [(b"long", job_record("long", tokens))])
            streamed = 0
            while streamed < tokens // 3:
                events = streamed_output(await client.xrange(stream))
                streamed = sum(len(event.token_ids) for event in events)
                await asyncio.sleep(0.02)
            first.process.kill()
            first.process.wait()
            survivors.append(start_worker("--worker-id", "survivor"))
            assert await wait_for(lambda: "long" in results.counts(), TIMEOUT_S)
            # The same job, never interrupted, for the output to compare.
            again = job_record("again", tokens, prompt="Chaos job long says")
            await produce(target, [(b"again", again)])
            assert await wait_for(lambda: "again" in results.counts(), TIMEOUT_S)
        await client.aclose()
        return streamed, results

    streamed, results = asyncio.run(asyncio.wait_for(scenario(), 2 * TIMEOUT_S))
    by_id = results.by_id()
    resumed, uninterrupted = by_id["long"], by_id["again"]
    assert resumed.status is JobStatus.COMPLETED and resumed.usage.completion_tokens == tokens
    assert resumed.token_ids == uninterrupted.token_ids and resumed.text == uninterrupted.text
    found = re.search(r"long resumes after (\d+) tokens", survivors[0].log())
    assert found is not None, survivors[0].log()
    assert streamed <= int(found.group(1)) < tokens
