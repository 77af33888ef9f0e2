"""The service's handle on the engine process: start it, feed it, hear from it.

The engine process (``engine_process.core``) is spawned, not forked: a fork of a
process with an event loop and threads would inherit their locks. Its pipe is
read by the event loop itself (``add_reader``), one frame per callback, so the
service needs no thread of its own. The engine's end of the pipe closing is how
its death is heard, whatever killed it; a ``Failed`` frame before that names
the cause.
"""

import asyncio
import logging
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from queue_schemas import JobRequest, SamplingOptions
from worker.engine_process.protocol import (
    Abort,
    Accepted,
    Add,
    Command,
    EngineLoad,
    Failed,
    ProcessSettings,
    Ready,
    Refused,
    StepOutput,
    Stop,
    decode,
    encode,
)

log = logging.getLogger("genfleet.worker")
STOP_TIMEOUT_S = 10.0


def _engine_main(settings: ProcessSettings, conn: Connection) -> None:
    """The spawned process's target: torch is imported there, never in the service."""
    from worker.engine_process.core import run_engine_process

    run_engine_process(settings, conn)


class EngineFailed(RuntimeError):
    """The engine process failed or is gone; requests sent to it will not be answered."""


class EngineClient:
    def __init__(
        self,
        settings: ProcessSettings,
        on_step: Callable[[StepOutput], None],
        on_failure: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self._on_step = on_step
        self._on_failure = on_failure
        self._load = EngineLoad(free_blocks=0, total_blocks=1, waiting=0)
        # Numbers of the Add commands the last step's load does not count yet.
        self._adds_in_transit: deque[int] = deque()
        self.failure: str | None = None
        self._pending: dict[str, asyncio.Future[Accepted]] = {}
        self._ready: asyncio.Future[Ready] | None = None
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._stopping = False
        # Commands sent, and the monotonic time since which the engine owes us a
        # step (None while it has nothing to do): the stall watch reads them.
        self._sent = 0
        self._owed_since: float | None = None

    @property
    def load(self) -> EngineLoad:
        """The last step's load, with the requests sent since counted as waiting."""
        return replace(self._load, waiting=self._load.waiting + len(self._adds_in_transit))

    @property
    def ready(self) -> bool:
        """The model is loaded and the engine has not failed."""
        ready = self._ready
        return ready is not None and ready.done() and not ready.exception() and not self.failure

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self) -> Ready:
        """Spawn the engine process and wait for its model; EngineFailed if it cannot load."""
        loop = asyncio.get_running_loop()
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe(duplex=True)
        self._process = context.Process(
            target=_engine_main, args=(self.settings, theirs), name="engine", daemon=True
        )
        self._process.start()
        theirs.close()  # only the child holds its end: its death closes the pipe
        self._conn = ours
        self._ready = loop.create_future()
        loop.add_reader(ours.fileno(), self._readable)
        # Some loops (uvloop) make a watched fd non-blocking; the pipe must stay
        # blocking, or a frame larger than its buffer fails half-written. Blocking
        # is safe: the engine's reader thread drains commands whatever it is doing.
        os.set_blocking(ours.fileno(), True)
        log.info("engine process %d loading %s", self._process.pid, self.settings.model)
        ready = await self._ready
        self._load = ready.load
        return ready

    def add(
        self,
        request_id: str,
        job: JobRequest,
        params: SamplingOptions,
        resumed_token_ids: list[int] | None = None,
    ) -> "asyncio.Future[Accepted]":
        """Send a request (``resumed_token_ids``: output an earlier attempt streamed); the
        future gives the engine's acceptance (the sampling it runs with, the model's
        defaults filled in; what it resumes from), raises ValueError if the engine refuses
        it, and EngineFailed if the engine is gone before it answers."""
        accepted: asyncio.Future[Accepted] = asyncio.get_running_loop().create_future()
        if self.failure is not None:
            accepted.set_exception(EngineFailed(self.failure))
            return accepted
        self._pending[request_id] = accepted
        self._send(Add(request_id, job, params, time.time(), resumed_token_ids or []))
        self._adds_in_transit.append(self._sent)
        return accepted

    def abort(self, request_id: str) -> None:
        if self.failure is None:
            self._send(Abort(request_id))

    def stalled_for(self) -> float:
        """Seconds the engine has owed us a step without sending one."""
        owed = self._owed_since
        return 0.0 if owed is None else time.monotonic() - owed

    async def stop(self) -> None:
        """Ask the engine to exit after its step; kill it if it does not in time."""
        self._stopping = True
        process = self._process
        if process is None:
            return
        if self.failure is None:
            self._send(Stop())
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while process.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if process.is_alive():
            log.warning("engine process did not stop within %.0f s: killing it", STOP_TIMEOUT_S)
            process.kill()
        process.join(timeout=STOP_TIMEOUT_S)
        self._close()

    def _send(self, command: Command) -> None:
        if self._conn is None or self._conn.closed:
            return
        if not isinstance(command, Stop):
            self._sent += 1
            if self._owed_since is None:
                self._owed_since = time.monotonic()
        try:
            self._conn.send_bytes(encode(command))
        except OSError:  # the engine's end is closed: it died
            self._gone()

    def _readable(self) -> None:
        assert self._conn is not None
        try:
            message = decode(self._conn.recv_bytes())
        except (EOFError, OSError):
            self._gone()
            return
        if isinstance(message, StepOutput):
            self._load = message.load
            while self._adds_in_transit and self._adds_in_transit[0] <= message.applied:
                self._adds_in_transit.popleft()
            owes = message.busy or message.applied < self._sent
            self._owed_since = time.monotonic() if owes else None
            self._on_step(message)
        elif isinstance(message, Accepted):
            self._answer(message.request_id, message)
        elif isinstance(message, Refused):
            self._answer(message.request_id, ValueError(message.reason))
        elif isinstance(message, Ready):
            assert self._ready is not None
            self._ready.set_result(message)
        elif isinstance(message, Failed):
            self._fail(f"engine failed: {message.reason}")

    def _answer(self, request_id: str, answer: Accepted | Exception) -> None:
        accepted = self._pending.pop(request_id, None)
        if accepted is None or accepted.done():
            return
        if isinstance(answer, Exception):
            accepted.set_exception(answer)
        else:
            accepted.set_result(answer)

    def _gone(self) -> None:
        self._close()
        if self.failure is not None or self._stopping:
            return
        assert self._process is not None
        self._process.join(timeout=1.0)
        code = self._process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
        self._fail(f"engine process {self._process.pid} died ({how})")

    def _fail(self, reason: str) -> None:
        if self.failure is not None:
            return
        self.failure = reason
        self._owed_since = None
        error = EngineFailed(reason)
        for accepted in self._pending.values():
            if not accepted.done():
                accepted.set_exception(error)
        self._pending.clear()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)  # start() raises it: the model did not load
        else:
            self._on_failure(reason)

    def _close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
            self._conn.close()
