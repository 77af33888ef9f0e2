"""A job's prompt as the engine takes it: chat messages through the model's chat
template, with the job's tools. Runs in the engine process, the one place the
tokenizer lives; the engine's admission checks the result.

A template that takes ``tools`` renders them (and calls and tool results in the
history) its own way, and its model answers in its own format. One that does not
(SmolLM2's) gets genfleet's tool prompt, as llama.cpp's server does: the tools in a
system message that asks for ``<tool_call>`` blocks (read by the ``hermes`` parser),
earlier calls written as such blocks and tool results as ``<tool_response>`` user
turns, so tool calling works on every model.
"""

import json
from typing import Any

from transformers import PreTrainedTokenizerBase

from queue_schemas import ChatMessage, JobRequest
from queue_schemas.tools import Tool
from worker.engine.admission import Prompt

GENERIC_TOOL_PROMPT = """You can call functions. The functions, as JSON Schemas:
<tools>
{tools}
</tools>
To call a function, answer with one block per call and nothing else:
<tool_call>
{{"name": "<function name>", "arguments": <the arguments as a JSON object>}}
</tool_call>
When no function helps, answer in plain text."""
# Markers of a template's own tool-call format, in the order they are looked for,
# and the parser that reads that format.
TEMPLATE_FORMATS = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("[func_name1(", "pythonic"),
    ("<|python_tag|>", "llama3_json"),
    ('"parameters"', "llama3_json"),
)


def takes_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    template = tokenizer.chat_template
    return isinstance(template, str) and "tools" in template


def template_tool_parser(tokenizer: PreTrainedTokenizerBase | None) -> str:
    """The parser of the format the model's template asks for; ``hermes`` where the
    template takes no tools (genfleet's prompt asks for that format)."""
    if tokenizer is None or not takes_tools(tokenizer):
        return "hermes"
    template = str(tokenizer.chat_template)
    return next((parser for marker, parser in TEMPLATE_FORMATS if marker in template), "hermes")


def engine_prompt(
    job: JobRequest, tokenizer: PreTrainedTokenizerBase | None, auto_tool_choice: bool = True
) -> Prompt:
    """The job's prompt as the engine takes it; chat messages go through the chat template."""
    if job.prompt_token_ids is not None:
        return {"prompt_token_ids": list(job.prompt_token_ids)}
    if job.messages is not None:
        if tokenizer is None or tokenizer.chat_template is None:
            raise ValueError("chat messages need a model with a chat template")
        choice = job.effective_tool_choice
        if choice == "auto" and not auto_tool_choice:
            raise ValueError(
                "tool_choice auto needs a worker started with --enable-auto-tool-choice"
            )
        tools = job.tools if choice != "none" else None
        text = _render(tokenizer, job.messages, tools)
        assert isinstance(text, str)  # tokenize=False renders one conversation as text
        return text
    assert job.prompt is not None
    return job.prompt


def _render(
    tokenizer: PreTrainedTokenizerBase, messages: list[ChatMessage], tools: list[Tool] | None
) -> Any:
    if tools is not None and takes_tools(tokenizer):
        specs: list[dict[Any, Any] | Any] = [tool.model_dump(exclude_none=True) for tool in tools]
        return tokenizer.apply_chat_template(
            [_template_message(m) for m in messages],
            tools=specs,
            tokenize=False,
            add_generation_prompt=True,
        )
    plain = [_plain_message(m) for m in messages]
    if tools is not None:
        plain = _with_tool_prompt(plain, tools)
    return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)


def _template_message(message: ChatMessage) -> dict[str, Any]:
    """As templates read a message: calls' arguments as objects (they write them out
    with ``tojson``), a tool result with its call's id and name."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": _arguments(call.function.arguments),
                },
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _arguments(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _plain_message(message: ChatMessage) -> dict[str, str]:
    """A message for a template without tools: calls as ``<tool_call>`` blocks, a tool
    result as a ``<tool_response>`` user turn."""
    if message.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message.content}\n</tool_response>"}
    blocks = [
        "<tool_call>\n"
        + json.dumps({"name": c.function.name, "arguments": _arguments(c.function.arguments)})
        + "\n</tool_call>"
        for c in message.tool_calls or []
    ]
    return {"role": message.role, "content": "\n".join([message.content, *blocks]).strip()}


def _with_tool_prompt(messages: list[dict[str, str]], tools: list[Tool]) -> list[dict[str, str]]:
    """The tool prompt as the system message, after the conversation's own one."""
    specs = "\n".join(json.dumps(tool.function.model_dump(exclude_none=True)) for tool in tools)
    prompt = GENERIC_TOOL_PROMPT.format(tools=specs)
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [{"role": "system", "content": f"{first['content']}\n\n{prompt}"}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]
