"""The intake's decisions, record by record, with the engine, Redis and Kafka faked:
what reaches the engine, what ends without it, and what a deadline does."""

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import pytest

from queue_schemas import JobRequest, JobStatus, TokenEvent
from queue_schemas.redis_records import Delivery
from tests.worker.service.fakes import (
    LANE,
    FakeConsumer,
    FakeEngine,
    FakeKafka,
    FakePublisher,
    metrics,
    record,
)
from worker.engine_process.protocol import Output
from worker.outputs import RequestDelta, Timings, Usage
from worker.service.flights import Flights, InFlight
from worker.service.intake import Intake
from worker.service.offsets import OffsetTracker
from worker.service.output_pump import OutputPump
from worker.service.settings import WorkerSettings

pytestmark = pytest.mark.anyio


class Parts:
    """An intake and an output pump over fakes, as the worker wires them."""

    def __init__(self) -> None:
        self.settings = WorkerSettings(worker_id="w")
        self.engine = FakeEngine()
        self.publisher = FakePublisher()
        self.kafka = FakeKafka()
        self.flights = Flights()
        self.offsets = OffsetTracker()
        self.metrics = metrics()
        self.pump = OutputPump(
            self.settings, self.flights, self.publisher, self.kafka, self.metrics,  # type: ignore[arg-type]
            self.offsets, lambda: self.engine.load,
        )  # fmt: skip
        self.intake = Intake(
            self.settings, FakeConsumer(), self.engine, self.flights, self.offsets,  # type: ignore[arg-type]
            self.publisher, self.kafka, self.pump, self.metrics, self.abort,  # type: ignore[arg-type]
        )  # fmt: skip

    def abort(self, flight: InFlight) -> None:
        self.engine.abort(flight.request_id)

    async def take(self, *jobs: JobRequest | bytes, timestamp_ms: int | None = None) -> None:
        """The records through the intake, and what they settle sent out."""
        sending = asyncio.create_task(self.pump.run_results())
        records = [(LANE, record(job, offset, timestamp_ms)) for offset, job in enumerate(jobs)]
        await self.intake._take(records)
        await self.settle()
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending

    async def settle(self) -> None:
        for _ in range(20):  # the background tasks and the result queue run dry
            await asyncio.sleep(0)
        await self.pump.all_sent()

    def committable(self) -> int | None:
        return self.offsets.committable().get(LANE)

    def expired_total(self, stage: str) -> float:
        return self.metrics.expired.labels(stage)._value.get()


def _job(job_id: str, **fields) -> JobRequest:
    return JobRequest(job_id=job_id, prompt="hello", **fields)


async def test_a_job_past_its_deadline_never_reaches_the_engine_and_expires_once() -> None:
    parts = Parts()
    past = datetime.now(UTC) - timedelta(seconds=1)
    await parts.take(_job("late", deadline=past), _job("late", deadline=past))
    assert parts.engine.added == []
    (result,) = parts.kafka.results  # the second copy lost the claim
    assert (result.status, result.job_id, result.schema_version) == (JobStatus.EXPIRED, "late", 3)
    assert "passed before the job started" in (result.error or "")
    assert parts.committable() == 2  # both records settled
    assert parts.expired_total("queued") == 1


async def test_a_timeout_counts_from_the_records_timestamp_when_the_job_has_no_creation() -> None:
    parts = Parts()
    job = _job("slow", schema_version=3, timeout_s=5)
    a_minute_ago = int((datetime.now(UTC) - timedelta(minutes=1)).timestamp() * 1000)
    await parts.take(job, timestamp_ms=a_minute_ago)
    assert parts.engine.added == []
    assert parts.kafka.results[0].status is JobStatus.EXPIRED


async def test_a_far_deadline_changes_nothing_but_a_timer_that_leaves_with_the_job() -> None:
    parts = Parts()
    await parts.take(_job("far", deadline=datetime.now(UTC) + timedelta(days=365)))
    ((request_id, _, _),) = parts.engine.added
    flight = parts.flights.of_request(request_id)
    assert flight is not None and flight.timer is not None and flight.sampling is not None
    parts.flights.forget(flight)
    assert flight.timer.cancelled()
    assert parts.engine.aborted == []


