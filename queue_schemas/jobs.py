"""The job a client asks for: what producers put on the jobs topic."""

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from queue_schemas.versioning import SCHEMA_VERSION, WireModel, check_version

JobId = Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]


class ChatMessage(WireModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class SamplingOptions(WireModel):
    """How to sample; the bounds are the engine's (vLLM's) and OpenAI's."""

    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = 0
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0, le=2)] = 1.0
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    seed: int | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="None: up to the model's context length"
    )
    min_tokens: Annotated[int, Field(ge=0)] = 0
    stop: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)] = Field(
        default_factory=list
    )
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    ignore_eos: bool = False
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    skip_special_tokens: bool = True


class JobRequest(WireModel):
    """One generation job. Exactly one of ``prompt``, ``prompt_token_ids``, ``messages``."""

    schema_version: int = SCHEMA_VERSION
    job_id: JobId
    tenant: Annotated[str, Field(min_length=1, max_length=64)] = "default"
    prompt: str | None = None
    prompt_token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = (
        None
    )
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    sampling: SamplingOptions = SamplingOptions()
    priority: int = Field(default=0, description="lower runs first")
    metadata: dict[str, str] = Field(default_factory=dict, description="echoed in the result")
    deadline: datetime | None = Field(default=None, description="not started after this: failed")
    created_at: datetime | None = None

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        check_version(version)
        return version

    @model_validator(mode="after")
    def _one_prompt(self) -> "JobRequest":
        names = ("prompt", "prompt_token_ids", "messages")
        given = [name for name in names if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"exactly one of {', '.join(names)} must be given; got {given or 'none'}"
            )
        return self
