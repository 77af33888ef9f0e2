"""Request bodies of the OpenAI-compatible routes, and how each becomes fleet jobs.

Field names, bounds and defaults are OpenAI's; the extra sampling fields that
vLLM accepts (``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``,
``min_tokens``, ``stop_token_ids``, ``skip_special_tokens``, ``priority``) are
accepted too, e.g. through the openai client's ``extra_body``. Constraints on
the output come as OpenAI's ``response_format``, vLLM's ``structured_outputs``
or vLLM's older ``guided_json``/``guided_regex``/``guided_choice``/
``guided_grammar``: one at a time. A sampling field the body leaves out stays
unset in the jobs (the worker applies the model's defaults); ``timeout_s`` is
genfleet's own (``services.deadlines``). ``tools``, ``tool_choice`` and
``parallel_tool_calls`` are OpenAI's, checked as the jobs check them
(``queue_schemas.tools``); other fields this fleet does not know are ignored.
"""

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from producer_api.schemas.openai_constraints import GUIDED_FIELDS, GuidedChoice, ResponseFormat
from queue_schemas import ChatMessage, SamplingOptions, StructuredOutputs
from queue_schemas.bounds import (
    INT64_MIN,
    MAX_MESSAGES,
    MAX_STOP_STRINGS,
    MinP,
    MinTokens,
    OutputTokens,
    Penalty,
    Priority,
    RepetitionPenalty,
    Seed,
    StopText,
    StopTokenIds,
    Temperature,
    TokenId,
    TopK,
    TopLogprobs,
    TopP,
)
from queue_schemas.jobs import JobRequest, TimeoutSeconds
from queue_schemas.structured import check_json_schema
from queue_schemas.tools import ToolCall, ToolChoice, Tools
from queue_schemas.versioning import TOOLS_VERSION

MAX_CHOICES = 16
# Prompts in one completions request (each is n jobs; the tenant's limits apply too).
MAX_PROMPTS = 256


class StreamOptions(BaseModel):
    include_usage: bool = False


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class OpenAIMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's
    tool_call_id: str | None = None  # a tool result's
    name: str | None = None

    def as_chat_message(self) -> ChatMessage:
        content = self.content or ""
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        # "developer" is OpenAI's newer name for the system role.
        role = "system" if self.role == "developer" else self.role
        return ChatMessage(
            role=role,
            content=content,
            tool_calls=self.tool_calls or None,
            tool_call_id=self.tool_call_id,
            name=self.name,
        )


