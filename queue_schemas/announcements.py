"""Workers announce themselves in Redis, so the API knows which models the fleet serves.

Every worker writes its ``WorkerAnnouncement`` every ``ANNOUNCE_EVERY_S`` with a TTL of
``ANNOUNCEMENT_TTL_S``, and scores its id in the live-workers set by the time the
announcement expires. A worker that dies stops refreshing and drops out of the listing
within the TTL; one that stops cleanly withdraws at once. Readers take the ids scored
in the future and the announcements still there.
"""

from typing import TYPE_CHECKING

from pydantic import Field

from queue_schemas.names import Names
from queue_schemas.versioning import WireModel

if TYPE_CHECKING:
    from redis.asyncio.client import Pipeline

ANNOUNCE_EVERY_S = 2.0
ANNOUNCEMENT_TTL_S = 10


class WorkerAnnouncement(WireModel):
    worker_id: str
    model: str = Field(description="the name the worker serves its model under")
    default_lanes: bool = Field(
        description="reads the fleet's plain job lanes (its default model) rather than the "
        "lanes of its served name"
    )
    max_model_len: int = Field(ge=1)
    kv_blocks_total: int = Field(ge=0)
    kv_blocks_free: int = Field(ge=0)
    running: int = Field(ge=0, description="jobs in the engine")
    waiting: int = Field(ge=0, description="jobs taken from Kafka, not yet in the engine")
    partitions: int | None = Field(
        default=None,
        ge=0,
        description="job partitions its consumer group has given it (None: a worker that "
        "does not say)",
    )
    tool_call_parser: str | None = Field(
        default=None, description="how its replies are read as tool calls"
    )
    reasoning_parser: str | None = Field(
        default=None, description="how its replies are read as reasoning (None: not)"
    )
    announced_at: float = Field(description="Unix seconds")


def announce(pipe: "Pipeline", names: Names, announcement: WorkerAnnouncement) -> None:
    worker_id = announcement.worker_id
    expires_at = announcement.announced_at + ANNOUNCEMENT_TTL_S
    pipe.set(
        names.announcement_key(worker_id), announcement.model_dump_json(), ex=ANNOUNCEMENT_TTL_S
    )
    pipe.zadd(names.live_workers_key, {worker_id: expires_at})
    # Ids of workers that died long ago go, so the set stays the size of the fleet.
    pipe.zremrangebyscore(names.live_workers_key, "-inf", announcement.announced_at)


def withdraw(pipe: "Pipeline", names: Names, worker_id: str) -> None:
    pipe.delete(names.announcement_key(worker_id))
    pipe.zrem(names.live_workers_key, worker_id)
