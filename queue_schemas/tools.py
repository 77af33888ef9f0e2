"""Tools a job may call, as OpenAI's chat API names them, and the calls a result carries.

``tool_choice`` is OpenAI's: ``none`` (no call), ``auto`` (the model chooses, its calls
recognised in its text by the worker's tool-call parser), ``required`` (at least one
call), or a named function (exactly that one). The last two are exact: the worker
constrains decoding to JSON that ``calls_schema`` describes, so a call always names a
given tool and its arguments validate against that tool's ``parameters``.
"""

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from queue_schemas.structured import check_json_schema
from queue_schemas.versioning import WireModel

MAX_TOOLS = 128
FUNCTION_NAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"  # OpenAI's, and the dots and colons MCP uses
FunctionName = Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)]
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class FunctionDefinition(WireModel):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] = Field(
        default_factory=lambda: dict(EMPTY_PARAMETERS),
        description="a JSON Schema of the arguments (an object)",
    )
    strict: bool | None = Field(default=None, description="accepted; calls always validate")

    @field_validator("parameters", mode="before")
    @classmethod
    def _valid_schema(cls, schema: object) -> object:
        return dict(EMPTY_PARAMETERS) if schema is None else check_json_schema(schema)


class Tool(WireModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChosenFunction(WireModel):
    name: FunctionName


class NamedToolChoice(WireModel):
    type: Literal["function"] = "function"
    function: ChosenFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
Tools = Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)]


class FunctionCall(WireModel):
    name: str
    arguments: str = Field(description="the arguments as JSON text, as OpenAI gives them")


class ToolCall(WireModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


def call_id(job_id: str, index: int) -> str:
    """A call's id: the same for the same job and place, so that a redelivered job's
    duplicate result is identical."""
    return "call_" + hashlib.sha256(f"{job_id}\0{index}".encode()).hexdigest()[:24]


def tool_call(job_id: str, index: int, name: str, arguments: object) -> ToolCall:
    """A call with ``arguments`` (an object, or its JSON text) in compact JSON."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(
        id=call_id(job_id, index), function=FunctionCall(name=name, arguments=arguments)
    )


def _call_schema(tool: Tool) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool.function.name},
            "arguments": tool.function.parameters,
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def calls_schema(tools: list[Tool], choice: ToolChoice, parallel: bool) -> dict[str, Any] | None:
    """The JSON Schema a constrained choice's output follows, or None (``auto``,
    ``none``): for ``required`` a list of calls ({"name", "arguments"}, at least one;
    one only without ``parallel``), for a named function its arguments alone."""
    if isinstance(choice, NamedToolChoice):
        return next(t.function.parameters for t in tools if t.function.name == choice.function.name)
    if choice != "required":
        return None
    calls = [_call_schema(tool) for tool in tools]
    item = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {"type": "array", "items": item, "minItems": 1} | ({} if parallel else {"maxItems": 1})
