"""The engine process: builds the model and steps it on its own main thread.

It is the only process of a worker that runs torch, so torch's thread pools
and the GIL are the engine's alone (the service's Redis and Kafka I/O lives in
the parent). A reader thread takes commands off the pipe into a queue; the
main thread applies every queued command between two steps, waits for one only
when it has nothing to run, and sends each step's outputs back in one frame.
A constrained request whose grammar is not compiled yet is compiled on a
background thread first, and added (or refused with the compiler's reason)
when that is done: the request waits, the running batch does not.

It ends on ``Stop``, when the service's end of the pipe closes (the service
died), or on a failure, which it reports as ``Failed`` before exiting 1.
Signals are the service's to handle: Ctrl-C in a terminal reaches the whole
process group, and the engine must outlive it until the service drains.
"""

import contextlib
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import NoReturn

from queue_schemas.logs import configure_logging
from worker.device import dtype_name
from worker.engine.llm_engine import LLMEngine
from worker.engine_process.prompts import engine_prompt, template_tool_parser
from worker.engine_process.protocol import (
    Abort,
    Accepted,
    Add,
    Command,
    EngineCounters,
    EngineLoad,
    Event,
    Failed,
    Output,
    ProcessSettings,
    Ready,
    Refused,
    StepOutput,
    StepStats,
    Stop,
    decode,
    encode,
    reason_for,
)
from worker.execution.model_runner import kv_bytes_per_block
from worker.outputs import RequestDelta

log = logging.getLogger("genfleet.engine")


@dataclass
class Compiled:
    """On the inbox: the grammar an add waited for is compiled (or failed to)."""

    add: Add


