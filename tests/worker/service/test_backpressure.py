"""Pause and resume decisions from engine load."""

import pytest

from queue_schemas import Names
from worker.engine_process.protocol import EngineLoad
from worker.service.backpressure import Backpressure, lane_gates
from worker.service.settings import WorkerSettings


def _load(free: int, waiting: int = 0) -> EngineLoad:
    return EngineLoad(free_blocks=free, total_blocks=100, waiting=waiting)


def test_pauses_below_low_and_resumes_only_above_high() -> None:
    gate = Backpressure(low_watermark=0.1, high_watermark=0.3, max_waiting=8)
    assert gate.update(_load(50)) is None
    assert gate.update(_load(9)) is True
    assert gate.update(_load(20)) is None  # between the marks: stay paused
    assert gate.update(_load(31)) is False
    assert (gate.pauses, gate.resumes) == (1, 1)


def test_a_full_waiting_queue_pauses_too() -> None:
    gate = Backpressure(low_watermark=0.1, high_watermark=0.3, max_waiting=8)
    assert gate.update(_load(90, waiting=8)) is True
    assert gate.update(_load(90, waiting=7)) is False
    assert gate.room(_load(90, waiting=5)) == 3


def test_marks_must_leave_a_gap() -> None:
    with pytest.raises(ValueError, match="low_watermark"):
        Backpressure(low_watermark=0.3, high_watermark=0.3, max_waiting=1)


def test_the_batch_lane_closes_first_and_opens_last() -> None:
    names = Names("t.")
    gates = lane_gates(WorkerSettings(max_waiting=8), names)
    interactive, batch = gates[names.jobs_topic], gates[names.batch_jobs_topic]
    decisions = []
    for free, waiting in ((50, 0), (15, 0), (4, 0), (30, 0), (50, 0), (90, 4), (90, 0)):
        load = _load(free, waiting=waiting)
        decisions.append((interactive.update(load), batch.update(load)))
    assert decisions == [
        (None, None),
        (None, True),  # 15 % free: below the batch lane's 20 %, above the jobs lane's 5 %
        (True, None),  # 4 % free: both closed
        (False, None),  # 30 %: the jobs lane opens again, the batch lane waits for 40 %
        (None, False),
        (None, True),  # half the waiting queue taken: only the batch lane stops
        (None, False),
    ]
