"""The engine in its own thread, so the event loop never waits for a forward pass.

The event loop hands requests and aborts over a queue; the thread applies
them between steps and posts each step's deltas back to the loop. A request
the engine refuses fails alone (its ``add`` raises); a step that raises ends
the thread and is reported through ``on_failure``, so the worker stops loudly
instead of serving nothing. ``stalled_for`` tells a watchdog how long the
thread has had work without finishing a step.
"""

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from worker.engine import LLMEngine, Prompt
from worker.outputs import RequestDelta
from worker.sampling_params import SamplingParams


@dataclass
class _Add:
    request_id: str
    prompt: Prompt
    params: SamplingParams
    priority: int
    accepted: Future


@dataclass
class _Abort:
    request_id: str


@dataclass
class EngineLoad:
    """What admission control reads, refreshed after every step."""

    free_blocks: int
    total_blocks: int
    waiting: int


log = logging.getLogger("genfleet.worker")


class EngineThread:
    def __init__(
        self,
        engine: LLMEngine,
        on_deltas: Callable[[list[RequestDelta]], None],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.engine = engine
        self._on_deltas = on_deltas
        self._on_failure = on_failure
        self._commands: queue.Queue[_Add | _Abort | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.load = self._snapshot()
        # Monotonic time the running step began; None between steps.
        self._busy_since: float | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._commands.put(None)
        self._thread.join(timeout=30)

    def stalled_for(self) -> float:
        """Seconds the thread has been in one step (0 while idle or between steps)."""
        busy_since = self._busy_since
        return 0.0 if busy_since is None else time.monotonic() - busy_since

    def add(
        self, request_id: str, prompt: Prompt, params: SamplingParams, priority: int = 0
    ) -> "asyncio.Future[None]":
        """Queue a request now; the future raises the engine's error if it refuses it.
        Requests queued together reach the engine between the same two steps."""
        accepted: Future = Future()
        self._commands.put(_Add(request_id, prompt, params, priority, accepted))
        return asyncio.wrap_future(accepted)

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    def _snapshot(self) -> EngineLoad:
        pool = self.engine.block_manager
        return EngineLoad(
            free_blocks=pool.num_free_blocks,
            total_blocks=pool.num_blocks,
            waiting=self.engine.scheduler.num_waiting,
        )

    def _apply(self, command: _Add | _Abort) -> None:
        if isinstance(command, _Abort):
            self.engine.abort_request(command.request_id)
            return
        try:
            self.engine.add_request(
                command.request_id, command.prompt, command.params, command.priority
            )
        except Exception as error:  # the request fails alone, the engine is as it was
            command.accepted.set_exception(error)
        else:
            command.accepted.set_result(None)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as error:
            log.exception("engine step failed")
            self._on_failure(error)

    def _serve(self) -> None:
        while True:
            try:
                # Apply every command that has arrived; wait for one only when idle.
                while True:
                    command = self._commands.get(block=not self.engine.has_unfinished_requests())
                    if command is None:
                        return
                    self._apply(command)
            except queue.Empty:
                pass
            self._busy_since = time.monotonic()
            deltas = self.engine.step()
            self._busy_since = None
            self.load = self._snapshot()
            if deltas:
                self._on_deltas(deltas)
