"""When to stop reading jobs from Kafka, and when to start again.

Unread jobs are better left in Kafka than queued here: there, lag is visible
and another worker can take them. We pause our partitions when free KV blocks
fall below the low watermark or the engine's waiting queue is full, and
resume once free blocks are above the high watermark and the queue has room.
The gap between the two marks keeps us from flapping.

Each lane has a gate of its own. The batch lane's closes first: it pauses
below a higher free-block share and with half as many jobs waiting, and
resumes later, so batch jobs take what interactive ones leave.
"""

from dataclasses import dataclass

from queue_schemas import Names
from worker.engine_process.protocol import EngineLoad
from worker.service.settings import WorkerSettings


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


def lane_gates(settings: WorkerSettings, names: Names) -> dict[str, Backpressure]:
    """A gate per lane (topic): the interactive one, and the batch one that closes first."""
    return {
        names.jobs_topic: Backpressure(
            settings.low_watermark, settings.high_watermark, settings.max_waiting
        ),
        names.batch_jobs_topic: Backpressure(
            settings.batch_low_watermark,
            settings.batch_high_watermark,
            max(1, settings.max_waiting // 2),
        ),
    }
