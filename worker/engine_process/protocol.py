"""What the service and the engine process say to each other over their pipe.

Plain dataclasses, pickled: every message is one ``send_bytes`` frame. The
service sends commands; the engine answers each ``Add`` once (``Accepted`` or
``Refused``) and sends one ``StepOutput`` per step, carrying every delta of
that step and the load snapshot that admission control reads; commands that
needed no step (a refused add on an idle engine) get an empty one.
Imports no torch, so the service process never loads it.
"""

import pickle
from dataclasses import dataclass, field
from typing import Protocol

from queue_schemas import JobRequest, SamplingOptions
from queue_schemas.logs import LogFormat
from worker.config import EngineConfig
from worker.outputs import RequestDelta


class ProcessSettings(Protocol):
    """What the engine process is started with (the worker's settings, pickled): the
    engine's config is resolved there, where torch may be imported."""

    model: str
    log_format: LogFormat
    enable_auto_tool_choice: bool

    def engine_config(self) -> EngineConfig: ...


def reason_for(error: BaseException) -> str:
    """Why a request cannot be served: a ValueError names it; anything else is shown whole."""
    return str(error) if isinstance(error, ValueError) else f"cannot be served: {error!r}"


@dataclass
class Add:
    request_id: str
    # The engine process turns the job into a prompt (chat template, length check):
    # the tokenizer lives there only.
    job: JobRequest
    # As the job's version means it; unset fields take the model's defaults there.
    params: SamplingOptions
    # When the service took the job (wall clock): the worker's TTFT and e2e start here.
    arrival_time: float
    # Output an earlier attempt streamed (a taken-over job): the engine resumes after it.
    resumed_token_ids: list[int] = field(default_factory=list)


@dataclass
class Abort:
    request_id: str


@dataclass
class Stop:
    """Finish the current step and exit."""


Command = Add | Abort | Stop


@dataclass
class EngineLoad:
    """What admission control reads, refreshed after every step."""

    free_blocks: int
    total_blocks: int
    waiting: int
    running: int = 0


@dataclass
class Ready:
    """The model is loaded and the engine takes requests."""

    load: EngineLoad
    max_model_len: int
    block_size: int
    kv_cache_dtype: str
    weight_formats: str
    weight_bytes: int  # on each rank
    active_weight_bytes: int  # what one token reads: the experts it is not routed to left out
    kv_bytes_per_token: int  # on each rank, every layer's
    tensor_parallel_size: int
    # The tool-call parser of the format the chat template asks for (prompts.py).
    template_tool_parser: str = "hermes"


@dataclass
class Accepted:
    request_id: str
    # What the request runs with: its sampling, the model's defaults filled in.
    applied: SamplingOptions
    # Of the resumed output: the tokens the engine goes on from, and the characters of
    # text they have emitted (fewer than sent when one of them would have ended it).
    resumed_tokens: int = 0
    resumed_chars: int = 0


@dataclass
class Refused:
    """The engine cannot serve this request (a ValueError naming why); nothing else changed."""

    request_id: str
    reason: str


@dataclass
class Output:
    delta: RequestDelta
    # Each top-logprob token's text, for readers without the tokenizer (the API's
    # OpenAI logprobs); None when the request asked for no logprobs.
    token_texts: dict[int, str] | None = None


@dataclass
class EngineCounters:
    """Totals since the engine started; the service's metrics count their increments."""

    preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up
    prefix_cache_hits: int = 0  # prompt tokens found cached
    # Speculative decoding (worker.spec_decode.proposers.SpecDecodeStats).
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: tuple[int, ...] = ()


@dataclass
class StepStats:
    seconds: float
    num_seqs: int
    num_tokens: int
    ended_at: float  # wall clock: when this step's tokens came out


@dataclass
class StepOutput:
    outputs: list[Output]
    load: EngineLoad
    counters: EngineCounters
    step: StepStats | None  # None when commands needed an answer but no step ran
    # How many commands the engine had applied when the step began, and whether
    # it still has requests: the service's stall watch reads both.
    applied: int
    busy: bool


@dataclass
class Failed:
    """The engine cannot go on (a step raised, the model did not load); it exits next."""

    reason: str


Event = Ready | Accepted | Refused | StepOutput | Failed


def encode(message: Command | Event) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(frame: bytes) -> Command | Event:
    # Both ends of the pipe are this worker's own processes: the frames are trusted.
    message: Command | Event = pickle.loads(frame)
    return message
