"""A model's text read as reasoning, content and tool calls, by vLLM's parser names.

The worker reads a finished job's whole text so (its result's ``reasoning``, ``content``
and ``tool_calls``); the API reads the same text as it streams, with the same
functions, so that the chunks add up to the result.

Tool-call formats (``TOOL_CALL_PARSERS``):

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen
  2.5/3, Hermes; and the prompt genfleet writes for templates without tools);
- ``llama3_json``: the reply one JSON object ``{"name", "parameters"}`` (or several,
  joined by ``;``), after an optional ``<|python_tag|>`` (Llama 3.1-3.3);
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}``, or
  ``name[ARGS]{...}`` pairs (Mistral's newer tokenizers);
- ``pythonic``: the reply a Python list of calls, ``[get_weather(city="Paris")]``
  (Llama 3.2 and 4).

Content is the text before the first call. A call whose JSON does not parse is no
call: the text stays content (never an error). Reasoning (``REASONING_PARSERS``):
``qwen3``, a ``<think>...</think>`` block at the start; ``deepseek_r1``, everything
before ``</think>`` (its template opens the block in the prompt).
"""

import ast
import json
import re
from dataclasses import dataclass
from typing import Literal, get_args

ToolCallParser = Literal["hermes", "llama3_json", "mistral", "pythonic"]
ReasoningParser = Literal["qwen3", "deepseek_r1"]
TOOL_CALL_PARSERS: tuple[str, ...] = get_args(ToolCallParser)
THINK_START, THINK_END = "<think>", "</think>"
HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
MISTRAL_START = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z0-9_.:-]+)\[ARGS\]")


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text


def split_reasoning(text: str, parser: str | None) -> tuple[str | None, str]:
    """(reasoning, the rest) of ``text``; no reasoning without a parser or a block."""
    if parser is None:
        return None, text
    opened = text.lstrip().startswith(THINK_START)
    if parser == "qwen3" and not opened:
        return None, text
    body = text.lstrip()[len(THINK_START) :] if opened else text
    reasoning, ended, rest = body.partition(THINK_END)
    return reasoning, rest.lstrip() if ended else ""


def reasoning_in_stream(text: str, parser: str | None) -> tuple[str, int | None]:
    """For a stream: the reasoning of ``text`` so far that can be sent, and where the
    content starts (None while the reasoning may go on, or a block may be opening), so
    that the pieces add up to ``split_reasoning`` of the whole text."""
    if parser is None:
        return "", 0
    stripped = text.lstrip()
    if not stripped or (THINK_START.startswith(stripped) and stripped != THINK_START):
        return "", None  # "<thi": the block may be opening
    opened = stripped.startswith(THINK_START)
    if parser == "qwen3" and not opened:
        return "", 0
    first = len(text) - len(stripped) + len(THINK_START) if opened else 0
    end = text.find(THINK_END, first)
    if end < 0:
        return text[first : _safe_end(text, THINK_END, first)], None
    after = end + len(THINK_END)
    return text[first:end], len(text) - len(text[after:].lstrip())


def _safe_end(text: str, marker: str, start: int) -> int:
    """Where ``text`` may be streamed up to: before a tail that could be the start of
    ``marker``."""
    for size in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if marker.startswith(text[-size:]):
            return len(text) - size
    return len(text)


def call_start(text: str, parser: str) -> int:
    """Where tool-call markup starts, or may be starting, in ``text`` (content so far):
    the content before it can be streamed; ``len(text)`` when none can be."""
    if parser == "hermes":
        found = text.find(HERMES_START)
        return found if found >= 0 else _safe_end(text, HERMES_START, 0)
    if parser == "mistral":
        found = text.find(MISTRAL_START)
        return found if found >= 0 else _safe_end(text, MISTRAL_START, 0)
    stripped = text.lstrip()
    if not stripped:
        return 0
    opener = "[" if parser == "pythonic" else "{"
    if stripped.startswith((opener, PYTHON_TAG)) or PYTHON_TAG.startswith(stripped):
        return 0  # the whole reply may be calls
    return len(text)


def parse_tool_calls(text: str, parser: str) -> tuple[str, list[ParsedCall]]:
    """(content, calls) of a whole reply."""
    if parser not in TOOL_CALL_PARSERS:
        raise ValueError(f"unknown tool-call parser {parser!r}; known: {TOOL_CALL_PARSERS}")
    calls = {
        "hermes": _hermes,
        "llama3_json": _llama3_json,
        "mistral": _mistral,
        "pythonic": _pythonic,
    }[parser](text)
    if not calls:
        return text, []
    return text[: call_start(text, parser)], calls


def _call(entry: object, arguments_key: str = "arguments") -> ParsedCall | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return None
    arguments = entry.get(arguments_key, entry.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments' JSON as a string
        arguments = _json(arguments)
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(entry["name"], json.dumps(arguments, ensure_ascii=False))


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


def _all_or_none(calls: list[ParsedCall | None]) -> list[ParsedCall]:
    """The calls, or none at all where any one is malformed: the text stays content."""
    return [] if None in calls else [call for call in calls if call is not None]


def _hermes(text: str) -> list[ParsedCall]:
    return _all_or_none([_call(_json(block.strip())) for block in _HERMES_BLOCK.findall(text)])


def _llama3_json(text: str) -> list[ParsedCall]:
    body = text.strip().removeprefix(PYTHON_TAG).strip()
    if not body.startswith("{"):
        return []
    return _all_or_none(
        [_call(_json(part), "parameters") for part in body.split(";") if part.strip()]
    )


def _mistral(text: str) -> list[ParsedCall]:
    start = text.find(MISTRAL_START)
    if start < 0:
        return []
    body = text[start + len(MISTRAL_START) :]
    listed = _json(body.strip())
    if isinstance(listed, list):
        return _all_or_none([_call(entry) for entry in listed])
    calls: list[ParsedCall | None] = []
    decoder = json.JSONDecoder()
    while (named := _MISTRAL_NAMED.match(body)) is not None:  # name[ARGS]{...}[TOOL_CALLS]...
        try:
            arguments, end = decoder.raw_decode(body, named.end())
        except json.JSONDecodeError:
            return []
        calls.append(_call({"name": named.group(1), "arguments": arguments}))
        body = body[end:].strip().removeprefix(MISTRAL_START)
    return _all_or_none(calls) if not body.strip() else []


def _pythonic(text: str) -> list[ParsedCall]:
    body = text.strip().removeprefix(PYTHON_TAG).strip()
    if not (body.startswith("[") and body.endswith("]")):
        return []
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return []
    if not isinstance(tree, ast.List) or not tree.elts:
        return []
    calls: list[ParsedCall | None] = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return []
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        except (ValueError, SyntaxError, RecursionError):
            return []
        calls.append(_call({"name": node.func.id, "arguments": arguments}))
    return _all_or_none(calls)


def parse_required_calls(text: str) -> list[ParsedCall]:
    """The calls of a reply constrained to ``tools.calls_schema``'s list (none if the
    reply was cut short)."""
    listed = _json(text)
    if not isinstance(listed, list):
        return []
    return _all_or_none([_call(entry) for entry in listed])
