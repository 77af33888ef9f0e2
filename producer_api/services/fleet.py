"""The API process's connections and the one way every route submits jobs."""

import asyncio
import logging
import time
import uuid
from collections.abc import Coroutine
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis

from producer_api.auth import KeyRing, Tenant
from producer_api.metrics import ApiMetrics
from producer_api.services.affinity import Spill, affinity_key
from producer_api.services.backlog import FleetBacklog
from producer_api.services.fanout import LiveFanout
from producer_api.services.kafka_submit import JobSubmitter
from producer_api.services.limits import TenantLimits
from producer_api.services.models import ModelDirectory
from producer_api.settings import ApiSettings
from producer_api.stores.batches import BatchStore
from producer_api.stores.files import FileStore, LocalFileStore
from producer_api.stores.jobs import JobStore
from producer_api.stores.responses import ResponseStore
from queue_schemas import JobRequest

CLIENT_NAME = "genfleet-api"
log = logging.getLogger("genfleet.api")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class Fleet:
    def __init__(self, settings: ApiSettings, metrics: ApiMetrics) -> None:
        self.settings = settings
        self.names = settings.names
        self.metrics = metrics
        self.keys = KeyRing(settings)
        # Bounded: a burst of stream clients queues for a connection instead of opening one each.
        pool = BlockingConnectionPool.from_url(
            settings.redis_url,
            max_connections=settings.redis_max_connections,
            timeout=settings.retry_after_s,
            client_name=CLIENT_NAME,
        )
        self.redis = Redis(connection_pool=pool)
        self.fanout = LiveFanout(
            settings.redis_url, self.names.api_channel, settings.sse_client_buffer
        )
        self.store = JobStore(self.redis, settings)
        self.responses = ResponseStore(self.redis, settings)
        self.limits = TenantLimits(self.redis, self.names)
        self.models = ModelDirectory(self.redis, self.names, settings.model)
        self.spill = Spill(
            self.redis, self.names, settings.affinity_spill_after, settings.affinity_window_s
        )
        self.submitter = JobSubmitter(settings, self.names)
        self.backlog = FleetBacklog(settings, self.models, metrics)
        self.batches = BatchStore(self.redis, self.names)
        self.files: FileStore = LocalFileStore(
            settings.files_dir, settings.max_file_bytes, settings.max_file_lines
        )
        self._background: set[asyncio.Task] = set()

    async def start(self) -> None:
        await self.fanout.start()
        self.backlog.start()

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run work that must outlive the request that started it (a cancel on hang-up)."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        # Said here, with its reason, rather than as asyncio's "exception was never
        # retrieved" whenever the task is collected (a cancel while Redis is away).
        self._background.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("background work failed: %r", error, exc_info=error)

    async def stop(self) -> None:
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.backlog.stop()
        await self.submitter.stop()
        await self.fanout.stop()
        await self.redis.aclose()

    async def partition_keys(self, jobs: list[tuple[JobRequest, str | None]]) -> list[str]:
        """Each (job, affinity hint)'s Kafka record key (``services.affinity``)."""
        if self.settings.partition_key == "job_id":
            return [job.job_id for job, _ in jobs]
        return await self.spill.lanes([affinity_key(job, hint) for job, hint in jobs])

    async def submit(
        self,
        tenant: Tenant,
        jobs: list[JobRequest],
        route: str,
        model: str,
        hint: str | None = None,
    ) -> None:
        """Within the tenant's limits, recorded ``queued`` in Redis, acknowledged by Kafka
        on the lanes of the served ``model`` (keyed by ``hint``, the request's
        ``prompt_cache_key`` or ``user``, if given)."""
        started = time.perf_counter()
        await self.limits.admit(
            tenant.tenant,
            [job.job_id for job in jobs],
            per_minute=self.keys.rate_limit(tenant),
            max_outstanding=self.keys.max_outstanding(tenant),
        )
        keys = await self.partition_keys([(job, hint) for job in jobs])
        await self.store.record_queued(jobs)
        try:
            await self.submitter.submit(jobs, keys, self.models.lanes(model).jobs_topic)
        except Exception:
            await self.store.forget(jobs)
            raise
        self.metrics.jobs_submitted.labels(route, model).inc(len(jobs))
        self.metrics.submit_seconds.observe(time.perf_counter() - started)

    async def cancel(self, tenant: Tenant, job_id: str) -> None:
        _, result = await self.store.cancel(job_id, tenant.tenant)
        if result is not None and await self.submitter.send_result(result):
            await self.store.result_sent(tenant.tenant, job_id)

    async def ready(self, fleet: bool = True) -> dict[str, bool]:
        """The checks of ``/readyz``: Kafka and Redis answer, and (``fleet``) a worker of
        the default model reads its jobs, so that a request sent now is served now."""
        try:
            redis_ok = bool(await self.redis.ping())
        except Exception:
            redis_ok = False
        checks = {"kafka": await self.submitter.ready(), "redis": redis_ok}
        if fleet:
            try:
                checks["workers"] = await self.models.consuming(self.settings.model)
            except Exception:  # Redis away: said by the redis check
                checks["workers"] = False
        return checks
