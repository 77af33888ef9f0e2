"""Work that settles one record, run beside the intake (a dead letter, a result to
confirm). A failure nobody foresaw is logged and the record let go: one record
never stops the worker."""

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from queue_schemas.tasks import cancel_and_wait
from worker.service.flights import Record

log = logging.getLogger("genfleet.worker")


class Background:
    def __init__(self, settle: Callable[[Record], None]) -> None:
        self._settle = settle
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, work: Coroutine[Any, Any, None], record: Record) -> None:
        async def guarded() -> None:
            try:
                await work
            except Exception:
                where = record.partition
                log.exception("record %s:%d left unserved", where.topic, record.offset)
                self._settle(record)

        task = asyncio.create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel(self) -> None:
        await cancel_and_wait(list(self._tasks))
