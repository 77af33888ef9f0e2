"""In-memory stand-ins for the API's Kafka submitter and Redis stores, so that every
route runs in process (``httpx.ASGITransport``) with no broker and no Redis. Each
keeps what the real one would, and fails as the real one does."""

import time
from pathlib import Path

import httpx
from fastapi import FastAPI

from producer_api.app import create_app
from producer_api.errors import ApiError
from producer_api.metrics import ApiMetrics
from producer_api.schemas.batches import BatchObject
from producer_api.services.fleet import Fleet
from producer_api.services.kafka_submit import KafkaUnavailable
from producer_api.services.models import ModelDirectory
from producer_api.settings import ApiSettings
from producer_api.stores.jobs import cancelled_result
from queue_schemas import JobRequest, JobResult, JobState, JobStatus, Names
from queue_schemas.announcements import WorkerAnnouncement
from queue_schemas.redis_records import EventCursor, JobEvent

# Nothing listens here: a real Redis client fails at once (connection refused).
NO_REDIS = "redis://127.0.0.1:1/0"


class FakeSubmitter:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, JobRequest]] = []  # topic, key, job
        self.results: list[JobResult] = []
        self.down = False

    async def submit(self, jobs: list[JobRequest], keys: list[str], topic: str) -> None:
        if self.down:
            raise KafkaUnavailable("KafkaConnectionError", 2)
        self.sent += [(topic, key, job) for job, key in zip(jobs, keys, strict=True)]

    async def send_result(self, result: JobResult) -> bool:
        self.results.append(result)
        return not self.down

    async def ready(self) -> bool:
        return not self.down

    async def stop(self) -> None:
        pass


class FakeJobStore:
    def __init__(self) -> None:
        self.states: dict[tuple[str, str], JobState] = {}

    async def record_queued(self, jobs: list[JobRequest]) -> None:
        for job in jobs:
            state = JobState(job_id=job.job_id, tenant=job.tenant, status=JobStatus.QUEUED)
            self.states[job.tenant, job.job_id] = state

    async def forget(self, jobs: list[JobRequest]) -> None:
        for job in jobs:
            self.states.pop((job.tenant, job.job_id), None)

    async def exists(self, tenant: str, job_id: str) -> bool:
        return (tenant, job_id) in self.states

    async def state(self, job_id: str, tenant: str) -> JobState:
        if (tenant, job_id) not in self.states:
            raise ApiError(404, f"no job {job_id!r}", code="job_not_found")
        return self.states[tenant, job_id]

    async def history(self, tenant: str, job_id: str, cursor: EventCursor) -> list[JobEvent]:
        return []

    async def text_so_far(self, tenant: str, job_id: str) -> str:
        return ""

    async def cancel(self, job_id: str, tenant: str) -> tuple[JobState, JobResult | None]:
        state = await self.state(job_id, tenant)
        if state.status.is_final:
            raise ApiError(
                409, f"job {job_id!r} is already {state.status.value}", code="job_finished"
            )
        result = cancelled_result(job_id, tenant)
        self.states[tenant, job_id] = state.model_copy(update={"status": JobStatus.CANCELLED})
        return self.states[tenant, job_id], result

    async def result_sent(self, tenant: str, job_id: str) -> None:
        pass


class FakeLimits:
    """At most ``max_outstanding`` jobs per tenant, counted as the real limits count."""

    def __init__(self, max_outstanding: int) -> None:
        self.max_outstanding = max_outstanding
        self.admitted: dict[str, int] = {}

    async def admit(
        self, tenant: str, job_ids: list[str], per_minute: int, max_outstanding: int
    ) -> None:
        count = self.admitted.get(tenant, 0)
        if count + len(job_ids) > self.max_outstanding:
            raise ApiError(
                429,
                f"tenant {tenant!r} has {count} unfinished jobs",
                code="too_many_outstanding_jobs",
                retry_after_s=5,
            )
        self.admitted[tenant] = count + len(job_ids)


class AnnouncedModels(ModelDirectory):
    """The real directory, over announcements held here instead of read from Redis."""

    def __init__(self, names: Names, default_model: str) -> None:
        super().__init__(None, names, default_model)
        self.announced: list[WorkerAnnouncement] = []

    async def live_workers(self, max_age_s: float = 0.0) -> list[WorkerAnnouncement]:
        return list(self.announced)

    def announce(self, model: str | None, max_model_len: int, partitions: int = 1) -> None:
        self.announced.append(
            WorkerAnnouncement(
                worker_id=f"w{len(self.announced)}",
                model=model or self.default_model,
                default_lanes=model is None,
                max_model_len=max_model_len,
                kv_blocks_total=100,
                kv_blocks_free=100,
                running=0,
                waiting=0,
                partitions=partitions,
                announced_at=time.time(),
            )
        )


class FakeBatchStore:
    def __init__(self) -> None:
        self.batches: dict[tuple[str, str], BatchObject] = {}

    async def create(self, batch: BatchObject) -> None:
        self.batches[batch.tenant, batch.id] = batch

    async def get(self, tenant: str, batch_id: str) -> BatchObject | None:
        return self.batches.get((tenant, batch_id))

    async def page(self, tenant: str, limit: int, after: str | None) -> tuple[list[str], bool]:
        ids = [batch_id for owner, batch_id in self.batches if owner == tenant]
        return ids[:limit], len(ids) > limit

    async def request_cancel(self, tenant: str, batch_id: str) -> None:
        batch = self.batches[tenant, batch_id]
        self.batches[tenant, batch_id] = batch.model_copy(update={"status": "cancelling"})


class FakeFleet:
    """The app and its fleet, every Kafka and Redis part replaced by a fake above;
    files on a real folder."""

    def __init__(self, files_dir: Path, max_outstanding: int = 1000, **settings: object) -> None:
        self.settings = ApiSettings(
            redis_url=NO_REDIS,
            files_dir=files_dir,
            partition_key="job_id",  # affinity spills count in Redis
            **settings,
        )
        self.fleet = Fleet(self.settings, ApiMetrics())
        self.submitter = self.fleet.submitter = FakeSubmitter()
        self.store = self.fleet.store = FakeJobStore()
        self.fleet.limits = FakeLimits(max_outstanding)
        self.models = AnnouncedModels(self.settings.names, self.settings.model)
        self.fleet.models = self.fleet.backlog.models = self.models
        self.fleet.batches = FakeBatchStore()
        self.app: FastAPI = create_app(self.settings)
        self.app.state.fleet = self.fleet

    def client(self, api_key: str | None = None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(transport=transport, base_url="http://api", headers=headers)