async def test_a_running_job_is_aborted_at_its_deadline_and_ends_expired_with_its_tokens() -> None:
    parts = Parts()
    await parts.take(_job("brief", deadline=datetime.now(UTC) + timedelta(seconds=0.2)))
    ((request_id, _, _),) = parts.engine.added
    flight = parts.flights.of_request(request_id)
    assert flight is not None
    parts.pump.stepped([_delta(request_id, 0, [7, 8], finished=False)])
    await parts.pump._publish(await parts.pump._outputs.get())
    await asyncio.sleep(0.3)
    assert parts.engine.aborted == [request_id] and flight.expired
    parts.pump.stepped([_delta(request_id, 2, [], finished=True)])  # the abort's delta
    await parts.pump._publish(await parts.pump._outputs.get())
    sending = asyncio.create_task(parts.pump.run_results())
    await parts.settle()
    sending.cancel()
    (result,) = parts.kafka.results
    assert result.status is JobStatus.EXPIRED and result.token_ids == [7, 8]
    assert "passed while it ran" in (result.error or "")
    assert parts.expired_total("running") == 1
    assert parts.committable() == 1


def _delta(request_id: str, index: int, tokens: list[int], finished: bool) -> Output:
    return Output(
        RequestDelta(
            request_id, index, tokens, "x" * len(tokens), [], finished,
            "abort" if finished else None, None, Usage(3, index + len(tokens)), Timings(0.0),
        )
    )  # fmt: skip


@pytest.mark.parametrize(("version", "left_unset"), [(1, False), (2, False), (3, True)])
async def test_the_engine_gets_unset_fields_only_where_the_records_version_allows(
    version: int, left_unset: bool
) -> None:
    parts = Parts()
    sampling = {"top_k": 4} | ({"structured_outputs": {"regex": "a+"}} if version == 2 else {})
    await parts.take(JobRequest(job_id="j", prompt="x", schema_version=version, sampling=sampling))
    ((_, _, params),) = parts.engine.added
    assert bool(params.unset) is left_unset
    assert params.top_k == 4


async def test_a_second_record_of_a_running_job_is_settled_without_a_second_run() -> None:
    parts = Parts()
    await parts.take(_job("twice"), _job("twice"))
    assert len(parts.engine.added) == 1
    assert parts.committable() == 0  # the first record waits for its result


async def test_a_finished_job_is_skipped_and_a_cancelled_one_ends_cancelled() -> None:
    parts = Parts()
    parts.publisher.past[("default", "done")] = Delivery(status=JobStatus.COMPLETED)
    parts.publisher.past[("default", "gone")] = Delivery(cancelled=True)
    await parts.take(_job("done"), _job("gone"))
    assert parts.engine.added == []
    assert [(r.job_id, r.status) for r in parts.kafka.results] == [("gone", JobStatus.CANCELLED)]
    assert parts.committable() == 2


async def test_an_invalid_record_is_dead_lettered_and_a_job_it_names_fails() -> None:
    parts = Parts()
    await parts.take(b'{"job_id": "bad", "prompt": "x", "sampling": {"temperature": 9}}', b"\xff")
    assert len(parts.kafka.dead_letters) == 2
    assert [(r.job_id, r.status) for r in parts.kafka.results] == [("bad", JobStatus.FAILED)]
    assert parts.engine.added == [] and parts.committable() == 2


async def test_a_taken_over_job_resumes_from_what_readers_hold_and_its_result_is_whole() -> None:
    parts = Parts()
    key = ("default", "again")
    parts.publisher.past[key] = Delivery(status=JobStatus.RUNNING)
    streamed = [TokenEvent(job_id="again", token_index=i, text=t, token_ids=[10 + i])
                for i, t in enumerate(["He", "llo"])]  # fmt: skip
    parts.publisher.streams[key] = streamed
    await parts.take(_job("again"))
    ((request_id, _, _),) = parts.engine.added
    assert parts.engine.resumed[request_id] == [10, 11]
    parts.pump.stepped([_delta(request_id, 2, [12], finished=True)])
    await parts.pump._publish(await parts.pump._outputs.get())
    sending = asyncio.create_task(parts.pump.run_results())
    await parts.settle()
    sending.cancel()
    (result,) = parts.kafka.results
    assert result.token_ids == [10, 11, 12] and result.text == "Hellox"
    assert parts.metrics.resumed_tokens._value.get() == 2


async def test_a_job_started_here_first_is_not_resumed() -> None:
    parts = Parts()
    parts.publisher.streams[("default", "fresh")] = [
        TokenEvent(job_id="fresh", token_index=0, text="x", token_ids=[5])
    ]  # a stream without an earlier attempt's start is not read
    await parts.take(_job("fresh"))
    ((request_id, _, _),) = parts.engine.added
    assert parts.engine.resumed[request_id] == []
