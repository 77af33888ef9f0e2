"""Deadlines through the whole fleet: a job read too late never reaches the engine, one
that runs past its deadline is stopped and frees its blocks, and the routes say so.
The module's worker also runs with ``--generation-config vllm`` on a model folder that
has a generation config: the model's sampling defaults are then not applied."""

import asyncio
import json
import shutil
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import openai
import pytest
from openai import OpenAI

from genfleet.processes import ApiProcess
from queue_schemas import JobRequest, JobResult, JobStatus, Names
from tests.integration.api_helpers import read_events
from tests.integration.conftest import MODEL, fleet_flags, metered_worker
from tests.integration.kafka_helpers import produce_records, read_topic
from tests.integration.metrics import sample, total

LONG = 4000  # tokens: seconds on the tiny model, so a deadline of one second stops it


# What the model folder says; --generation-config vllm must leave it unapplied.
FOLDER_SAMPLING = {"do_sample": True, "temperature": 0.0, "top_p": 0.5, "max_new_tokens": 3}


@pytest.fixture(scope="module")
def fleet(services, long_chat_model, tmp_path_factory):
    """A worker (with its metrics) and an API, for this module's tests."""
    prefix, flags = fleet_flags(services)
    logs = tmp_path_factory.mktemp("deadlines")
    model = logs / "model"
    shutil.copytree(long_chat_model, model)
    (model / "generation_config.json").write_text(json.dumps(FOLDER_SAMPLING))
    worker, worker_url = metered_worker(
        flags, model, logs / "worker.log", "--generation-config", "vllm"
    )
    api = ApiProcess(flags, logs / "api.log")
    yield api, worker_url, Names(prefix), services[0].address
    api.stop()
    worker.stop()


def test_a_job_produced_past_its_deadline_never_reaches_the_engine_and_expires_once(
    fleet,
) -> None:
    _, worker, names, bootstrap = fleet
    finished_before = total(worker, "genfleet:request_success_total")
    prompts_before = sample(worker, "genfleet:prompt_tokens_total")
    expired_before = sample(worker, "genfleet:jobs_expired_total", stage="queued")
    late = JobRequest(
        job_id=f"late-{uuid.uuid4().hex[:6]}",
        prompt="never",
        deadline=datetime.now(UTC) - timedelta(seconds=1),
    )
    marker = JobRequest(job_id=f"after-{late.job_id}", prompt="x", sampling={"max_tokens": 2})
    records = [late.model_dump_json(exclude_none=True).encode() for _ in range(2)]
    records.append(marker.model_dump_json(exclude_none=True).encode())

    async def scenario() -> list[JobResult]:
        await produce_records(bootstrap, names.jobs_topic, records)
        raw = await read_topic(
            bootstrap,
            names.results_topic,
            lambda values: any(marker.job_id.encode() in v for v in values),
        )
        return [JobResult.model_validate_json(v) for v in raw]

    results = asyncio.run(asyncio.wait_for(scenario(), 120))
    ours = [r for r in results if r.job_id == late.job_id]
    assert [(r.status, r.schema_version) for r in ours] == [(JobStatus.EXPIRED, 3)]
    assert "passed before the job started" in (ours[0].error or "")
    # The marker ran (one request more); the late job never reached the engine.
    assert total(worker, "genfleet:request_success_total") == finished_before + 1
    assert sample(worker, "genfleet:prompt_tokens_total") == prompts_before + next(
        r.usage.prompt_tokens for r in results if r.job_id == marker.job_id
    )
    assert sample(worker, "genfleet:jobs_expired_total", stage="queued") == expired_before + 1


def test_a_running_job_past_its_deadline_is_stopped_and_frees_every_block(fleet) -> None:
    api, worker, _, _ = fleet
    body = {
        "prompt": "Count.",
        "timeout_s": 1.0,
        "sampling": {"max_tokens": LONG, "ignore_eos": True, "temperature": 0},
    }
    with httpx.Client(base_url=api.url, timeout=60) as client:
        reply = client.post("/v1/jobs", json=body)
        assert reply.status_code == 202, reply.text
        streamed = read_events(client, reply.json()["id"])
    assert streamed.final_event == "expired"
    assert streamed.result is not None and streamed.result.status is JobStatus.EXPIRED
    assert 0 < len(streamed.result.token_ids) < LONG
    assert "passed while it ran" in (streamed.result.error or "")
    assert sample(worker, "genfleet:jobs_expired_total", stage="running") >= 1
    deadline = time.monotonic() + 10
    while sample(worker, "genfleet:kv_cache_usage_perc") != 0.0:
        assert time.monotonic() < deadline, "KV blocks still held after the job expired"
        time.sleep(0.1)
    assert sample(worker, "genfleet:num_requests_running") == 0


def test_an_openai_request_past_its_deadline_header_gets_a_504_and_no_retry(fleet) -> None:
    api, _, _, _ = fleet
    client = OpenAI(base_url=f"{api.url}/v1", api_key="unused")  # retries 504s by default
    messages = [{"role": "user", "content": "Count."}]
    long = {"max_tokens": LONG, "extra_body": {"ignore_eos": True}}
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(
            model=MODEL, messages=messages, extra_headers={"Request-Timeout-Ms": "1000"}, **long
        )
    assert raised.value.status_code == 504
    assert raised.value.body["code"] == "deadline_exceeded"  # type: ignore[index]
    assert time.monotonic() - started < 10  # one attempt, not three
    timed = {"ignore_eos": True, "timeout_s": 1}
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, extra_body=timed, max_tokens=LONG
    )
    with pytest.raises(openai.APIError, match="deadline"):
        for _ in stream:
            pass


def test_a_deadline_far_ahead_changes_nothing(fleet) -> None:
    api, _, _, _ = fleet
    client = OpenAI(base_url=f"{api.url}/v1", api_key="unused")
    far = str(int((time.time() + 365 * 24 * 3600) * 1000))
    asked = {"model": MODEL, "prompt": "The sea", "max_tokens": 12, "temperature": 0}
    plain = client.completions.create(**asked)
    timed = client.completions.create(**asked, extra_headers={"Request-Deadline-Ms": far})
    assert timed.choices[0].text == plain.choices[0].text
    assert timed.choices[0].finish_reason == plain.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    "headers",
    [{"Request-Timeout-Ms": "soon"}, {"Request-Timeout-Ms": "0"}, {"Request-Deadline-Ms": "-5"}],
)
def test_a_deadline_header_out_of_bounds_is_a_422_naming_it(fleet, headers) -> None:
    api, _, _, _ = fleet
    body = {"prompt": "x", "max_tokens": 1}
    reply = httpx.post(f"{api.url}/v1/completions", json=body, headers=headers, timeout=30)
    assert reply.status_code == 422
    assert next(iter(headers)) in reply.json()["error"]["message"]


def test_generation_config_vllm_leaves_the_models_sampling_defaults_unapplied(fleet) -> None:
    api, _, _, _ = fleet
    body = {"prompt": "The sea", "sampling": {"max_tokens": 2}}  # the rest left unset
    with httpx.Client(base_url=api.url, timeout=60) as client:
        reply = client.post("/v1/jobs", json=body)
        assert reply.status_code == 202, reply.text
        job_id = reply.json()["id"]
        assert read_events(client, job_id).final_event == "completed"
        applied = client.get(f"/v1/jobs/{job_id}").json()["sampling"]
    # The neutral values, not the folder's temperature 0 and top_p 0.5.
    assert (applied["temperature"], applied["top_p"], applied["max_tokens"]) == (1.0, 1.0, 2)
