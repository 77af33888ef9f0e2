"""Structured outputs through the whole fleet with SmolLM2: the openai client over HTTP,
and JobRequests produced straight to Kafka by another client (confluent-kafka)."""

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from confluent_kafka import Producer
from openai import BadRequestError, OpenAI

from genfleet.chaos.target import DeadLetters, Results, Target, wait_for
from queue_schemas import DeadLetter, JobResult, JobStatus
from tests.integration.conftest import MODEL

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "country": {"type": "string", "maxLength": 20},
            },
            "required": ["city", "country"],
        },
        "status": {"enum": ["employed", "student", "retired"]},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "address", "status", "skills"],
}
FIRST = ["Maria", "Bob", "Aiko", "Lars", "Fatima", "Chen", "Olga", "Diego", "Priya", "Tom"]
CITIES = [("Madrid", "Spain"), ("Osaka", "Japan"), ("Oslo", "Norway"), ("Lagos", "Nigeria")]
JOBS = ["a nurse who knows first aid", "a student of physics", "a retired carpenter",
        "a cook who bakes bread", "an engineer who writes Rust"]  # fmt: skip


def _people(n: int) -> list[str]:
    return [
        f"{FIRST[i % len(FIRST)]} is {18 + 3 * i} years old, lives in "
        f"{CITIES[i % len(CITIES)][0]}, {CITIES[i % len(CITIES)][1]}, and is {JOBS[i % len(JOBS)]}."
        for i in range(n)
    ]


def _client(fleet) -> OpenAI:
    return OpenAI(base_url=f"{fleet.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _chat(client: OpenAI, text: str, **fields) -> str:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], temperature=0, **fields
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    return choice.message.content or ""


def _all(client: OpenAI, prompts: list[str], **fields) -> list[str]:
    """Concurrently, so the worker batches them."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda text: _chat(client, text, **fields), prompts))


def test_every_constraint_holds_over_http(smollm2_fleet) -> None:
    client = _client(smollm2_fleet)
    schema_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    people = _people(10)  # ten at once: the worker batches them, each its own schema walk
    extracted = _all(
        client,
        [f"Extract the person as JSON: {p}" for p in people],
        response_format=schema_format,
        max_tokens=256,
    )
    for text in extracted:
        jsonschema.validate(json.loads(text), PERSON)

    for text in _all(
        client,
        [f"Reply with a JSON object with the keys name and age: {p}" for p in people[:4]],
        response_format={"type": "json_object"},
        max_tokens=200,
    ):
        assert isinstance(json.loads(text), dict)

    iso_date = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
    for text in _all(
        client,
        [f"When was this person born? {p}" for p in people[:4]],
        extra_body={"structured_outputs": {"regex": iso_date}},
        max_tokens=20,
    ):
        assert re.fullmatch(iso_date, text), text

    moods = ["positive", "negative", "neutral"]
    completions = client.completions.create(
        model=MODEL,
        prompt=[f"Review: {p} Sentiment:" for p in people[:4]],
        temperature=0,
        max_tokens=8,
        extra_body={"guided_choice": moods},  # vLLM's older name
    )
    assert [c.text in moods for c in completions.choices] == [True] * 4


def test_invalid_constraints_are_refused_by_name_and_the_worker_serves_on(smollm2_fleet) -> None:
    client = _client(smollm2_fleet)
    with httpx.Client(base_url=smollm2_fleet.url, timeout=120) as http:
        bad_schema = http.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object", "required": 3}},
                },
            },
        )
        assert bad_schema.status_code == 422
        assert bad_schema.json()["error"]["param"] == "response_format.json_schema.schema"
        two = http.post(
            "/v1/completions",
            json={"prompt": "hi", "guided_regex": "a", "guided_choice": ["a"]},
        )
        assert two.status_code == 422 and "guided_regex, guided_choice" in two.text
    # Only the worker's compiler knows this regex is broken: the job fails, with why.
    with pytest.raises(BadRequestError, match="cannot compile the regex"):
        _chat(client, "hi", extra_body={"guided_regex": "[0-9"}, max_tokens=5)
    assert _chat(client, "Yes or no?", extra_body={"guided_choice": ["yes", "no"]}) in (
        "yes",
        "no",
    )


def test_jobs_produced_straight_to_kafka_follow_their_constraint(services, smollm2_fleet) -> None:
    kafka, _ = services
    target = Target(kafka.address, smollm2_fleet.redis_url, smollm2_fleet.prefix)
    constrained = {
        f"kafka-{i}": {
            "schema_version": 2,
            "job_id": f"kafka-{i}",
            "messages": [{"role": "user", "content": f"Extract the person as JSON: {person}"}],
            "sampling": {
                "temperature": 0,
                "max_tokens": 256,
                "structured_outputs": {"json": json.dumps(PERSON)},  # the schema as text
            },
        }
        for i, person in enumerate(_people(6))
    }
    # A version-1 record cannot carry a constraint: a reader of 1 would ignore it.
    too_old = {**constrained["kafka-0"], "job_id": "kafka-old", "schema_version": 1}

    async def scenario() -> tuple[dict[str, JobResult], list[DeadLetter]]:
        async with Results(target) as results, DeadLetters(target) as letters:
            producer = Producer(
                {"bootstrap.servers": kafka.address, "compression.type": "zstd",
                 "enable.idempotence": False, "acks": "all"}
            )  # fmt: skip
            for job in [*constrained.values(), too_old]:
                producer.produce(target.names.jobs_topic, value=json.dumps(job).encode())
            assert producer.flush(60) == 0
            ids = {*constrained, "kafka-old"}
            assert await wait_for(lambda: ids <= set(results.by_id()), timeout_s=300)
            return results.by_id(), letters.parsed()

    results, letters = asyncio.run(scenario())
    for job_id in constrained:
        result = results[job_id]
        assert result.status is JobStatus.COMPLETED and result.finish_reason == "stop"
        jsonschema.validate(json.loads(result.text), PERSON)
    assert results["kafka-old"].status is JobStatus.FAILED
    (letter,) = [letter for letter in letters if letter.job_id == "kafka-old"]
    assert "needs schema_version 2" in letter.reason
