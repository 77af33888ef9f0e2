"""Per-tenant limits, kept in Redis so that every API process counts the same jobs.

- rate: new jobs per minute, counted in fixed one-minute windows;
- outstanding: jobs submitted and not yet final. The set of a tenant's jobs is
  pruned of finished ones (their hash says so, or has expired) at each check,
  so no reader has to report completions back.
"""

import math
import time

from redis.asyncio import Redis

from producer_api.errors import ApiError
from queue_schemas import JobStatus, Names

WINDOW_S = 60
OUTSTANDING_RETRY_AFTER_S = 1


class TenantLimits:
    def __init__(self, redis: Redis, names: Names) -> None:
        self.redis = redis
        self.names = names

    async def admit(self, tenant: str, jobs: int, per_minute: int, max_outstanding: int) -> None:
        """Count ``jobs`` new jobs against the tenant, or raise 429 with Retry-After."""
        now = time.time()
        window = int(now // WINDOW_S)
        key = self.names.tenant_rate_key(tenant, window)
        pipe = self.redis.pipeline(transaction=True)
        pipe.incrby(key, jobs)
        pipe.expire(key, WINDOW_S * 2)
        count, _ = await pipe.execute()
        if count > per_minute:
            raise ApiError(
                429,
                f"rate limit: at most {per_minute} jobs per minute for tenant {tenant!r}",
                code="rate_limit_exceeded",
                retry_after_s=max(1, math.ceil((window + 1) * WINDOW_S - now)),
            )
        outstanding = await self.outstanding(tenant)
        if outstanding + jobs > max_outstanding:
            raise ApiError(
                429,
                f"tenant {tenant!r} has {outstanding} unfinished jobs (limit {max_outstanding})",
                code="too_many_outstanding_jobs",
                retry_after_s=OUTSTANDING_RETRY_AFTER_S,
            )

    async def outstanding(self, tenant: str) -> int:
        key = self.names.tenant_jobs_key(tenant)
        job_ids = [member.decode() for member in await self.redis.zrange(key, 0, -1)]
        if not job_ids:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(self.names.job_key(job_id), "status")
        statuses = await pipe.execute()
        done = [
            job_id
            for job_id, status in zip(job_ids, statuses, strict=True)
            if status is None or JobStatus(status.decode()).is_final
        ]
        if done:
            await self.redis.zrem(key, *done)
        return len(job_ids) - len(done)
