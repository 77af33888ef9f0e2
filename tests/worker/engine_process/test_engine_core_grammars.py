"""The engine process compiles grammars off its step loop: the request waits, the batch runs."""

import threading
import time
from multiprocessing import Pipe
from pathlib import Path

import pytest

from queue_schemas import JobRequest
from worker import LLMEngine
from worker.engine_process.core import EngineCore
from worker.engine_process.protocol import (
    Abort,
    Accepted,
    Add,
    Event,
    Refused,
    StepOutput,
    Stop,
    decode,
    encode,
)
from worker.sampling_params import SamplingParams


class _Core:
    """An engine core on a thread of this process, talked to over a real pipe."""

    def __init__(self, model: Path) -> None:
        self.conn, engine_end = Pipe()
        self.core = EngineCore(LLMEngine.from_kwargs(model=str(model)), engine_end)
        threading.Thread(target=self.core.read_commands, daemon=True).start()
        self.serving = threading.Thread(target=self.core.serve, daemon=True)
        self.serving.start()
        self.events: list[Event] = []
        self.next()  # Ready

    def add(self, request_id: str, params: SamplingParams) -> None:
        job = JobRequest(job_id=request_id, prompt_token_ids=[5, 6, 7])
        self.conn.send_bytes(encode(Add(request_id, job, params, time.time())))

    def next(self) -> Event:
        assert self.conn.poll(60), "the engine said nothing for 60 s"
        event = decode(self.conn.recv_bytes())
        self.events.append(event)  # type: ignore[arg-type]
        return event  # type: ignore[return-value]

    def until(self, done) -> None:
        while not done():
            self.next()

    def finished(self, request_id: str) -> str | None:
        for event in self.events:
            if isinstance(event, StepOutput):
                for output in event.outputs:
                    if output.delta.request_id == request_id and output.delta.finished:
                        return output.delta.finish_reason
        return None

    def answered(self, request_id: str) -> Event | None:
        answers = (e for e in self.events if isinstance(e, Accepted | Refused))
        return next((e for e in answers if e.request_id == request_id), None)

    def stop(self) -> None:
        self.conn.send_bytes(encode(Stop()))
        self.serving.join(10)


def test_a_slow_compile_holds_its_request_only(chat_model: Path, monkeypatch) -> None:
    core = _Core(chat_model)
    grammars = core.core.engine.grammars
    assert grammars is not None
    release = threading.Event()
    build = grammars._build

    def slow_build(constraint):
        if constraint.kind == "regex":
            assert release.wait(60)
        return build(constraint)

    monkeypatch.setattr(grammars, "_build", slow_build)
    try:
        core.add("slow", SamplingParams(max_tokens=8, structured_outputs={"regex": "[ab]{4}"}))
        core.add("free", SamplingParams(max_tokens=6, ignore_eos=True))
        core.until(lambda: core.finished("free"))
        assert core.answered("slow") is None  # still compiling while "free" ran to its end
        release.set()
        core.until(lambda: core.finished("slow"))
        assert isinstance(core.answered("slow"), Accepted)
        assert core.finished("slow") == "stop"

        core.add("bad", SamplingParams(structured_outputs={"grammar": "root ::= ("}))
        core.until(lambda: core.answered("bad"))
        refused = core.answered("bad")
        assert isinstance(refused, Refused) and "cannot compile the grammar" in refused.reason

        release.clear()
        core.add("dropped", SamplingParams(structured_outputs={"regex": "[cd]{4}"}))
        core.conn.send_bytes(encode(Abort("dropped")))
        time.sleep(0.5)
        release.set()
        core.until(lambda: core.finished("dropped"))
        assert core.finished("dropped") == "abort"
        assert core.core.engine.block_manager.num_free_blocks == (
            core.core.engine.block_manager.num_blocks
        )
    finally:
        release.set()
        core.stop()


@pytest.mark.parametrize("constraint", [{"choice": ["x", "y"]}, {"json_object": True}])
def test_a_cached_grammar_is_added_at_once(chat_model: Path, constraint, monkeypatch) -> None:
    core = _Core(chat_model)
    try:
        grammars = core.core.engine.grammars
        assert grammars is not None
        params = SamplingParams(max_tokens=4, structured_outputs=constraint)
        assert params.structured_outputs is not None
        grammars.compile(params.structured_outputs)
        monkeypatch.setattr(grammars, "compile_in_background", lambda _: pytest.fail("compiled"))
        core.add("r", params)
        core.until(lambda: core.answered("r"))
        assert isinstance(core.answered("r"), Accepted)
    finally:
        core.stop()
