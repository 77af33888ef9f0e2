"""A finished job's text read as reasoning, content and tool calls (``ReadReply``), by
the worker's parsers: ``--tool-call-parser`` (else the one the chat template's format
asks for) and ``--reasoning-parser`` (vLLM's flags and names).

A required or named tool choice was decoded under its JSON constraint, so its text is
read as that JSON (the calls, or one call's arguments) whatever the model's format;
``auto`` reads the model's own format. A text that holds no well-formed call stays
content, never an error.
"""

import json
import logging
from dataclasses import dataclass

from queue_schemas import JobRequest
from queue_schemas.messages import ReadReply
from queue_schemas.tool_parsers import (
    ParsedCall,
    parse_required_calls,
    parse_tool_calls,
    split_reasoning,
)
from queue_schemas.tools import NamedToolChoice, tool_call

log = logging.getLogger("genfleet.worker")


@dataclass(frozen=True)
class ReplyReader:
    tool_call_parser: str
    reasoning_parser: str | None = None

    def read(self, job: JobRequest, text: str) -> ReadReply | None:
        """What ``text`` reads as; None where nothing is read (no tools, no reasoning
        parser, or a reply no parser could take: logged), the result is then as it has
        always been: one reply never stops the worker."""
        try:
            return self._read(job, text)
        except Exception:
            log.exception("job %s: its reply could not be read; sent as text", job.job_id)
            return None

    def _read(self, job: JobRequest, text: str) -> ReadReply | None:
        choice = job.effective_tool_choice
        if choice == "none" and self.reasoning_parser is None:
            return None
        reasoning, content = split_reasoning(text, self.reasoning_parser)
        calls: list[ParsedCall] = []
        if isinstance(choice, NamedToolChoice):
            calls = [ParsedCall(choice.function.name, content)] if _is_json(content) else []
        elif choice == "required":
            calls = parse_required_calls(content)
        elif choice == "auto":
            content, calls = parse_tool_calls(content, self.tool_call_parser)
        if calls and choice != "auto":
            content = ""
        if not job.parallel_tool_calls:
            calls = calls[:1]
        tool_calls = [tool_call(job.job_id, i, c.name, c.arguments) for i, c in enumerate(calls)]
        return ReadReply(content=content, reasoning=reasoning, tool_calls=tool_calls or None)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True
