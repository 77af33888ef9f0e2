"""The fleet's backlog as Kafka's offsets tell it: the API's admission (past
``max_queued_jobs`` the OpenAI routes answer 429 with a Retry-After from the fleet's
completion rate, while ``/v1/jobs`` keeps queueing; no worker runs, the test commits
the group's offsets as finishing workers would), and a worker's lag gauge."""

import asyncio
import contextlib
import time

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from genfleet.chaos.target import job_record
from genfleet.local_services import free_port
from queue_schemas import Names
from tests.integration.metrics import total

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _broker_backlog(bootstrap: str, names: Names) -> int:
    """End offsets minus the group's committed offsets (log starts where none), read
    here from the broker."""

    async def read() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await consumer.start()
        await admin.start()
        try:
            await consumer.topics()
            partitions = consumer.partitions_for_topic(names.jobs_topic) or set()
            tps = [TopicPartition(names.jobs_topic, p) for p in partitions]
            ends, starts = await consumer.end_offsets(tps), await consumer.beginning_offsets(tps)
            committed = await admin.list_consumer_group_offsets(
                names.consumer_group, partitions=tps
            )
            held = {tp: c.offset for tp, c in committed.items() if c.offset >= 0}
            return sum(ends[tp] - held.get(tp, starts[tp]) for tp in tps)
        finally:
            await consumer.stop()
            await admin.close()

    return asyncio.run(read())


def _commit_jobs_done(bootstrap: str, names: Names, count: int) -> None:
    """Commit ``count`` more jobs as done, as the group's workers would."""

    async def commit() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=names.consumer_group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            await consumer.topics()
            partitions = sorted(consumer.partitions_for_topic(names.jobs_topic) or set())
            tps = [TopicPartition(names.jobs_topic, p) for p in partitions]
            consumer.assign(tps)
            ends, starts = await consumer.end_offsets(tps), await consumer.beginning_offsets(tps)
            left, offsets = count, {}
            for tp in tps:
                done = await consumer.committed(tp)
                at = starts[tp] if done is None else done
                step = min(left, ends[tp] - at)
                if step:
                    offsets[tp] = OffsetAndMetadata(at + step, "")
                    left -= step
            assert left == 0
            await consumer.commit(offsets)
        finally:
            await consumer.stop()

    asyncio.run(commit())


def _backlog_shown(client: httpx.Client, expected: int) -> dict:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        detail = client.get("/readyz").json()
        if detail["queued_jobs"] == expected:
            return detail
        time.sleep(0.2)
    raise AssertionError(f"backlog never showed {expected}: {detail}")


async def _produce_jobs(bootstrap: str, names: Names, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(count):
            await producer.send_and_wait(names.jobs_topic, job_record(f"lag{i}", 600))
    finally:
        await producer.stop()


def test_openai_routes_answer_429_past_the_backlog_while_jobs_queue(
    services, start_api, prefix
) -> None:
    kafka, _ = services
    names = Names(prefix)
    api = start_api(
        "--max-queued-jobs", "3", "--backlog-refresh-s", "0.3", "--retry-after-s", "9"
    )  # fmt: skip
    with httpx.Client(base_url=api.url, timeout=30) as client:
        for _ in range(4):
            assert client.post("/v1/jobs", json={"prompt": "a"}).status_code == 202
        detail = _backlog_shown(client, 4)
        assert detail["max_queued_jobs"] == 3
        assert _broker_backlog(kafka.address, names) == 4
        assert total(api.url, "genfleet:api_fleet_backlog") == 4

        refused = client.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "fleet_overloaded"
        assert refused.headers["Retry-After"] == "9"  # no completions measured yet
        assert client.post("/v1/completions", json={"prompt": "a"}).status_code == 429
        assert client.post("/v1/jobs", json={"prompt": "b"}).status_code == 202  # queues
        _backlog_shown(client, 5)

        # Workers finish two jobs: the backlog follows the committed offsets, and the
        # Retry-After now comes from the measured completion rate.
        _commit_jobs_done(kafka.address, names, 2)
        _backlog_shown(client, 3)
        assert _broker_backlog(kafka.address, names) == 3
        assert total(api.url, "genfleet:api_fleet_completion_rate") > 0
        refused = client.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert total(api.url, "genfleet:api_fleet_rejections_total") == 3

        _commit_jobs_done(kafka.address, names, 1)
        _backlog_shown(client, 2)
        # Under the limit: admitted (the stream opens and waits for a worker).
        with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.status_code == 200


LAG_READING_S = 2.0  # how often a worker reads its lag (worker.service.app)


def test_the_worker_lag_gauge_agrees_with_the_broker_while_jobs_wait(
    services, start_worker, prefix
) -> None:
    kafka, _ = services
    names = Names(prefix)
    port = free_port()
    # One sequence at a time, one waiting: the rest of the jobs wait in Kafka.
    start_worker(
        "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
        "--max-num-seqs", "1", "--max-waiting", "1",
    )  # fmt: skip
    worker_url = f"http://127.0.0.1:{port}"
    worker = httpx.Client(base_url=worker_url, timeout=10)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if worker.get("/readyz").status_code == 200:
                break
        time.sleep(0.2)
    asyncio.run(_produce_jobs(kafka.address, names, 12))
    # The worker reads its lag every 2 s and a job here takes about one: the gauge must
    # equal what the broker said within the last few seconds. Both are watched until
    # each is seen: the gauge may agree before the pause is first read, or after.
    agreed, paused_seen = [], 0.0
    seen: list[tuple[float, int]] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (agreed and paused_seen >= 1):
        gauge = total(worker_url, "genfleet:consumer_lag")
        paused_seen = max(paused_seen, total(worker_url, "genfleet:partitions_paused"))
        now = time.monotonic()
        seen = [(at, backlog) for at, backlog in seen if now - at < LAG_READING_S + 1]
        seen.append((now, _broker_backlog(kafka.address, names)))
        if gauge > 0 and gauge in {backlog for _, backlog in seen}:
            agreed.append(gauge)
        time.sleep(0.3)
    assert agreed, "the worker's lag gauge never matched the broker's offsets"
    assert paused_seen >= 1  # backpressure held the waiting jobs in Kafka
    assert total(worker_url, "genfleet:partitions_assigned") == 8  # 4 of each lane
