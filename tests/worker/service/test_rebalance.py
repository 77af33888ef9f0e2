"""Which running jobs a worker keeps when the group hands out partitions again."""

from datetime import UTC, datetime

from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from queue_schemas import JobRequest
from worker.service.flights import Flights, InFlight, Record
from worker.service.metrics import WorkerMetrics
from worker.service.partitions import Partitions

P0, P1, P2 = (TopicPartition("genfleet.jobs", p) for p in range(3))


def _running(flights: Flights, job_id: str, partition: TopicPartition) -> InFlight:
    job = JobRequest(job_id=job_id, prompt="hi")
    flight = InFlight(job, Record(partition, 0), datetime.now(UTC), f"w-{job_id}")
    flights.add(flight)
    return flight


def test_jobs_whose_records_a_broker_lost_run_on_wherever_their_partition_goes() -> None:
    flights = Flights()
    abandoned: list[str] = []

    def abandon(gone: list[InFlight]) -> None:
        for flight in gone:
            flights.forget(flight)
            abandoned.append(flight.request_id)

    metrics = WorkerMetrics(CollectorRegistry(), "m", 64)
    partitions = Partitions(None, None, flights, abandon, None, None, metrics)  # type: ignore[arg-type]
    moved = _running(flights, "moved", P0)  # its partition goes to another worker
    back = _running(flights, "back", P1)  # its partition comes back here
    orphan = _running(flights, "orphan", P2)  # its record went with the broker's state
    partitions.detach({P0, P1})
    partitions.detach({P2}, records_lost=True)
    partitions.adopt({P1})
    assert abandoned == [moved.request_id]
    assert {f.request_id for f in flights} == {back.request_id, orphan.request_id}
    assert back.attached is False  # attached again when its record is redelivered
    assert orphan.orphaned and not orphan.attached
    assert partitions.joined
