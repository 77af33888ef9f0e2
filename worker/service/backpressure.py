"""When to stop reading jobs from Kafka, and when to start again.

Unread jobs are better left in Kafka than queued here: there, lag is visible
and another worker can take them. We pause our partitions when free KV blocks
fall below the low watermark or the engine's waiting queue is full, and
resume once free blocks are above the high watermark and the queue has room.
The gap between the two marks keeps us from flapping.
"""

from dataclasses import dataclass

from worker.service.engine_protocol import EngineLoad


@dataclass
class Backpressure:
    low_watermark: float
    high_watermark: float
    max_waiting: int
    paused: bool = False
    pauses: int = 0
    resumes: int = 0

    def __post_init__(self) -> None:
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"low_watermark ({self.low_watermark}) must be below "
                f"high_watermark ({self.high_watermark})"
            )

    def update(self, load: EngineLoad, hold: bool = False) -> bool | None:
        """True: pause now; False: resume now; None: stay as we are. ``hold`` pauses
        whatever the load (a dependency is away)."""
        free = load.free_blocks / load.total_blocks
        waiting = load.waiting
        full = free < self.low_watermark or waiting >= self.max_waiting
        if not self.paused and (full or hold):
            self.paused, self.pauses = True, self.pauses + 1
            return True
        if self.paused and not hold and free > self.high_watermark and waiting < self.max_waiting:
            self.paused, self.resumes = False, self.resumes + 1
            return False
        return None

    def room(self, load: EngineLoad) -> int:
        """How many more records one fetch may bring."""
        return max(0, self.max_waiting - load.waiting)
