"""Per-tenant limits, kept in Redis so that every API process counts the same jobs.

- rate: new jobs per minute, counted in fixed one-minute windows;
- outstanding: jobs submitted and not yet final, a sorted set per tenant
  (score: submit time). Finished jobs (their hash says so, or has expired) are
  pruned at each check, so no reader has to report completions back.

Both checks and the reservation of the new jobs run as one Lua script: two
requests of a tenant arriving together cannot both take the last place.
"""

import math
import time

from redis.asyncio import Redis

from producer_api.errors import ApiError
from queue_schemas import JobStatus, Names

WINDOW_S = 60
OUTSTANDING_RETRY_AFTER_S = 1
# A reserved job has no hash for the few milliseconds until it is recorded; a job
# without a hash for longer than this is gone (expired, or never produced).
RECORD_GRACE_S = 30
# The script's verdicts (0: admitted).
OVER_RATE, OVER_OUTSTANDING = 1, 2

# KEYS: rate counter, tenant's job set.
# ARGV: per_minute, window ttl, max_outstanding, job key prefix, now, grace,
#       final statuses (comma-separated), then the new job ids.
_ADMIT = """
local new_jobs = #ARGV - 7
local count = redis.call('INCRBY', KEYS[1], new_jobs)
redis.call('EXPIRE', KEYS[1], ARGV[2])
if count > tonumber(ARGV[1]) then return {1, count} end
local final = {}
for status in string.gmatch(ARGV[7], '[^,]+') do final[status] = true end
local now, grace = tonumber(ARGV[5]), tonumber(ARGV[6])
local live = 0
local members = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #members, 2 do
  local id, since = members[i], tonumber(members[i + 1])
  local status = redis.call('HGET', ARGV[4] .. id, 'status')
  if (status and final[status]) or ((not status) and now - since > grace) then
    redis.call('ZREM', KEYS[2], id)
  else
    live = live + 1
  end
end
if live + new_jobs > tonumber(ARGV[3]) then return {2, live} end
for i = 8, #ARGV do redis.call('ZADD', KEYS[2], now, ARGV[i]) end
return {0, live}
"""


class TenantLimits:
    def __init__(self, redis: Redis, names: Names) -> None:
        self.redis = redis
        self.names = names
        self._admit = redis.register_script(_ADMIT)
        self._final = ",".join(status.value for status in JobStatus if status.is_final)

    async def admit(
        self, tenant: str, job_ids: list[str], per_minute: int, max_outstanding: int
    ) -> None:
        """Count the new jobs against the tenant and reserve their places, or raise 429."""
        now = time.time()
        window = int(now // WINDOW_S)
        keys = [self.names.tenant_rate_key(tenant, window), self.names.tenant_jobs_key(tenant)]
        args: list[str | int | float] = [
            per_minute, WINDOW_S * 2, max_outstanding, self.names.job_key(tenant, ""), now,
            RECORD_GRACE_S, self._final, *job_ids,
        ]  # fmt: skip
        verdict, count = await self._admit(keys=keys, args=args)
        if verdict == OVER_RATE:
            raise ApiError(
                429,
                f"rate limit: at most {per_minute} jobs per minute for tenant {tenant!r}",
                code="rate_limit_exceeded",
                retry_after_s=max(1, math.ceil((window + 1) * WINDOW_S - now)),
            )
        if verdict == OVER_OUTSTANDING:
            raise ApiError(
                429,
                f"tenant {tenant!r} has {count} unfinished jobs (limit {max_outstanding})",
                code="too_many_outstanding_jobs",
                retry_after_s=OUTSTANDING_RETRY_AFTER_S,
            )
