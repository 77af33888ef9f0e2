"""Replies of each tool-call format and reasoning parser, as models write them (several
calls, text around them, malformed JSON), read whole and as a stream."""

import json

import pytest

from queue_schemas.tool_parsers import (
    ParsedCall,
    call_start,
    parse_required_calls,
    parse_tool_calls,
    reasoning_in_stream,
    split_reasoning,
)

WEATHER = ParsedCall("get_weather", json.dumps({"city": "Paris"}))
TIME = ParsedCall("get_time", json.dumps({"zone": "CET", "precise": True}))

# (parser, reply, content, calls)
REPLIES = [
    (
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET", '
        '"precise": true}}\n</tool_call>',
        "Let me check.\n",
        [WEATHER, TIME],
    ),
    (  # cut short before the closing tag: still a call
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
        "",
        [WEATHER],
    ),
    (  # arguments written as a JSON string
        "hermes",
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
        "",
        [WEATHER],
    ),
    ("hermes", "<tool_call>{'name': get_weather}</tool_call>", None, []),  # not JSON
    ("hermes", "Paris is sunny today.", None, []),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [WEATHER],
    ),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"zone": "CET", "precise": true}}',
        "",
        [WEATHER, TIME],
    ),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": ', None, []),
    ("llama3_json", "The answer is {x}.", None, []),
    (
        "mistral",
        'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"zone": "CET", "precise": true}}]',
        "Sure. ",
        [WEATHER, TIME],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
        '[TOOL_CALLS]get_time[ARGS]{"zone": "CET", "precise": true}',
        "",
        [WEATHER, TIME],
    ),
    ("mistral", "[TOOL_CALLS][{name: get_weather}]", None, []),
    (
        "pythonic",
        '[get_weather(city="Paris"), get_time(zone="CET", precise=True)]',
        "",
        [WEATHER, TIME],
    ),
    ("pythonic", "[get_weather(city=where)]", None, []),  # not a literal
    ("pythonic", "[1, 2, 3]", None, []),
]


@pytest.mark.parametrize(("parser", "reply", "content", "calls"), REPLIES)
def test_each_format_s_calls_and_the_text_around_them(parser, reply, content, calls) -> None:
    """A reply without a well-formed call is content, whole (never an error)."""
    read_content, read_calls = parse_tool_calls(reply, parser)
    assert read_calls == calls
    assert read_content == (reply if content is None else content)


@pytest.mark.parametrize(("parser", "reply", "content", "calls"), REPLIES)
def test_streamed_content_stops_where_a_call_may_start(parser, reply, content, calls) -> None:
    """Character by character, the content sent so far is always a prefix of the content
    read from the whole reply; a reply with calls never sends their markup."""
    whole_content, _ = parse_tool_calls(reply, parser)
    for end in range(len(reply) + 1):
        streamed = reply[: call_start(reply[:end], parser)]
        assert whole_content.startswith(streamed) or (not calls and reply.startswith(streamed))
    if calls:
        assert reply[: call_start(reply, parser)] == whole_content


def test_required_calls_are_read_from_their_json_list() -> None:
    listed = json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}])
    assert parse_required_calls(listed) == [WEATHER]
    assert parse_required_calls(listed[:-5]) == []  # cut short: no call


def test_an_unknown_parser_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        parse_tool_calls("x", "nope")


# (parser, reply, reasoning, content)
THOUGHTS = [
    ("qwen3", "<think>\nThe user greets.\n</think>\n\nHello!", "\nThe user greets.\n", "Hello!"),
    ("qwen3", "Hello!", None, "Hello!"),  # thinking off: no block
    ("qwen3", "<think>\nStill thinking when cut", "\nStill thinking when cut", ""),
    ("deepseek_r1", "The user greets.\n</think>\n\nHello!", "The user greets.\n", "Hello!"),
    ("deepseek_r1", "<think>Hmm.</think>Hi.", "Hmm.", "Hi."),
    ("deepseek_r1", "No end of thinking", "No end of thinking", ""),
]


@pytest.mark.parametrize(("parser", "reply", "reasoning", "content"), THOUGHTS)
def test_reasoning_read_whole_and_streamed_alike(parser, reply, reasoning, content) -> None:
    assert split_reasoning(reply, parser) == (reasoning, content)
    sent = ""
    for end in range(len(reply) + 1):
        so_far, content_start = reasoning_in_stream(reply[:end], parser)
        assert so_far.startswith(sent)  # never takes back what it sent
        sent = so_far
        if content_start is not None:
            assert content.startswith(reply[content_start:end].lstrip())
    assert sent == (reasoning or "")


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral", "pythonic"])
def test_a_reply_nested_past_any_parser_s_depth_is_content(parser) -> None:
    """Arguments nested 100,000 deep (JSON in a string, a list, Python calls): never an
    error, the text stays content."""
    deep = "[" * 100_000 + "]" * 100_000
    nested_string = json.dumps({"name": "f", "arguments": deep})
    for reply in (
        f"<tool_call>{nested_string}</tool_call>",
        f'{{"name": "f", "parameters": {deep}}}',
        f'[TOOL_CALLS][{{"name": "f", "arguments": {deep}}}]',
        f"[f(x={deep})]",
        deep,
    ):
        content, calls = parse_tool_calls(reply, parser)
        assert calls == [] and content == reply
    assert parse_required_calls(deep) == []
