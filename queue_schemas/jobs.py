"""The job a client asks for: what producers put on the jobs topic."""

import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from queue_schemas.bounds import MAX_MESSAGES, JobId, Metadata, Priority, TenantName, TokenId
from queue_schemas.sampling import SamplingOptions
from queue_schemas.structured import StructuredOutputs
from queue_schemas.tools import NamedToolChoice, Tool, ToolCall, ToolChoice, Tools, calls_schema
from queue_schemas.versioning import (
    MODEL_DEFAULTS_VERSION,
    SCHEMA_VERSION,
    STRUCTURED_OUTPUTS_VERSION,
    TOOLS_VERSION,
    WireModel,
    check_version,
)

# Longest timeout a job may ask for: a year, far past any batch window.
MAX_TIMEOUT_S = 365 * 24 * 3600.0
TimeoutSeconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)]

__all__ = ["ChatMessage", "JobId", "JobRequest", "SamplingOptions", "StructuredOutputs"]


class ChatMessage(WireModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] | None = Field(
        default=None, description="an assistant's calls (needs schema_version 4)"
    )
    tool_call_id: str | None = Field(
        default=None, description="a tool message: the call it answers"
    )
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _no_content_is_empty(cls, content: object) -> object:
        """An assistant message that only calls tools has null content, as OpenAI sends it."""
        return "" if content is None else content


class JobRequest(WireModel):
    """One generation job. Exactly one of ``prompt``, ``prompt_token_ids``, ``messages``."""

    schema_version: int = Field(
        default=SCHEMA_VERSION,
        description="1; 2 for a job with sampling.structured_outputs (the default then); "
        "3 for unset sampling fields taken from the model's defaults, and for timeout_s",
    )
    job_id: JobId
    tenant: TenantName = "default"
    prompt: str | None = None
    prompt_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = (
        None
    )
    sampling: SamplingOptions = SamplingOptions()
    tools: Tools | None = Field(
        default=None, description="functions the model may call (needs schema_version 4)"
    )
    tool_choice: ToolChoice | None = Field(
        default=None,
        description="none, auto (the default with tools), required, or "
        '{"type": "function", "function": {"name": ...}}',
    )
    parallel_tool_calls: bool = Field(default=True, description="false: one call at most")
    priority: Priority = Field(default=0, description="lower runs first")
    metadata: Metadata = Field(default_factory=dict, description="echoed in the result")
    deadline: datetime | None = Field(
        default=None, description="not started after this, stopped if still running: expired"
    )
    timeout_s: TimeoutSeconds | None = Field(
        default=None,
        description="a deadline this many seconds after created_at (else after the record's "
        "Kafka timestamp); needs schema_version 3",
    )
    created_at: datetime | None = None

    @model_validator(mode="before")
    @classmethod
    def _version_of_its_meaning(cls, data: Any) -> Any:
        """Without a version given, a constrained job is written at the version that
        carries the constraint."""
        if isinstance(data, dict) and "schema_version" not in data:
            if data.get("tools"):
                return {**data, "schema_version": TOOLS_VERSION}
            sampling = data.get("sampling")
            constrained = (
                sampling.structured_outputs is not None
                if isinstance(sampling, SamplingOptions)
                else isinstance(sampling, dict) and sampling.get("structured_outputs") is not None
            )
            if constrained:
                return {**data, "schema_version": STRUCTURED_OUTPUTS_VERSION}
        return data

    @field_validator("deadline", "created_at")
    @classmethod
    def _utc_unless_said(cls, moment: datetime | None) -> datetime | None:
        """A time without a zone is UTC, so every time compares with every other."""
        if moment is not None and moment.tzinfo is None:
            return moment.replace(tzinfo=UTC)
        return moment

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        check_version(version)
        return version

    @model_validator(mode="after")
    def _fields_need_their_version(self) -> "JobRequest":
        needs = {
            "sampling.structured_outputs": (
                self.sampling.structured_outputs is not None,
                STRUCTURED_OUTPUTS_VERSION,
            ),
            "timeout_s": (self.timeout_s is not None, MODEL_DEFAULTS_VERSION),
            "tools": (self.tools is not None, TOOLS_VERSION),
            "messages' tool_calls": (_calls_in(self.messages), TOOLS_VERSION),
        }
        for name, (given, version) in needs.items():
            if given and self.schema_version < version:
                raise ValueError(
                    f"{name} needs schema_version {version} (a reader of version "
                    f"{self.schema_version} would ignore it)"
                )
        return self

    @model_validator(mode="after")
    def _tool_choice_fits(self) -> "JobRequest":
        choice = self.tool_choice
        if choice is None or choice == "none":
            return self
        if not self.tools:
            raise ValueError(f"tool_choice {_choice_name(choice)} needs tools")
        names = {tool.function.name for tool in self.tools}
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not a tool")
        if choice != "auto" and self.sampling.structured_outputs is not None:
            raise ValueError(
                f"tool_choice {_choice_name(choice)} constrains the output itself: "
                "drop sampling.structured_outputs"
            )
        return self

    @property
    def effective_tool_choice(self) -> ToolChoice:
        """``tool_choice``, or its default: auto with tools, none without."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def requested_sampling(self) -> SamplingOptions:
        """The sampling as this record's version means it: from version 3 on, unset
        fields are left to the serving model's defaults; before, they are the neutral
        values (an old record keeps its meaning). A required or named tool choice adds
        its constraint: JSON of the calls (``tools.calls_schema``)."""
        sampling = self.sampling
        schema = calls_schema(
            self.tools or [], self.effective_tool_choice, self.parallel_tool_calls
        )
        if schema is not None:
            sampling = sampling.model_copy(
                update={"structured_outputs": StructuredOutputs(json=schema)}
            )
        if self.schema_version >= MODEL_DEFAULTS_VERSION:
            return sampling
        return sampling.with_defaults()

    def expires_at(self, produced_at: datetime) -> datetime | None:
        """When the job stops being useful: the earlier of ``deadline`` and ``timeout_s``
        after its creation (``produced_at`` for a record that does not say when)."""
        ends = [self.deadline] if self.deadline is not None else []
        if self.timeout_s is not None:
            with contextlib.suppress(OverflowError):  # past year 9999: no end
                ends.append((self.created_at or produced_at) + timedelta(seconds=self.timeout_s))
        return min(ends, default=None)

    @model_validator(mode="after")
    def _one_prompt(self) -> "JobRequest":
        names = ("prompt", "prompt_token_ids", "messages")
        given = [name for name in names if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"exactly one of {', '.join(names)} must be given; got {given or 'none'}"
            )
        return self


def _choice_name(choice: ToolChoice) -> str:
    return choice.function.name if isinstance(choice, NamedToolChoice) else choice


def _calls_in(messages: Sequence[ChatMessage] | None) -> bool:
    return any(message.tool_calls for message in messages or ())


def lowest_version(
    sampling: SamplingOptions,
    tools: list[Tool] | None = None,
    messages: Sequence[ChatMessage] | None = None,
) -> int:
    """The version a job with these options, ``tools`` and ``messages`` is written at by a
    writer that leaves unset fields to the model (the API): the lowest that carries its
    meaning."""
    if tools is not None or _calls_in(messages):
        return TOOLS_VERSION
    if sampling.unset:
        return MODEL_DEFAULTS_VERSION
    if sampling.structured_outputs is not None:
        return STRUCTURED_OUTPUTS_VERSION
    return SCHEMA_VERSION
