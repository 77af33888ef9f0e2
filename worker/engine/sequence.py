"""The state of one request as it moves through the engine."""

import enum
import time
from dataclasses import dataclass, field

import torch

from queue_schemas.sampling import SamplingOptions
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.outputs import FinishReason
from worker.sampling.structured_output import GrammarState


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request: its tokens, its KV blocks, and how far the model has read it.

    ``token_ids`` holds the prompt followed by the generated tokens;
    ``num_computed_tokens`` of them have K/V in the cache. A preempted sequence
    drops its blocks and sets that count back to 0; its tokens stay.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingOptions
    arrival_index: int
    priority: int = 0
    # Output an earlier attempt streamed (a job taken over from a dead worker): its
    # reader is mid-stream, so it goes ahead of every sequence that has not started.
    resumed: bool = False
    arrival_time: float = field(default_factory=time.time)
    detokenizer: IncrementalDetokenizer | None = None
    generator: torch.Generator | None = None
    constraint: GrammarState | None = None

    token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered_blocks: int = 0
    # The first block_ids given back to the pool: wholly before every layer's sliding
    # window, never read again (their ids stay, so that positions keep their blocks).
    num_released_blocks: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    output_text: str = ""
    num_emitted_chars: int = 0
    num_emitted_tokens: int = 0
    logprobs: list[dict[int, float]] = field(default_factory=list)
    scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    # Speculative decoding: tokens proposed to follow token_ids, run (and verified)
    # with the next step's query.
    draft_token_ids: list[int] = field(default_factory=list)
    # A draft model's cache holds token_ids[:num_draft_computed_tokens] (spec_decode.draft_model).
    num_draft_computed_tokens: int = 0

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def order_key(self) -> tuple[int, int, int]:
        """Lower runs first: resumed ones, then by priority, then by arrival."""
        return (0 if self.resumed else 1, self.priority, self.arrival_index)
