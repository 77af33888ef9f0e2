"""A streamed chat reply adds up to its result: the API's chunks (``ReplyStream``), cut
anywhere, assemble into the content, reasoning and tool calls the worker reads from the
whole text (``ReplyReader``), as an OpenAI client assembles them."""

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from producer_api.schemas.reply_stream import ReplyParsers, ReplyStream
from queue_schemas import JobRequest, JobResult, JobStatus
from worker.service.replies import ReplyReader

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# (tool parser, reasoning parser, tool choice, reply)
CASES: list[tuple[str | None, str | None, Any, str]] = [
    ("hermes", None, "auto", f"Let me look.\n{HERMES_CALL}\n{HERMES_CALL}"),
    ("hermes", None, "auto", "Use <tools> wisely; <tool_call> is how I would call one."),
    ("hermes", "qwen3", "auto", f"<think>\nThey want the weather.\n</think>\n\n{HERMES_CALL}"),
    ("hermes", "deepseek_r1", "none", "Greeting them.\n</think>\n\nHello there!"),
    (
        "hermes",
        None,
        {"type": "function", "function": {"name": "get_weather"}},
        '{"city": "Paris"}',
    ),
    ("hermes", None, "required", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("llama3_json", None, "auto", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("mistral", None, "auto", 'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {}}]'),
    ("pythonic", None, "auto", '[get_weather(city="Paris")]'),
    (None, None, "auto", f"Parsers not announced yet. {HERMES_CALL}"),
]


def _assembled(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The deltas joined as the openai client's stream helpers join them."""
    content, reasoning = "", ""
    calls: dict[int, dict[str, Any]] = {}
    for delta in chunks:
        content += delta.get("content", "")
        reasoning += delta.get("reasoning_content", "")
        for fragment in delta.get("tool_calls", []):
            call = calls.setdefault(fragment["index"], {"arguments": ""})
            call.setdefault("id", fragment.get("id"))
            function = fragment["function"]
            call.setdefault("name", function.get("name"))
            call["arguments"] += function.get("arguments", "")
    listed = [calls[i] for i in sorted(calls)]
    return {"content": content, "reasoning": reasoning, "calls": listed}


@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(1, 7), min_size=1, max_size=80))
def test_the_chunks_of_a_reply_add_up_to_its_result(case, cuts) -> None:
    tool_parser, reasoning_parser, choice, reply = case
    job = JobRequest(
        job_id="j", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER],
        tool_choice=choice,
    )  # fmt: skip
    read = ReplyReader(tool_parser or "hermes", reasoning_parser).read(job, reply)
    assert read is not None
    result = JobResult(job_id="j", status=JobStatus.COMPLETED, text=reply, **read.model_dump())
    known = None if tool_parser is None else ReplyParsers(tool_parser, reasoning_parser)
    stream = ReplyStream("j", job.effective_tool_choice, known)
    chunks, at = [], 0
    for size in [*cuts, len(reply)]:
        delta = stream.delta(reply[at : at + size])
        at += size
        chunks += [delta] if delta is not None else []
    closing = stream.closing(result)
    chunks += [closing] if closing is not None else []
    got = _assembled(chunks)
    assert got["content"] == result.content
    assert got["reasoning"] == (result.reasoning or "")
    expected = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in result.tool_calls or []
    ]
    assert got["calls"] == expected