class GenerationRequest(BaseModel):
    """What the two routes share: OpenAI's sampling fields plus vLLM's extras."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None = None
    max_tokens: OutputTokens | None = None
    user: str | None = None
    # OpenAI's: requests sharing a long prefix say so; the fleet keeps them together.
    prompt_cache_key: str | None = None
    # vLLM's extras.
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool = False
    min_tokens: MinTokens = 0
    stop_token_ids: StopTokenIds | None = None
    skip_special_tokens: bool = True
    priority: Priority = 0
    # Seconds the request may take (``services.deadlines``); genfleet's own extra.
    timeout_s: TimeoutSeconds | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: Annotated[str, Field(min_length=1)] | None = None
    guided_choice: GuidedChoice | None = None
    guided_grammar: Annotated[str, Field(min_length=1)] | None = None

    @property
    def affinity_hint(self) -> str | None:
        """What names the request's conversation (``services.affinity``), if anything."""
        return self.prompt_cache_key or self.user

    @field_validator("guided_json")
    @classmethod
    def _valid_guided_json(cls, schema: dict[str, Any] | str | None) -> dict[str, Any] | None:
        return None if schema is None else check_json_schema(schema)

    @model_validator(mode="after")
    def _one_constraint(self) -> "GenerationRequest":
        given = self._constraint_fields()
        if len(given) > 1:
            raise ValueError(
                f"give one output constraint; got {', '.join(given)}: response_format, "
                f"structured_outputs and {', '.join(GUIDED_FIELDS)} exclude each other"
            )
        return self

    def _constraint_fields(self) -> list[str]:
        names = ["structured_outputs", *GUIDED_FIELDS]
        given = [name for name in names if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.type != "text":
            given.insert(0, "response_format")
        return given

    def constraint(self) -> StructuredOutputs | None:
        """The one output constraint, whichever field it came in."""
        if self.response_format is not None and self.response_format.type != "text":
            return self.response_format.constraint()
        if self.structured_outputs is not None:
            return self.structured_outputs
        for name, kind in GUIDED_FIELDS.items():
            value = getattr(self, name)
            if value is not None:
                return StructuredOutputs.model_validate({kind: value})
        return None

    @model_validator(mode="after")
    def _sampling_is_valid(self) -> "GenerationRequest":
        """What the jobs' options refuse together (min_tokens over max_tokens) is a 422
        here, not an error while the jobs are built."""
        try:
            self.sampling(0)
        except ValidationError as error:
            raise ValueError("; ".join(_reason(e) for e in error.errors())) from None
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def token_limit(self) -> int | None:
        return self.max_tokens

    def top_logprobs_wanted(self) -> int | None:
        """None: no logprobs; otherwise how many alternatives per token."""
        raise NotImplementedError

    def sampling(self, choice: int) -> SamplingOptions:
        """Options of one choice. With a seed, choice i uses seed + i: the n choices differ
        from each other, and the same request gives the same n texts again."""
        given = {
            name: getattr(self, name)
            for name in (
                "temperature", "top_p", "presence_penalty", "frequency_penalty", "top_k",
                "min_p", "repetition_penalty",
            )
            if getattr(self, name) is not None
        }  # fmt: skip
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingOptions(
            **given,
            seed=None if self.seed is None else _wrap_int64(self.seed + choice),
            max_tokens=self.token_limit(),
            min_tokens=self.min_tokens,
            stop=stop,
            stop_token_ids=self.stop_token_ids or [],
            ignore_eos=self.ignore_eos,
            logprobs=self.top_logprobs_wanted(),
            skip_special_tokens=self.skip_special_tokens,
            structured_outputs=self.constraint(),
        )


def _reason(error: ErrorDetails) -> str:
    context = error.get("ctx") or {}
    return str(context.get("error") or error["msg"])


def _wrap_int64(value: int) -> int:
    """Seeds of later choices stay 64-bit signed integers, wrapping around at the top."""
    return INT64_MIN + (value - INT64_MIN) % 2**64


class ChatCompletionRequest(GenerationRequest):
    messages: Annotated[list[OpenAIMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: OutputTokens | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True

    def chat_fields(self) -> dict[str, Any]:
        """The job fields of the conversation: its messages and its tools."""
        fields: dict[str, Any] = {"messages": [m.as_chat_message() for m in self.messages]}
        if self.tools is not None or self.tool_choice is not None:
            fields |= {
                "tools": self.tools,
                "tool_choice": self.tool_choice,
                "parallel_tool_calls": self.parallel_tool_calls,
            }
        return fields

    @model_validator(mode="after")
    def _tools_fit(self) -> "ChatCompletionRequest":
        """What the jobs refuse about the tools (a choice naming no tool, a constrained
        choice beside a response format) is a 422 here."""
        if self.tools is None and self.tool_choice is None:
            return self
        try:
            JobRequest(
                job_id="check", schema_version=TOOLS_VERSION,
                sampling=self.sampling(0), **self.chat_fields(),
            )  # fmt: skip
        except ValidationError as error:
            raise ValueError("; ".join(_reason(e) for e in error.errors())) from None
        return self

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def top_logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


PromptTokens = Annotated[list[TokenId], Field(min_length=1)]


class CompletionRequest(GenerationRequest):
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
        | PromptTokens
        | Annotated[list[PromptTokens], Field(min_length=1, max_length=MAX_PROMPTS)]
    )
    logprobs: TopLogprobs | None = None
    echo: Literal[False] = False
    suffix: None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompt field's forms (text, texts, token ids, lists of token ids) as a list."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(item, int) for item in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]

    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs
