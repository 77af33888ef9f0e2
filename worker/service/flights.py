"""A job while this worker runs it, and the record it came in on."""

import itertools
from dataclasses import dataclass, field
from datetime import datetime

from aiokafka.structs import TopicPartition

from queue_schemas import JobRequest, JobResult, TokenEvent

JobKey = tuple[str, str]  # (tenant, job id): job ids are unique within a tenant


def key_of(job: JobRequest | JobResult) -> JobKey:
    return (job.tenant, job.job_id)


@dataclass(frozen=True)
class Record:
    """Where a record came from: its offset counts as done once the job is settled."""

    partition: TopicPartition
    offset: int


@dataclass
class InFlight:
    job: JobRequest
    record: Record
    started_at: datetime
    # The engine's id for this attempt at the job, unique in the fleet: it also
    # claims the job's result (``redis_records.FINISH_SCRIPT``).
    request_id: str
    # False after a rebalance took the record's partition: the job runs on, its
    # offset no longer ours, until the partition is assigned elsewhere.
    attached: bool = True
    # The record went with a broker that lost its state: nobody will be given it
    # again, so the job runs here to its end whoever owns the partition now.
    orphaned: bool = False
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)  # published, in order
    # Tokens of the steps since the last published event (``wire.token_event``).
    pending: TokenEvent | None = None

    @property
    def key(self) -> JobKey:
        return key_of(self.job)


class Attempts:
    """Names each attempt this worker makes at a job: ``{worker}-{n}``, never reused,
    so a claim tells apart two attempts at one job, on one worker or on two."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._numbers = itertools.count()

    def next(self) -> str:
        return f"{self.worker_id}-{next(self._numbers)}"