class EngineCore:
    def __init__(self, engine: LLMEngine, conn: Connection, auto_tool_choice: bool = True) -> None:
        self.engine = engine
        self.conn = conn
        self.auto_tool_choice = auto_tool_choice
        self.inbox: queue.Queue[Command | Compiled] = queue.Queue()
        self.applied = 0
        # Adds waiting for their grammar: whether an abort came for them meanwhile.
        self._compiling: dict[str, bool] = {}
        # Requests that asked for logprobs: whether their token texts skip special tokens.
        self._texts_for: dict[str, bool] = {}

    def send(self, message: Event) -> None:
        self.conn.send_bytes(encode(message))

    def load(self) -> EngineLoad:
        pool, scheduler = self.engine.block_manager, self.engine.scheduler
        return EngineLoad(
            free_blocks=pool.num_free_blocks,
            total_blocks=pool.num_blocks,
            waiting=scheduler.num_waiting,
            running=len(scheduler.running),
        )

    def read_commands(self) -> None:
        """On the reader thread: the pipe into the inbox; a closed pipe is a Stop."""
        try:
            while True:
                self.inbox.put(decode(self.conn.recv_bytes()))  # type: ignore[arg-type]
        except (EOFError, OSError):
            self.inbox.put(Stop())

    def serve(self) -> None:
        engine = self.engine
        self.send(
            Ready(
                self.load(),
                engine.max_model_len,
                engine.config.block_size,
                dtype_name(engine.runner.kv_cache.dtype),
                engine.weights.formats,
                engine.weights.bytes,
                engine.weights.active_bytes,
                kv_bytes_per_block(engine.runner.model, engine.config) // engine.config.block_size,
                engine.config.tensor_parallel_size,
                template_tool_parser(engine.tokenizer),
            )
        )
        while True:
            # Every command that has arrived; wait for one only when there is nothing to run.
            commands = [] if self.engine.has_unfinished_requests() else [self.inbox.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    commands.append(self.inbox.get_nowait())
            for command in commands:
                if isinstance(command, Stop):
                    return
                self.apply(command)
            applied = self.applied
            # Reported even without a step (a refused add, an abort of a finished
            # request): the service's stall watch waits for the commands it sent.
            deltas, step = self.step() if self.engine.has_unfinished_requests() else ([], None)
            outputs = [Output(delta, self._token_texts(delta)) for delta in deltas]
            busy = self.engine.has_unfinished_requests()
            self.send(StepOutput(outputs, self.load(), self.counters(), step, applied, busy))

    def step(self) -> tuple[list[RequestDelta], StepStats]:
        began = time.perf_counter()
        deltas = self.engine.step()
        batch = self.engine.last_batch
        stats = StepStats(
            time.perf_counter() - began, len(batch.seqs), batch.total_tokens, time.time()
        )
        return deltas, stats

    def counters(self) -> EngineCounters:
        pool, spec = self.engine.block_manager, self.engine.spec_stats
        return EngineCounters(
            self.engine.scheduler.num_preemptions,
            pool.prefix_cache_queries,
            pool.prefix_cache_hits,
            spec.num_drafts,
            spec.num_draft_tokens,
            spec.num_accepted_tokens,
            tuple(spec.accepted_per_position),
        )

    def apply(self, command: Add | Abort | Compiled) -> None:
        if isinstance(command, Compiled):
            self._add(command.add)
            return
        self.applied += 1
        if isinstance(command, Abort):
            if command.request_id in self._compiling:
                self._compiling[command.request_id] = True
            self.engine.abort_request(command.request_id)
            return
        constraint = command.params.structured_outputs
        grammars = self.engine.grammars
        if constraint is not None and grammars is not None and not grammars.is_cached(constraint):
            self._compiling[command.request_id] = False
            compiling = grammars.compile_in_background(constraint)
            compiling.add_done_callback(lambda _: self.inbox.put(Compiled(command)))
            return
        self._add(command)

    def _add(self, command: Add) -> None:
        aborted = self._compiling.pop(command.request_id, False)
        try:
            prompt = engine_prompt(command.job, self.engine.tokenizer, self.auto_tool_choice)
            self.engine.add_request(
                command.request_id,
                prompt,
                command.params,
                command.job.priority,
                command.arrival_time,
                command.resumed_token_ids,
            )
        except Exception as error:  # the request fails alone, the engine is as it was
            self.send(Refused(command.request_id, reason_for(error)))
            return
        if command.params.logprobs is not None:
            self._texts_for[command.request_id] = command.params.skip_special_tokens
        seq = self.engine.requests[command.request_id]
        resumed = (seq.num_output_tokens, seq.num_emitted_chars)
        self.send(Accepted(command.request_id, seq.params, *resumed))
        if aborted:  # its final delta (abort) comes with the next step, as for any abort
            self.engine.abort_request(command.request_id)

    def _token_texts(self, delta: RequestDelta) -> dict[int, str] | None:
        skip = (
            self._texts_for.pop(delta.request_id, None)
            if delta.finished
            else self._texts_for.get(delta.request_id)
        )
        tokenizer = self.engine.tokenizer
        if skip is None or not delta.new_logprobs or tokenizer is None:
            return None
        return {
            token_id: str(tokenizer.decode([token_id], skip_special_tokens=skip))
            for top in delta.new_logprobs
            for token_id in top
        }


def run_engine_process(settings: ProcessSettings, conn: Connection) -> NoReturn:
    """The engine process's entry point (``multiprocessing`` spawns it)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    configure_logging(settings.log_format)
    engine = None
    try:
        engine = LLMEngine(settings.engine_config())
        core = EngineCore(engine, conn, settings.enable_auto_tool_choice)
        threading.Thread(target=core.read_commands, name="commands", daemon=True).start()
        core.serve()
        engine.close()
    except Exception as error:
        log.exception("engine failed")
        if engine is not None:
            engine.close(failed=True)
        cause = "".join(traceback.format_exception_only(error)).strip()
        with contextlib.suppress(OSError):  # the service may be gone already
            conn.send_bytes(encode(Failed(cause)))
        _exit_now(1)
    _exit_now(0)


def _exit_now(code: int) -> NoReturn:
    """Exit without the interpreter's teardown: its last garbage collection walks
    every object torch and the model made, seconds on a loaded CPU, while the
    worker waits to hand its jobs on. The engine is closed; only logs are left."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
