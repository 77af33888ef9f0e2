"""The output pump: steps' outputs to Redis in order, results to the topic once, offsets
done only after."""

import asyncio
import contextlib
from datetime import UTC, datetime

import pytest

from queue_schemas import JobRequest, JobStatus
from tests.worker.service.fakes import LANE, FakeKafka, FakePublisher, metrics
from worker.engine_process.protocol import EngineLoad, Output
from worker.outputs import RequestDelta, Timings, Usage
from worker.service.flights import Flights, InFlight, Record
from worker.service.offsets import OffsetTracker
from worker.service.output_pump import OutputPump
from worker.service.settings import WorkerSettings

pytestmark = pytest.mark.anyio


def _output(request_id: str, index: int, token: int | None, finished: bool = False) -> Output:
    tokens = [] if token is None else [token]
    reason = "length" if finished else None
    return Output(
        RequestDelta(
            request_id, index, tokens, "t" * len(tokens), [], finished, reason, None,
            Usage(2, index + len(tokens)), Timings(0.0),
        )
    )  # fmt: skip


async def test_steps_queued_while_redis_was_slow_go_out_together_in_order() -> None:
    flights, offsets, publisher, kafka = Flights(), OffsetTracker(), FakePublisher(), FakeKafka()
    load = EngineLoad(free_blocks=1, total_blocks=1, waiting=0)
    pump = OutputPump(
        WorkerSettings(worker_id="w"), flights, publisher, kafka, metrics(), offsets,  # type: ignore[arg-type]
        lambda: load,
    )  # fmt: skip
    offsets.add(LANE, 5)
    flight = InFlight(JobRequest(job_id="a", prompt="x"), Record(LANE, 5), datetime.now(UTC), "r1")
    flights.add(flight)
    pump.stepped([_output("r1", 0, 11), _output("gone", 0, 99)])  # "gone": another owner's
    pump.stepped([_output("r1", 1, 12)])
    pump.stepped([_output("r1", 2, None, finished=True)])
    tasks = [asyncio.create_task(pump.run_outputs()), asyncio.create_task(pump.run_results())]
    for _ in range(20):
        await asyncio.sleep(0)
    await pump.all_sent()
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [event.token_ids for _, event in publisher.events] == [[11], [12]]
    (result,) = kafka.results
    assert (result.status, result.token_ids, result.text) == (JobStatus.COMPLETED, [11, 12], "tt")
    assert publisher.sent == [("default", "a")]
    assert offsets.committable() == {LANE: 6}
    assert len(flights) == 0
