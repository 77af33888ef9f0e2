"""The official ``openai`` client, unchanged, against the API and a SmolLM2 worker; and a
schema-driven fuzz run of the whole API."""

import hypothesis
import requests
import schemathesis
from openai import OpenAI
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.integration.conftest import MODEL
from tests.slow import SLOW


def test_openai_client_chat_whole_and_streamed_agree(smollm2_fleet) -> None:
    client = OpenAI(
        base_url=f"{smollm2_fleet.url}/v1", api_key="unused", max_retries=0, timeout=120
    )
    assert [model.id for model in client.models.list()] == [MODEL]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, logprobs=True,
        top_logprobs=2,
    )  # fmt: skip
    choice = whole.choices[0]
    assert "Paris" in choice.message.content
    assert whole.usage.completion_tokens == len(choice.logprobs.content) <= 12
    assert "".join(entry.token for entry in choice.logprobs.content) == choice.message.content
    assert all(len(entry.top_logprobs) == 2 for entry in choice.logprobs.content)

    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == choice.message.content
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [choice.finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens

    completion = client.completions.create(
        model=MODEL, prompt="The sea is", max_tokens=6, n=2, temperature=1.0, seed=3
    )
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.usage.completion_tokens == 12
    again = client.completions.create(
        model=MODEL, prompt="The sea is", max_tokens=6, n=2, temperature=1.0, seed=3
    )
    assert [c.text for c in again.choices] == [c.text for c in completion.choices]


REQUEST_TIMEOUT_S = 3


def test_fuzzing_the_openapi_schema_finds_no_server_error(start_api) -> None:
    """Valid and invalid requests generated from the API's own schema. No worker runs: the
    first valid generation requests wait (a timeout is fine), and once their jobs are the
    fleet's backlog the OpenAI routes answer 429 at once (fleet admission) and ``/v1/jobs``
    the outstanding limit's 429, so the examples do not each wait for the timeout."""
    api = start_api(
        "--max-outstanding-jobs", "3", "--rate-limit-per-minute", "100000",
        "--max-queued-jobs", "1", "--backlog-refresh-s", "0.2",
    )  # fmt: skip
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.settings(
                max_examples=200 if SLOW else 25,
                deadline=None,
                database=None,
                suppress_health_check=list(hypothesis.HealthCheck),
            )
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            def run(case) -> None:
                try:
                    response = case.call(base_url=api.url, timeout=REQUEST_TIMEOUT_S)
                except requests.Timeout:
                    return  # a valid job that no worker serves in this test
                if case.path == "/readyz" and response.status_code == 503:
                    return  # its answer while no worker reads the jobs: not ready
                if response.status_code >= 500:
                    failures.append(f"{case.method} {case.formatted_path}: {response.text}")
                case.validate_response(response, checks=[not_a_server_error])

            try:  # a fixed seed keeps CI repeatable; slow runs see fresh examples
                (run if SLOW else hypothesis.seed(0)(run))()
            except hypothesis.errors.Unsatisfiable:
                # No invalid input exists for an operation without parameters or body.
                assert mode is GenerationMode.NEGATIVE, operation.label
    assert failures == []
