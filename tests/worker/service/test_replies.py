"""A finished job's text as the worker reads it: what is read (and what is not) for each
tool choice, and a parser that fails on a reply costs that reply its reading only."""

import json

from queue_schemas import JobRequest
from worker.service import replies
from worker.service.replies import ReplyReader

WEATHER = {"type": "function", "function": {"name": "get_weather"}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'


def _job(**fields) -> JobRequest:
    return JobRequest(job_id="j", messages=[{"role": "user", "content": "hi"}], **fields)


def test_each_tool_choice_reads_its_own_way() -> None:
    reader = ReplyReader("hermes")
    assert reader.read(_job(), "Hello") is None  # no tools, no reasoning parser: unread
    auto = reader.read(_job(tools=[WEATHER]), f"Checking. {CALL}")
    assert auto is not None and auto.content == "Checking. "
    assert auto.tool_calls is not None and auto.tool_calls[0].function.name == "get_weather"
    none = reader.read(_job(tools=[WEATHER], tool_choice="none"), CALL)
    assert none is None  # tools not offered: the text is not read for calls
    named = {"type": "function", "function": {"name": "get_weather"}}
    arguments = reader.read(_job(tools=[WEATHER], tool_choice=named), '{"city": "Oslo"}')
    assert arguments is not None and arguments.content == "" and arguments.tool_calls
    assert json.loads(arguments.tool_calls[0].function.arguments) == {"city": "Oslo"}
    cut = reader.read(_job(tools=[WEATHER], tool_choice=named), '{"city": "Os')
    assert cut is not None and cut.tool_calls is None and cut.content == '{"city": "Os'
    single = reader.read(_job(tools=[WEATHER], parallel_tool_calls=False), CALL + CALL)
    assert single is not None and single.tool_calls is not None and len(single.tool_calls) == 1


def test_a_parser_that_fails_leaves_the_reply_unread(monkeypatch, caplog) -> None:
    def broken(text: str, parser: str) -> None:
        raise IndexError("a parser bug")

    monkeypatch.setattr(replies, "parse_tool_calls", broken)
    assert ReplyReader("hermes").read(_job(tools=[WEATHER]), CALL) is None
    assert "could not be read" in caplog.text
