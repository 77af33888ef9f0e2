"""Tool calling through the whole fleet with SmolLM2 (whose chat template takes no
tools: genfleet's tool prompt): the official openai client on the chat route (required,
named, streamed, none, a second turn with a tool result), ``/v1/jobs``, a JobRequest
produced straight to Kafka, and a batch line."""

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
from confluent_kafka import Producer
from openai import OpenAI

from genfleet.chaos.target import DeadLetters, Results, Target, wait_for
from genfleet.processes import FleetProcess
from queue_schemas import JobStatus
from tests.integration.batch_helpers import create_batch, wait_for_status
from tests.integration.conftest import MODEL

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 20}},
    "required": ["timezone"],
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a timezone", "parameters": TIME}},
]  # fmt: skip
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Denver"]


def _client(fleet) -> OpenAI:
    return OpenAI(base_url=f"{fleet.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _valid(name: str, arguments: str) -> None:
    assert name in SCHEMAS, name
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def _ask(client: OpenAI, text: str, max_tokens: int = 120, **fields):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], tools=TOOLS,
        temperature=0, max_tokens=max_tokens, **fields,
    ).choices[0]  # fmt: skip


def test_required_named_streamed_and_none_over_http(smollm2_fleet) -> None:
    client = _client(smollm2_fleet)
    questions = [f"What is the weather in {city}?" for city in CITIES]
    with ThreadPoolExecutor(len(questions)) as pool:
        choices = list(
            pool.map(
                lambda q: _ask(client, q, tool_choice="required", parallel_tool_calls=False),
                questions,
            )
        )
    for choice in choices:
        assert choice.finish_reason == "tool_calls", choice.message
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        _valid(call.function.name, call.function.arguments)
        assert choice.message.content is None

    named = {"type": "function", "function": {"name": "get_time"}}
    choice = _ask(client, "What time is it in Berlin?", tool_choice=named)
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_time"
    _valid("get_time", call.function.arguments)

    for tool_choice in (named, "required"):
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Weather and time in Rome?"}],
            tools=TOOLS, tool_choice=tool_choice, temperature=0, max_tokens=120, stream=True,
        )  # fmt: skip
        calls: dict[int, dict[str, str]] = {}
        finish = None
        for chunk in stream:
            delta = chunk.choices[0].delta
            for fragment in delta.tool_calls or []:
                call_so_far = calls.setdefault(fragment.index, {"name": "", "arguments": ""})
                if fragment.function.name:
                    assert not call_so_far["name"]  # named once
                    call_so_far["name"] = fragment.function.name
                call_so_far["arguments"] += fragment.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls" and calls
        for assembled in calls.values():
            _valid(assembled["name"], assembled["arguments"])

    plain = _ask(client, "Say hello.", tool_choice="none", max_tokens=16)
    assert plain.message.tool_calls is None and plain.message.content
    assert plain.finish_reason in ("stop", "length")


def test_a_second_turn_carries_the_call_and_its_result(smollm2_fleet) -> None:
    client = _client(smollm2_fleet)
    first = _ask(
        client, "What is the weather in Paris?", tool_choice="required", parallel_tool_calls=False
    )
    (call,) = first.message.tool_calls
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            first.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
        ],
        tools=TOOLS, temperature=0, max_tokens=40,
    ).choices[0]  # fmt: skip
    # Auto on a 135M model: it may answer or call again; either is read, never an error.
    if reply.message.tool_calls:
        for again in reply.message.tool_calls:
            _valid(again.function.name, again.function.arguments)
    else:
        assert reply.message.content


def test_tools_through_jobs_kafka_and_a_batch(services, smollm2_fleet, tmp_path) -> None:
    question = [{"role": "user", "content": "What is the weather in Oslo?"}]
    with httpx.Client(base_url=smollm2_fleet.url, timeout=60) as http:
        submitted = http.post(
            "/v1/jobs",
            json={"messages": question, "tools": TOOLS, "tool_choice": "required",
                  "parallel_tool_calls": False, "sampling": {"temperature": 0, "max_tokens": 120}},
        )  # fmt: skip
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]
        deadline = time.monotonic() + 300
        while (job := http.get(f"/v1/jobs/{job_id}").json())["status"] != "completed":
            assert time.monotonic() < deadline and job["status"] in ("queued", "running"), job
            time.sleep(0.5)
    assert job["finish_reason"] == "tool_calls"
    (call,) = job["tool_calls"]
    _valid(call["function"]["name"], call["function"]["arguments"])

    kafka, _ = services
    target = Target(kafka.address, smollm2_fleet.redis_url, smollm2_fleet.prefix)
    record = {
        "schema_version": 4, "job_id": "tools-kafka", "messages": question, "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "sampling": {"temperature": 0, "max_tokens": 120},
    }  # fmt: skip
    too_old = {**record, "job_id": "tools-old", "schema_version": 3}

    async def scenario():
        async with Results(target) as results, DeadLetters(target) as letters:
            producer = Producer({"bootstrap.servers": kafka.address, "enable.idempotence": False})
            for job in (record, too_old):
                producer.produce(target.names.jobs_topic, value=json.dumps(job).encode())
            assert producer.flush(60) == 0
            ids = {"tools-kafka", "tools-old"}
            assert await wait_for(lambda: ids <= set(results.by_id()), timeout_s=300)
            return results.by_id(), letters.parsed()

    results, letters = asyncio.run(scenario())
    result = results["tools-kafka"]
    assert result.status is JobStatus.COMPLETED and result.schema_version == 4
    assert result.finish_reason == "tool_calls" and result.tool_calls is not None
    _valid("get_weather", result.tool_calls[0].function.arguments)
    assert any("needs schema_version 4" in letter.reason for letter in letters)

    client = _client(smollm2_fleet)
    line = {
        "custom_id": "tools-1", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": question, "tools": TOOLS, "tool_choice": "required",
                 "parallel_tool_calls": False, "temperature": 0, "max_tokens": 120},
    }  # fmt: skip
    runner = FleetProcess("batch-runner", smollm2_fleet.common, tmp_path / "runner.log")
    try:
        batch = wait_for_status(client, create_batch(client, [line]).id, {"completed"}, 300)
    finally:
        runner.terminate(10)
        runner.stop()
    assert batch.output_file_id is not None
    (output,) = [
        json.loads(row) for row in client.files.content(batch.output_file_id).text.splitlines()
    ]
    body = output["response"]["body"]
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    _valid(call["function"]["name"], call["function"]["arguments"])
