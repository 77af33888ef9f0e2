"""Which models the fleet serves, and where each model's jobs go.

The fleet's default model (``ApiSettings.model``) is always served: its jobs go
to the plain lanes (``genfleet.jobs``), queued in Kafka even while none of its
workers is up, as a single-model fleet has always done. Every other model is
served while a worker announces it (``queue_schemas.announcements``): its jobs
go to its own lanes and consumer group (``Names.for_model``). A request for a
model nobody serves is OpenAI's ``404 model_not_found``.

The announcements are read at most every ``ANNOUNCE_EVERY_S`` per API process,
and again before a 404, so a worker that just started is found at once.
"""

import logging
import time

from pydantic import ValidationError
from redis.asyncio import Redis

from producer_api.errors import ApiError
from producer_api.schemas.reply_stream import ReplyParsers
from queue_schemas import Names
from queue_schemas.announcements import ANNOUNCE_EVERY_S, WorkerAnnouncement
from queue_schemas.redis_records import as_text

log = logging.getLogger("genfleet.api")


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
    )


class ModelDirectory:
    def __init__(self, redis: Redis, names: Names, default_model: str) -> None:
        self.redis = redis
        self.names = names
        self.default_model = default_model
        self._live: list[WorkerAnnouncement] = []
        self._read_at = -float("inf")  # monotonic

    async def live_workers(self, max_age_s: float = ANNOUNCE_EVERY_S) -> list[WorkerAnnouncement]:
        """The announcements of live workers, read again when older than ``max_age_s``."""
        if time.monotonic() - self._read_at > max_age_s:
            self._live = await self._read()
            self._read_at = time.monotonic()
        return self._live

    async def _read(self) -> list[WorkerAnnouncement]:
        ids = await self.redis.zrangebyscore(self.names.live_workers_key, time.time(), "+inf")
        if not ids:
            return []
        keys = [self.names.announcement_key(as_text(worker)) for worker in ids]  # type: ignore[arg-type]
        live = []
        for raw in await self.redis.mget(keys):
            if raw is None:
                continue  # expired between the two reads
            try:
                live.append(WorkerAnnouncement.model_validate_json(raw))
            except ValidationError as error:
                log.warning("unreadable worker announcement ignored: %s", error)
        return live

    async def _named_models(self, max_age_s: float = ANNOUNCE_EVERY_S) -> set[str]:
        """Models live workers serve on lanes of their own. A worker that names the
        default model so would get none of its jobs (they go to the plain lanes): it is
        not listed, and docs/deploy.md says to start such workers without a served name."""
        return {
            worker.model
            for worker in await self.live_workers(max_age_s)
            if not worker.default_lanes and worker.model != self.default_model
        }

    async def served_models(self) -> list[str]:
        """The default model first, then every other model a live worker serves."""
        return [self.default_model, *sorted(await self._named_models())]

    async def context_lengths(self, models: list[str]) -> dict[str, int]:
        """Each of ``models``' context (``max_model_len``) as its live workers announce it;
        a model without a live worker is left out. A miss is read again first: the
        announcements read last may predate its worker's first (a fleet starting)."""
        for max_age_s in (ANNOUNCE_EVERY_S, 0.0):
            lengths: dict[str, int] = {}
            for worker in await self.live_workers(max_age_s):
                model = self.default_model if worker.default_lanes else worker.model
                known = lengths.get(model, worker.max_model_len)
                lengths[model] = min(known, worker.max_model_len)
            if all(model in lengths for model in models):
                break
        return {model: lengths[model] for model in models if model in lengths}

    async def consuming(self, model: str) -> bool:
        """Whether a live worker of ``model`` reads its jobs: it has announced itself and
        its consumer group has given it partitions (a worker that does not say counts)."""
        for max_age_s in (ANNOUNCE_EVERY_S, 0.0):  # a miss is read again (a fleet starting)
            for worker in await self.live_workers(max_age_s):
                served = self.default_model if worker.default_lanes else worker.model
                if served == model and worker.partitions != 0:
                    return True
        return False

    async def reply_parsers(self, model: str) -> ReplyParsers | None:
        """The parsers a live worker of ``model`` reads replies with (None: none has
        announced them); the fleet's workers of one model run with the same flags."""
        for worker in await self.live_workers():
            served = self.default_model if worker.default_lanes else worker.model
            if served == model and worker.tool_call_parser is not None:
                return ReplyParsers(worker.tool_call_parser, worker.reasoning_parser)
        return None

    async def resolve(self, requested: str | None) -> str:
        """The served name of a request's model (None: the default), or a 404."""
        if requested is None or requested == self.default_model:
            return self.default_model
        for max_age_s in (ANNOUNCE_EVERY_S, 0.0):  # a miss is read again before the 404
            if requested in await self._named_models(max_age_s):
                return requested
        raise model_not_found(requested)

    def lanes(self, served_model: str) -> Names:
        """Where a served model's jobs go."""
        return (
            self.names if served_model == self.default_model else self.names.for_model(served_model)
        )
