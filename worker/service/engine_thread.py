"""The engine in its own thread, so the event loop never waits for a forward pass.

The event loop hands requests and aborts over a queue; the thread applies
them between steps and posts each step's deltas back to the loop.
"""

import asyncio
import queue
import threading
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


class EngineThread:
    def __init__(self, engine: LLMEngine, on_deltas: Callable[[list[RequestDelta]], None]) -> None:
        self.engine = engine
        self._on_deltas = on_deltas
        self._commands: queue.Queue[_Add | _Abort | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.load = self._snapshot()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._commands.put(None)
        self._thread.join()

    async def add(
        self, request_id: str, prompt: Prompt, params: SamplingParams, priority: int = 0
    ) -> None:
        """Queue a request; raises the engine's ValueError if it refuses it."""
        accepted: Future = Future()
        self._commands.put(_Add(request_id, prompt, params, priority, accepted))
        await asyncio.wrap_future(accepted)

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
        except ValueError as error:
            command.accepted.set_exception(error)
        else:
            command.accepted.set_result(None)

    def _run(self) -> None:
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
            deltas = self.engine.step()
            self.load = self._snapshot()
            if deltas:
                self._on_deltas(deltas)
