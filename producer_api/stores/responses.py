"""The Responses API's records in Redis: per response (its job's id, under its tenant)
the request's echoed fields, its input items and the conversation it continues, kept as
long as the job's own keys (``result_ttl_s``)."""

import json
from typing import Any

from redis.asyncio import Redis

from producer_api.errors import ApiError
from queue_schemas.fleet_settings import FleetSettings


def response_not_found(response_id: str) -> ApiError:
    return ApiError(404, f"No response found with id '{response_id}'.", code="not_found")


class ResponseStore:
    def __init__(self, redis: Redis, settings: FleetSettings) -> None:
        self.redis = redis
        self.names = settings.names
        self.ttl_s = settings.result_ttl_s

    async def save(self, tenant: str, record: dict[str, Any]) -> None:
        key = self.names.response_key(tenant, record["id"])
        await self.redis.set(key, json.dumps(record), ex=self.ttl_s)

    async def load(self, tenant: str, response_id: str) -> dict[str, Any]:
        raw = await self.redis.get(self.names.response_key(tenant, response_id))
        if raw is None:
            raise response_not_found(response_id)
        record: dict[str, Any] = json.loads(raw)
        return record

    async def delete(self, tenant: str, response_id: str) -> None:
        if not await self.redis.delete(self.names.response_key(tenant, response_id)):
            raise response_not_found(response_id)
