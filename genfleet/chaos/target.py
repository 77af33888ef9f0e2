"""What a chaos scenario attacks, how it hurts it, and how it watches the outcome.

A ``Target`` is a fleet's addresses plus ``Faults``: plain callables that do
the damage in that deployment (kill a worker process, freeze or restart the
broker, restart Redis). A local fleet implements them with signals; an
operator's deployment with ``docker kill`` or ``kubectl delete pod`` (see
``scripts/chaos.py``). A scenario whose fault is missing is skipped.
"""

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from redis.asyncio import Redis

from queue_schemas import DeadLetter, JobResult, Names
from queue_schemas.redis_records import read_state, streamed_output
from queue_schemas.tasks import cancel_and_wait

T = TypeVar("T")


@dataclass
class Faults:
    # kill -9 one worker (the one named, where the fleet can choose); returns its id
    kill_worker: Callable[[str | None], str] | None = None
    pause_broker: Callable[[float], None] | None = None  # freeze the broker this long
    restart_broker: Callable[[], None] | None = None
    restart_redis: Callable[[float], None] | None = None  # stop, wait this long, start
    workers_alive: Callable[[], int] | None = None


@dataclass
class Target:
    kafka_bootstrap: str
    redis_url: str
    topic_prefix: str = "genfleet."
    api_url: str | None = None
    # Bearer keys of two different tenants, for the tenancy scenario.
    api_keys: tuple[str, str] | None = None
    faults: Faults = field(default_factory=Faults)
    timeout_s: float = 240.0

    @property
    def names(self) -> Names:
        return Names(self.topic_prefix)


@dataclass
class Verdict:
    scenario: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.scenario:<24} {self.detail}"


def skipped(scenario: str, missing: str) -> Verdict:
    return Verdict(scenario, True, f"skipped: no way to {missing} given")


def run_id() -> str:
    return f"chaos-{uuid.uuid4().hex[:8]}"


def job_record(job_id: str, max_tokens: int, **fields: object) -> bytes:
    """A greedy job that runs exactly ``max_tokens`` tokens."""
    return json.dumps(
        {
            "job_id": job_id,
            "prompt": f"Chaos job {job_id} says",
            "sampling": {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True},
            **fields,
        }
    ).encode()


async def produce(target: Target, records: list[tuple[bytes | None, bytes]]) -> None:
    """(key, value) records onto the jobs topic, acknowledged by the broker."""
    producer = AIOKafkaProducer(bootstrap_servers=target.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        sends = [
            await producer.send(target.names.jobs_topic, value, key=key) for key, value in records
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


class TopicTail:
    """Everything on one topic from its start, read in the background."""

    def __init__(self, target: Target, topic: str) -> None:
        self.target = target
        self.topic = topic
        self.values: list[bytes] = []
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "TopicTail":
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        await cancel_and_wait([self._task])

    async def _read(self) -> None:
        # A fresh consumer after any error: the broker may restart under it.
        while True:
            consumer = AIOKafkaConsumer(
                self.topic,
                bootstrap_servers=self.target.kafka_bootstrap,
                auto_offset_reset="earliest",
                group_id=None,
                fetch_max_wait_ms=50,
                # A topic a restarted broker made again is found within a second.
                metadata_max_age_ms=1000,
            )
            try:
                await consumer.start()
                while True:
                    batches = await consumer.getmany(timeout_ms=200)
                    for records in batches.values():
                        self.values += [r.value for r in records if r.value is not None]
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(0.5)
            finally:
                await consumer.stop()


class Results(TopicTail):
    def __init__(self, target: Target) -> None:
        super().__init__(target, target.names.results_topic)

    def parsed(self) -> list[JobResult]:
        return [JobResult.model_validate_json(value) for value in self.values]

    def counts(self) -> Counter[str]:
        return Counter(result.job_id for result in self.parsed())

    def by_id(self) -> dict[str, JobResult]:
        return {result.job_id: result for result in self.parsed()}


class DeadLetters(TopicTail):
    def __init__(self, target: Target) -> None:
        super().__init__(target, target.names.dead_letter_topic)

    def parsed(self) -> list[DeadLetter]:
        return [DeadLetter.model_validate_json(value) for value in self.values]


async def wait_for(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(poll_s)
    return condition()


class JobStates:
    """Job hashes and event streams in Redis, read through outages (None while away)."""

    ATTEMPTS = 3

    def __init__(self, target: Target, tenant: str = "default") -> None:
        self.client = Redis.from_url(target.redis_url, socket_timeout=2, socket_connect_timeout=2)
        self.names = target.names
        self.tenant = tenant

    async def close(self) -> None:
        await self.client.aclose()

    async def _read(self, command: Callable[[], Awaitable[T]]) -> T | None:
        """The reply, or None while Redis is away (a connection it dropped is retried)."""
        for _ in range(self.ATTEMPTS):
            try:
                return await command()
            except Exception:
                await asyncio.sleep(0.1)
        return None

    async def state(self, job_id: str) -> dict[str, str] | None:
        key = self.names.job_key(self.tenant, job_id)
        fields = await self._read(lambda: self.client.hgetall(key))
        if fields is None:
            return None
        state = read_state(fields)
        if state is None:
            return {}
        return {"status": state.status.value, "worker": state.worker or ""}

    async def states(self, job_ids: list[str]) -> dict[str, dict[str, str] | None]:
        return {job_id: await self.state(job_id) for job_id in job_ids}

    async def streamed_text(self, job_id: str) -> str | None:
        """The text of the job's token events, each token index once."""
        stream = self.names.events_stream(self.tenant, job_id)
        entries = await self._read(lambda: self.client.xrange(stream))
        if entries is None:
            return None
        pieces: dict[int, str] = {}
        for _, fields in entries:
            event = json.loads(fields[b"event"])
            if event.get("kind") == "token":
                pieces.setdefault(event["token_index"], event["text"])
        return "".join(pieces[index] for index in sorted(pieces))

    async def last_index(self, job_id: str) -> int | None:
        """The last token index a reader of the job holds (-1: none yet)."""
        stream = self.names.events_stream(self.tenant, job_id)
        entries = await self._read(lambda: self.client.xrange(stream))
        if entries is None:
            return None
        events = streamed_output(entries)
        return events[-1].last_index if events else -1


def alive(target: Target) -> int | None:
    probe = target.faults.workers_alive
    return None if probe is None else probe()


def workers_kept(target: Target, before: int | None) -> tuple[bool, str]:
    """Whether as many workers are alive as ``before``, and a note of it for a verdict."""
    after = alive(target)
    if before is None or after is None:
        return True, ""
    return after == before, f"; workers alive {after}/{before}"
