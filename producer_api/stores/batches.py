"""Batches in Redis, where every API process and the batch runner find them.

Each field of a batch's hash has one writer, so no update is lost to another:
the batch object is written by the runner (and once by the API that creates
it), the cancel request by the API, the submitted count by the runner. The API
shows a batch whose cancel was asked and not yet taken up as ``cancelling``.
Job results are recorded once per job id (``HSETNX``), so a result read twice
(a redelivered record, a restarted runner) counts once.
"""

import time

from redis.asyncio import Redis

from producer_api.schemas.batches import BatchObject
from queue_schemas import JobResult, Names
from queue_schemas.redis_records import as_text

OBJECT, CANCEL, SUBMITTED = "object", "cancel_requested_at", "submitted"


class BatchStore:
    def __init__(self, redis: Redis, names: Names) -> None:
        self.redis = redis
        self.names = names

    async def create(self, batch: BatchObject) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.names.batch_key(batch.tenant, batch.id), OBJECT, _dump(batch))
        pipe.zadd(self.names.tenant_batches_key(batch.tenant), {batch.id: time.time()})
        pipe.sadd(self.names.active_batches_key, f"{batch.tenant}:{batch.id}")
        await pipe.execute()

    async def get(self, tenant: str, batch_id: str) -> BatchObject | None:
        """The batch as its owner sees it: ``cancelling`` once a cancel is asked."""
        fields = await self.redis.hmget(self.names.batch_key(tenant, batch_id), [OBJECT, CANCEL])
        if fields[0] is None:
            return None
        batch = _load(fields[0], tenant)
        if fields[1] is not None and batch.status in ("validating", "in_progress"):
            batch.status, batch.cancelling_at = "cancelling", int(float(fields[1]))
        return batch

    async def page(self, tenant: str, limit: int, after: str | None) -> tuple[list[str], bool]:
        """Batch ids, newest first, after ``after``; and whether more follow."""
        key = self.names.tenant_batches_key(tenant)
        start = 0
        if after is not None:
            rank = await self.redis.zrevrank(key, after)
            if not isinstance(rank, int):
                return [], False
            start = rank + 1
        members = await self.redis.zrevrange(key, start, start + limit)  # without scores
        ids = [as_text(member) for member in members if isinstance(member, bytes | str)]
        return ids[:limit], len(ids) > limit

    async def request_cancel(self, tenant: str, batch_id: str) -> None:
        await self.redis.hsetnx(self.names.batch_key(tenant, batch_id), CANCEL, time.time())

    # The runner's side.

    async def active(self) -> list[tuple[str, str]]:
        pairs = []
        for member in await self.redis.smembers(self.names.active_batches_key):
            tenant, batch_id = as_text(member).split(":", 1)  # tenants hold no ':' (bounds)
            pairs.append((tenant, batch_id))
        return pairs

    async def load(self, tenant: str, batch_id: str) -> tuple[BatchObject, bool, int] | None:
        """The stored object, whether a cancel was asked, and the lines submitted."""
        key = self.names.batch_key(tenant, batch_id)
        fields = await self.redis.hmget(key, [OBJECT, CANCEL, SUBMITTED])
        if fields[0] is None:
            return None
        return _load(fields[0], tenant), fields[1] is not None, int(fields[2] or 0)

    async def save(self, batch: BatchObject) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.names.batch_key(batch.tenant, batch.id), OBJECT, _dump(batch))
        if batch.is_final:
            pipe.srem(self.names.active_batches_key, f"{batch.tenant}:{batch.id}")
        await pipe.execute()

    async def submitted(self, batch: BatchObject, lines: int) -> None:
        await self.redis.hset(self.names.batch_key(batch.tenant, batch.id), SUBMITTED, lines)

    async def exists(self, tenant: str, batch_id: str) -> bool:
        return bool(await self.redis.exists(self.names.batch_key(tenant, batch_id)))

    async def drop_results(self, batch: BatchObject) -> None:
        await self.redis.delete(self.names.batch_results_key(batch.tenant, batch.id))

    async def record_result(self, tenant: str, batch_id: str, result: JobResult) -> JobResult:
        """The job's result as the batch counts it: this one, unless one was recorded
        before (read twice; or recorded by a call whose reply an outage cut off, which
        a retry then finds there)."""
        key = self.names.batch_results_key(tenant, batch_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hsetnx(key, result.job_id, result.model_dump_json())
        pipe.hget(key, result.job_id)
        _, stored = await pipe.execute()
        return JobResult.model_validate_json(stored)

    async def results(self, batch: BatchObject) -> dict[str, JobResult]:
        stored = await self.redis.hgetall(self.names.batch_results_key(batch.tenant, batch.id))
        return {
            as_text(job_id): JobResult.model_validate_json(value)
            for job_id, value in stored.items()
        }


def _dump(batch: BatchObject) -> str:
    return batch.model_dump_json()


def _load(raw: bytes | str, tenant: str) -> BatchObject:
    batch = BatchObject.model_validate_json(raw)
    batch.tenant = tenant  # excluded from the JSON: the key names it
    return batch
