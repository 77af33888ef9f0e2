"""How to sample a job's tokens: the one definition of every sampling knob and its bounds.

The API's bodies, the Kafka records and the offline engine's ``SamplingParams``
all validate through ``SamplingOptions``; the engine reads it as it is.

Six fields may be left unset (absent, or null on the wire), as vLLM's server
leaves them: ``temperature``, ``top_p``, ``top_k``, ``min_p``,
``repetition_penalty`` and ``max_tokens``. A worker fills them from the model's
generation config (``with_defaults``), then from the neutral values the fields
declare here (vLLM's: temperature 1, no top-k/top-p/min-p, no penalty, output up
to the model's context). What was unset stays unset through every dump, so the
API, Kafka and the engine process all see the request as the client sent it.
"""

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from queue_schemas.bounds import (
    MinP,
    MinTokens,
    OutputTokens,
    Penalty,
    RepetitionPenalty,
    Seed,
    StopList,
    StopTokenIds,
    Temperature,
    TopK,
    TopLogprobs,
    TopP,
)
from queue_schemas.structured import StructuredOutputs
from queue_schemas.versioning import WireModel

# A temperature below this is treated as greedy decoding.
GREEDY_TEMPERATURE = 1e-5
# The fields a model's generation config gives defaults for (vLLM's
# ``get_diff_sampling_param``); ``max_new_tokens`` there is ``max_tokens`` here.
MODEL_DEFAULTED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens")


class SamplingOptions(WireModel):
    """How to sample; the bounds are the engine's (vLLM's) and OpenAI's (``bounds``).

    ``top_k`` of 0 or -1 disables top-k; ``temperature`` of 0 is greedy.
    ``logprobs`` asks for the sampled token's logprob plus that many top
    alternatives (0 = only the sampled one, None = none). ``structured_outputs``
    constrains the output to a JSON Schema, any JSON object, a regex, a choice or an
    EBNF grammar.
    """

    temperature: Temperature = Field(1.0, description="unset: the model's default, else 1")
    top_p: TopP = Field(1.0, description="unset: the model's default, else 1 (off)")
    top_k: TopK = Field(0, description="unset: the model's default, else 0 (off)")
    min_p: MinP = Field(0.0, description="unset: the model's default, else 0 (off)")
    repetition_penalty: RepetitionPenalty = Field(
        1.0, description="unset: the model's default, else 1 (off)"
    )
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    seed: Seed | None = None
    max_tokens: OutputTokens | None = Field(
        default=None,
        description="unset: the model's max_new_tokens, else up to the model's context length",
    )
    min_tokens: MinTokens = 0
    stop: StopList = Field(default_factory=list)
    stop_token_ids: StopTokenIds = Field(default_factory=list)
    ignore_eos: bool = False
    logprobs: TopLogprobs | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputs | None = Field(
        default=None, description="constrain the output (needs schema_version 2)"
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        """A null defaulted field means what an absent one means."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (v is None and k in MODEL_DEFAULTED)}
        return data

    @model_validator(mode="after")
    def _min_within_max(self) -> "SamplingOptions":
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        return self

    @model_serializer(mode="wrap")
    def _without_unset_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Unset fields stay out of every dump, so they stay unset where it is read."""
        dumped: dict[str, Any] = handler(self)
        for name in MODEL_DEFAULTED:
            if name not in self.model_fields_set:
                dumped.pop(name, None)
        return dumped

    @property
    def unset(self) -> tuple[str, ...]:
        """The defaulted fields this request leaves to the model's defaults."""
        return tuple(name for name in MODEL_DEFAULTED if name not in self.model_fields_set)

    def with_defaults(self, defaults: "SamplingOptions | None" = None) -> "SamplingOptions":
        """Every unset field filled: from ``defaults`` where it sets the field (a model's
        generation config), else the neutral value. A default ``max_tokens`` below an
        explicit ``min_tokens`` is raised to it."""
        update: dict[str, Any] = {}
        for name in self.unset:  # an unset field reads as its neutral value
            given = defaults is not None and name in defaults.model_fields_set
            update[name] = getattr(defaults if given else self, name)
        if "max_tokens" in update and update["max_tokens"] is not None:
            update["max_tokens"] = max(update["max_tokens"], self.min_tokens)
        return self.model_copy(update=update)

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
