"""OpenAI's Responses API with the official client on a SmolLM2 fleet: whole, in the
background (polled to its end), continued from a stored response, constrained by
``text.format``, calling a named function, cancelled, deleted; streaming refused."""

import json
import time

import jsonschema
import pytest
from openai import BadRequestError, NotFoundError, OpenAI

from tests.integration.conftest import MODEL

COLOR = {
    "type": "object",
    "properties": {"color": {"type": "string", "maxLength": 12}},
    "required": ["color"],
}
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}


def _polled(client: OpenAI, response_id: str):
    deadline = time.monotonic() + 120
    response = client.responses.retrieve(response_id)
    while response.status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, response
        time.sleep(0.2)
        response = client.responses.retrieve(response_id)
    return response


def test_responses_whole_background_continued_constrained_and_ended(smollm2_fleet) -> None:
    client = OpenAI(base_url=f"{smollm2_fleet.url}/v1", api_key="unused", max_retries=0)
    whole = client.responses.create(
        model=MODEL, input="Say hello.", instructions="Answer briefly.", max_output_tokens=12,
        temperature=0,
    )  # fmt: skip
    assert whole.status in ("completed", "incomplete") and whole.output_text
    assert whole.usage is not None and whole.usage.output_tokens > 0

    background = client.responses.create(
        model=MODEL, input="Count to five.", background=True, max_output_tokens=16, temperature=0
    )
    assert background.status in ("queued", "in_progress") and background.output == []
    done = _polled(client, background.id)
    assert done.status in ("completed", "incomplete") and done.output_text
    assert done.usage is not None

    later = client.responses.create(
        model=MODEL, input="And backwards?", previous_response_id=done.id, max_output_tokens=8,
        temperature=0,
    )  # fmt: skip
    # Its prompt holds the earlier exchange: at least its input and its reply.
    assert later.usage is not None
    assert later.usage.input_tokens > done.usage.input_tokens + done.usage.output_tokens
    (item,) = client.responses.input_items.list(later.id).data
    assert item.type == "message" and item.role == "user"

    colored = client.responses.create(
        model=MODEL, input="Name a color as JSON.", max_output_tokens=40, temperature=0,
        text={"format": {"type": "json_schema", "name": "color", "schema": COLOR}},
    )  # fmt: skip
    jsonschema.validate(json.loads(colored.output_text), COLOR)

    called = client.responses.create(
        model=MODEL, input="What is the weather in Oslo?", tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60,
        temperature=0,
    )  # fmt: skip
    (call,) = [item for item in called.output if item.type == "function_call"]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_TOOL["parameters"])

    story = client.responses.create(
        model=MODEL, input="Write a very long story.", background=True, max_output_tokens=2000
    )
    client.responses.cancel(story.id)
    assert _polled(client, story.id).status == "cancelled"

    client.responses.delete(done.id)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(done.id)
    with pytest.raises(BadRequestError, match="not served yet"):
        client.responses.create(model=MODEL, input="x", stream=True)
