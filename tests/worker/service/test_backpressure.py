"""Pause and resume decisions from engine load."""

import pytest

from worker.service.backpressure import Backpressure
from worker.service.engine_protocol import EngineLoad


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
