"""OpenAI's Responses API: its request body as a fleet job, and a job as a response.

A response is one job (its id, ``resp_...``) with a response's face: ``input`` (text, or
message, ``function_call`` and ``function_call_output`` items) after ``instructions``
and the conversation ``previous_response_id`` names becomes the job's messages;
``text.format`` its output constraint; function ``tools`` (the Responses API's flat
shape) its tools. The response object is built from the job's state whenever it is
read: ``queued``, ``in_progress``, then ``completed``, ``incomplete`` (cut by
``max_output_tokens``), ``failed`` or ``cancelled``.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from producer_api.schemas.openai_constraints import JsonSchemaFormat
from queue_schemas import ChatMessage, JobState, JobStatus, SamplingOptions, StructuredOutputs
from queue_schemas.bounds import JobId, Metadata, OutputTokens, Temperature, TopP
from queue_schemas.tools import (
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    Tool,
    ToolCall,
    ToolChoice,
)

MAX_INPUT_ITEMS = 4096


class TextPart(BaseModel):
    type: Literal["input_text", "output_text", "text"]
    text: str


class MessageItem(BaseModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]

    def text(self) -> str:
        content = self.content
        return content if isinstance(content, str) else "".join(p.text for p in content)


class FunctionCallItem(BaseModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(BaseModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem


class FunctionToolSpec(BaseModel):
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def as_tool(self) -> Tool:
        function = FunctionDefinition(
            name=self.name, description=self.description, parameters=self.parameters
        )
        return Tool(function=function)


class NamedFunction(BaseModel):
    type: Literal["function"]
    name: FunctionName


class TextFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    def constraint(self) -> StructuredOutputs | None:
        if self.type == "json_object":
            return StructuredOutputs(json_object=True)
        if self.type == "json_schema":
            checked = JsonSchemaFormat.model_validate({"schema": self.schema_ or {}})
            return StructuredOutputs(json=checked.schema_)
        return None


class TextOptions(BaseModel):
    format: TextFormat | None = None


class ResponseCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_INPUT_ITEMS)]
    instructions: str | None = None
    max_output_tokens: OutputTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    text: TextOptions | None = None
    tools: Annotated[list[FunctionToolSpec], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool = True
    store: bool = True
    metadata: Metadata | None = None
    previous_response_id: JobId | None = None
    background: bool = False
    stream: bool = False
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None

    def items(self) -> list[InputItem]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def job_tools(self) -> dict[str, Any]:
        """The job's tool fields (none without tools or a choice)."""
        if self.tools is None and self.tool_choice is None:
            return {}
        choice: ToolChoice | None
        if isinstance(self.tool_choice, NamedFunction):
            choice = NamedToolChoice.model_validate({"function": {"name": self.tool_choice.name}})
        else:
            choice = self.tool_choice
        tools = [tool.as_tool() for tool in self.tools] if self.tools else None
        return {
            "tools": tools,
            "tool_choice": choice,
            "parallel_tool_calls": self.parallel_tool_calls,
        }

    def sampling(self) -> SamplingOptions:
        given = {
            name: value
            for name, value in (("temperature", self.temperature), ("top_p", self.top_p))
            if value is not None
        }
        text_format = self.text.format if self.text is not None else None
        return SamplingOptions(
            **given,
            max_tokens=self.max_output_tokens,
            structured_outputs=None if text_format is None else text_format.constraint(),
        )

    def echo(self) -> dict[str, Any]:
        """The request's fields a response object repeats."""
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "tools": [tool.model_dump(exclude_none=True) for tool in self.tools or []],
            "tool_choice": self.tool_choice.model_dump()
            if isinstance(self.tool_choice, NamedFunction)
            else self.tool_choice or "auto",
            "parallel_tool_calls": self.parallel_tool_calls,
            "store": self.store,
            "metadata": self.metadata or {},
            "previous_response_id": self.previous_response_id,
            "background": self.background,
            "service_tier": "default",  # the interactive lane, whatever was asked
            "text": {"format": {"type": "text"}}
            if self.text is None or self.text.format is None
            else {"format": self.text.format.model_dump(by_alias=True, exclude_none=True)},
        }


def as_messages(items: list[InputItem]) -> list[ChatMessage]:
    """Input items as chat messages: a function call as an assistant's call, its output
    as a tool message."""
    messages: list[ChatMessage] = []
    for item in items:
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append(ChatMessage(role=role, content=item.text()))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(
                id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments)
            )
            messages.append(ChatMessage(role="assistant", tool_calls=[call]))
        else:
            messages.append(
                ChatMessage(role="tool", content=item.output, tool_call_id=item.call_id)
            )
    return messages


def reply_messages(state: JobState) -> list[ChatMessage]:
    """What a finished response said, as the conversation's next message."""
    content = state.text if state.content is None else state.content
    return [ChatMessage(role="assistant", content=content, tool_calls=state.tool_calls)]


STATUSES = {
    JobStatus.QUEUED: "queued",
    JobStatus.RUNNING: "in_progress",
    JobStatus.COMPLETED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
    JobStatus.EXPIRED: "failed",
}


def response_object(record: dict[str, Any], state: JobState) -> dict[str, Any]:
    """The response as OpenAI's client reads it, from its stored record and job state."""
    response_id = record["id"]
    status = STATUSES[state.status]
    incomplete = None
    if state.status is JobStatus.COMPLETED and state.finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    error = None
    if state.status in (JobStatus.FAILED, JobStatus.EXPIRED):
        error = {"code": "server_error", "message": state.error or state.status.value}
    usage = None
    if state.status.is_final:
        usage = {
            "input_tokens": state.usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": state.usage.cached_tokens},
            "output_tokens": state.usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": state.usage.total_tokens,
        }
    return {
        "id": response_id,
        "object": "response",
        "created_at": record["created_at"],
        "status": status,
        "model": record["model"],
        "output": _output(response_id, state) if state.status is JobStatus.COMPLETED else [],
        "usage": usage,
        "error": error,
        "incomplete_details": incomplete,
        **record["echo"],
    }


def _output(response_id: str, state: JobState) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    done = "incomplete" if state.finish_reason == "length" else "completed"
    if state.reasoning:
        summary = [{"type": "summary_text", "text": state.reasoning}]
        items.append({"type": "reasoning", "id": f"rs_{response_id}", "summary": summary})
    content = state.text if state.content is None else state.content
    if content or not state.tool_calls:
        text = {"type": "output_text", "text": content, "annotations": []}
        items.append({
            "type": "message", "id": f"msg_{response_id}", "status": done,
            "role": "assistant", "content": [text],
        })  # fmt: skip
    for call in state.tool_calls or []:
        items.append({
            "type": "function_call", "id": f"fc_{call.id}", "call_id": call.id,
            "name": call.function.name, "arguments": call.function.arguments,
            "status": "completed",
        })  # fmt: skip
    return items
