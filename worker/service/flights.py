"""The jobs this worker runs (``Flights``), each with the record it came in on."""

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from aiokafka.structs import TopicPartition

from queue_schemas import JobRequest, JobResult, SamplingOptions, TokenEvent

JobKey = tuple[str, str]  # (tenant, job id): job ids are unique within a tenant


def key_of(job: JobRequest | JobResult) -> JobKey:
    return (job.tenant, job.job_id)


@dataclass(frozen=True)
class Record:
    """Where a record came from: its offset counts as done once the job is settled."""

    partition: TopicPartition
    offset: int
    key: bytes | None = None  # the record's key: the job's affinity key, or its producer's


@dataclass
class InFlight:
    job: JobRequest
    record: Record
    started_at: datetime
    # The engine's id for this attempt at the job, unique in the fleet: it also
    # claims the job's result (``redis_records.FINISH_SCRIPT``).
    request_id: str
    # When the job stops being useful (``JobRequest.expires_at``), if ever.
    expires_at: datetime | None = None
    # Its deadline passed while it ran: the engine's abort ends it ``expired``.
    expired: bool = False
    # Fires at ``expires_at`` (``deadlines``); cancelled when the job leaves.
    timer: asyncio.TimerHandle | None = None
    # False after a rebalance took the record's partition: the job runs on, its
    # offset no longer ours, until the partition is assigned elsewhere.
    attached: bool = True
    # The record went with a broker that lost its state: nobody will be given it
    # again, so the job runs here to its end whoever owns the partition now.
    orphaned: bool = False
    # An earlier attempt started it and did not finish (another worker died, or this
    # one restarted): it resumes from what that attempt streamed.
    taken_over: bool = False
    # What the engine runs it with (the model's defaults filled in), once it accepted it.
    sampling: SamplingOptions | None = None
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)  # published, in order
    # Tokens of the steps since the last published event (``wire.token_event``).
    pending: TokenEvent | None = None

    @property
    def key(self) -> JobKey:
        return key_of(self.job)

    def resume_from(self, events: list[TokenEvent]) -> None:
        """Take what readers hold of an earlier attempt as this flight's output so far."""
        self.events = list(events)
        self.token_ids = [token for event in events for token in event.token_ids]
        self.text = "".join(event.text for event in events)

    def keep_resumed(self, tokens: int, chars: int) -> None:
        """The engine resumed from fewer tokens (one of them would have ended the job):
        the output so far is theirs, and their text."""
        self.events = [event for event in self.events if event.last_index < tokens]
        del self.token_ids[tokens:]
        self.text = self.text[:chars]


class Flights:
    """The jobs this worker runs, by (tenant, job id) and by the engine's request id."""

    def __init__(self) -> None:
        self._by_key: dict[JobKey, InFlight] = {}
        self._by_request: dict[str, InFlight] = {}

    def add(self, flight: InFlight) -> None:
        self._by_key[flight.key] = flight
        self._by_request[flight.request_id] = flight

    def forget(self, flight: InFlight) -> None:
        """The job leaves this worker (finished, refused, or given up)."""
        if self._by_request.get(flight.request_id) is flight:
            del self._by_request[flight.request_id]
            del self._by_key[flight.key]
        if flight.timer is not None:
            flight.timer.cancel()

    def get(self, key: JobKey) -> InFlight | None:
        return self._by_key.get(key)

    def of_request(self, request_id: str) -> InFlight | None:
        return self._by_request.get(request_id)

    def __iter__(self) -> Iterator[InFlight]:
        return iter(list(self._by_key.values()))

    def __len__(self) -> int:
        return len(self._by_key)


class Attempts:
    """Names each attempt this worker makes at a job: ``{worker}-{n}``, never reused,
    so a claim tells apart two attempts at one job, on one worker or on two."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._numbers = itertools.count()

    def next(self) -> str:
        return f"{self.worker_id}-{next(self._numbers)}"
