"""The job a client asks for: what producers put on the jobs topic."""

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from queue_schemas.bounds import (
    MAX_MESSAGES,
    JobId,
    Metadata,
    MinTokens,
    OutputTokens,
    Priority,
    Seed,
    StopList,
    StopTokenIds,
    TenantName,
    TokenId,
    TopK,
    TopLogprobs,
)
from queue_schemas.structured import StructuredOutputs
from queue_schemas.versioning import (
    SCHEMA_VERSION,
    STRUCTURED_OUTPUTS_VERSION,
    WireModel,
    check_version,
)

__all__ = ["ChatMessage", "JobId", "JobRequest", "SamplingOptions", "StructuredOutputs"]


class ChatMessage(WireModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class SamplingOptions(WireModel):
    """How to sample; the bounds are the engine's (vLLM's) and OpenAI's (``bounds``)."""

    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: TopK = 0
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0, le=2)] = 1.0
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    seed: Seed | None = None
    max_tokens: OutputTokens | None = Field(
        default=None, description="None: up to the model's context length"
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

    @model_validator(mode="after")
    def _min_within_max(self) -> "SamplingOptions":
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        return self


class JobRequest(WireModel):
    """One generation job. Exactly one of ``prompt``, ``prompt_token_ids``, ``messages``."""

    schema_version: int = Field(
        default=SCHEMA_VERSION,
        description="1; 2 for a job with sampling.structured_outputs (the default then)",
    )
    job_id: JobId
    tenant: TenantName = "default"
    prompt: str | None = None
    prompt_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = (
        None
    )
    sampling: SamplingOptions = SamplingOptions()
    priority: Priority = Field(default=0, description="lower runs first")
    metadata: Metadata = Field(default_factory=dict, description="echoed in the result")
    deadline: datetime | None = Field(default=None, description="not started after this: failed")
    created_at: datetime | None = None

    @model_validator(mode="before")
    @classmethod
    def _version_of_its_meaning(cls, data: Any) -> Any:
        """Without a version given, a constrained job is written at the version that
        carries the constraint."""
        if isinstance(data, dict) and "schema_version" not in data:
            sampling = data.get("sampling")
            constrained = (
                sampling.structured_outputs is not None
                if isinstance(sampling, SamplingOptions)
                else isinstance(sampling, dict) and sampling.get("structured_outputs") is not None
            )
            if constrained:
                return {**data, "schema_version": STRUCTURED_OUTPUTS_VERSION}
        return data

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        check_version(version)
        return version

    @model_validator(mode="after")
    def _constraint_needs_its_version(self) -> "JobRequest":
        if self.sampling.structured_outputs is not None and (
            self.schema_version < STRUCTURED_OUTPUTS_VERSION
        ):
            raise ValueError(
                f"sampling.structured_outputs needs schema_version "
                f"{STRUCTURED_OUTPUTS_VERSION} (a reader of version {self.schema_version} "
                "would ignore the constraint)"
            )
        return self

    @model_validator(mode="after")
    def _one_prompt(self) -> "JobRequest":
        names = ("prompt", "prompt_token_ids", "messages")
        given = [name for name in names if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"exactly one of {', '.join(names)} must be given; got {given or 'none'}"
            )
        return self
