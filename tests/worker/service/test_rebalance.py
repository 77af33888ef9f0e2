"""Which running jobs a worker keeps when the group hands out partitions again."""

from datetime import UTC, datetime

from aiokafka.structs import TopicPartition

from queue_schemas import JobRequest
from worker.service.app import WorkerService
from worker.service.flights import InFlight, Record
from worker.service.settings import WorkerSettings

P0, P1, P2 = (TopicPartition("genfleet.jobs", p) for p in range(3))


class _Engine:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _running(service: WorkerService, job_id: str, partition: TopicPartition) -> InFlight:
    job = JobRequest(job_id=job_id, prompt="hi")
    flight = InFlight(job, Record(partition, 0), datetime.now(UTC), f"w-{job_id}")
    service.jobs[flight.key] = flight
    service.by_request[flight.request_id] = flight
    return flight


def test_jobs_whose_records_a_broker_lost_run_on_wherever_their_partition_goes() -> None:
    service = WorkerService(WorkerSettings(worker_id="w"))
    engine = _Engine()
    service.engine = engine  # type: ignore[assignment]
    moved = _running(service, "moved", P0)  # its partition goes to another worker
    back = _running(service, "back", P1)  # its partition comes back here
    orphan = _running(service, "orphan", P2)  # its record went with the broker's state
    service._detach({P0, P1})
    service._detach({P2}, records_lost=True)
    service.adopt({P1})
    assert engine.aborted == [moved.request_id]
    assert set(service.by_request) == {back.request_id, orphan.request_id}
    assert orphan.orphaned and not orphan.attached
