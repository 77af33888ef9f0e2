"""Per-request sampling settings, validated where they enter the engine."""

from dataclasses import dataclass, field

from queue_schemas.bounds import INT32_MAX, INT64_MAX, INT64_MIN
from queue_schemas.structured import StructuredOutputs

# A temperature below this is treated as greedy decoding.
GREEDY_TEMPERATURE = 1e-5


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop, shaped like vLLM's ``SamplingParams``.

    ``top_k`` of 0 or -1 disables top-k; ``temperature`` of 0 is greedy.
    ``logprobs`` asks for the sampled token's logprob plus that many top
    alternatives (0 = only the sampled one, None = none). ``structured_outputs``
    constrains the output to a JSON Schema, any JSON object, a regex, a choice or an
    EBNF grammar (a ``StructuredOutputs``, or its fields as a dict).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputs | None = None

    def __post_init__(self) -> None:
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputs.model_validate(self.structured_outputs)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self._validate()

    def _validate(self) -> None:
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (
                -1 <= self.top_k <= INT32_MAX,
                f"top_k must be -1 (off), 0 (off) or in [1, {INT32_MAX}], got {self.top_k}",
            ),
            (
                self.seed is None or INT64_MIN <= self.seed <= INT64_MAX,
                f"seed must be a 64-bit signed integer, got {self.seed}",
            ),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (
                self.repetition_penalty > 0,
                f"repetition_penalty must be > 0, got {self.repetition_penalty}",
            ),
            (
                -2 <= self.presence_penalty <= 2,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
            ),
            (
                -2 <= self.frequency_penalty <= 2,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (
                self.max_tokens is None or self.max_tokens >= 1,
                f"max_tokens must be at least 1, got {self.max_tokens}",
            ),
            (self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
            ),
            (
                self.logprobs is None or self.logprobs >= 0,
                f"logprobs must be >= 0, got {self.logprobs}",
            ),
            (all(self.stop), "stop strings must not be empty"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def uses_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
