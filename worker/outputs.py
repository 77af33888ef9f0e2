"""What the engine hands back: per-step deltas for services, whole outputs for LLM.generate."""

from dataclasses import dataclass, field
from typing import Literal

# Why a request ended: a stop condition, its length limit, or an abort.
FinishReason = Literal["stop", "length", "abort"]


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Timings:
    """Wall-clock seconds since the epoch; None until the event happened."""

    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    # When the scheduler first gave the request a step: queue time ends, prefill begins.
    scheduled_time: float | None = None


@dataclass
class RequestDelta:
    """What one engine step added to one request.

    ``token_index`` is the index of the first of ``new_token_ids`` in the
    request's output, so readers of a replayed stream can drop duplicates.
    """

    request_id: str
    token_index: int
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[dict[int, float]]
    finished: bool
    finish_reason: FinishReason | None
    stop_reason: int | str | None
    usage: Usage
    timings: Timings


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, float]] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    usage: Usage | None = None
    timings: Timings | None = None
