"""One chat choice's text as it streams, read as its worker reads the whole
(``worker.service.replies``, with the same ``queue_schemas.tool_parsers``), so that
the chunks add up to the result: ``reasoning_content`` while the model thinks,
``content`` up to where a tool call may start, then at the end what the result says
is left, and the calls, each named once with its arguments.

A named tool choice streams the call as it is decoded: its name (and id) at once, then
the arguments as fragments. A required one is JSON of several calls: sent whole at
the end. Where the model's parsers are not known (no worker of it has announced
them yet), a reply with tools is sent once read whole (what is sent is then still
right), and one without streams as plain text.
"""

from dataclasses import dataclass
from typing import Any

from queue_schemas import JobResult
from queue_schemas.tool_parsers import call_start, reasoning_in_stream
from queue_schemas.tools import NamedToolChoice, ToolChoice, call_id


@dataclass(frozen=True)
class ReplyParsers:
    """The parsers a model's workers read its replies with (their announcements)."""

    tool_call_parser: str | None
    reasoning_parser: str | None


PLAIN = ReplyParsers(None, None)


class ReplyStream:
    def __init__(self, job_id: str, tool_choice: ToolChoice, parsers: ReplyParsers | None) -> None:
        self.job_id = job_id
        self.tool_choice = tool_choice
        if parsers is None and tool_choice == "none":
            parsers = PLAIN
        self.parsers = parsers
        self.text = ""
        self.sent_reasoning = 0
        self.sent_content = 0
        self.sent_arguments: int | None = None  # a named call's, once it is opened

    def delta(self, new_text: str) -> dict[str, Any] | None:
        """The fields of the chunk's delta for ``new_text`` (None: nothing to send yet)."""
        self.text += new_text
        parsers = self.parsers
        if parsers is None:
            return None
        out: dict[str, Any] = {}
        reasoning, content_start = reasoning_in_stream(self.text, parsers.reasoning_parser)
        if len(reasoning) > self.sent_reasoning:
            out["reasoning_content"] = reasoning[self.sent_reasoning :]
            self.sent_reasoning = len(reasoning)
        if content_start is None:
            return out or None
        rest = self.text[content_start:]
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            out["tool_calls"] = [self._named_fragment(choice.function.name, rest)]
        elif choice != "required":
            parser = parsers.tool_call_parser
            limit = call_start(rest, parser) if choice == "auto" and parser else len(rest)
            if limit > self.sent_content:
                out["content"] = rest[self.sent_content : limit]
                self.sent_content = limit
        return out or None

    def _named_fragment(self, name: str, arguments: str) -> dict[str, Any]:
        if self.sent_arguments is None:
            self.sent_arguments = len(arguments)
            function = {"name": name, "arguments": arguments}
            return {
                "index": 0,
                "id": call_id(self.job_id, 0),
                "type": "function",
                "function": function,
            }
        fragment = arguments[self.sent_arguments :]
        self.sent_arguments = len(arguments)
        return {"index": 0, "function": {"arguments": fragment}}

    def closing(self, result: JobResult) -> dict[str, Any] | None:
        """What is left once the whole reply is read: the rest of its reasoning and
        content, and its calls (a named call's last fragment)."""
        out: dict[str, Any] = {}
        reasoning = result.reasoning or ""
        if len(reasoning) > self.sent_reasoning:
            out["reasoning_content"] = reasoning[self.sent_reasoning :]
        content = result.text if result.content is None else result.content
        if len(content) > self.sent_content and self.sent_arguments is None:
            out["content"] = content[self.sent_content :]
        calls = result.tool_calls or []
        if self.sent_arguments is not None:
            if calls and len(calls[0].function.arguments) > self.sent_arguments:
                arguments = calls[0].function.arguments[self.sent_arguments :]
                out["tool_calls"] = [{"index": 0, "function": {"arguments": arguments}}]
        elif calls:
            out["tool_calls"] = [
                {
                    "index": i,
                    "id": call.id,
                    "type": "function",
                    "function": call.function.model_dump(),
                }
                for i, call in enumerate(calls)
            ]
        return out or None
