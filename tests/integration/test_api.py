"""The HTTP API against a running worker (tiny model), the tansu broker and Redis."""

import asyncio
import json
import time
import uuid

import httpx
import hypothesis
from hypothesis import strategies as st
from openai import OpenAI
from redis import Redis

from genfleet.processes import ApiProcess
from queue_schemas import JobStatus
from tests.integration.api_helpers import auth, read_events, submit
from tests.integration.conftest import ALICE, BOB
from tests.strategies import chat_bodies, completion_bodies, job_records


def _client(api: ApiProcess, key: str = ALICE) -> httpx.Client:
    return httpx.Client(base_url=api.url, headers=auth(key), timeout=120)


def test_job_lifecycle_and_resumable_events(api_fleet) -> None:
    api, _, _, _ = api_fleet
    with _client(api) as client:
        job_id = submit(client, max_tokens=40)
        first = read_events(client, job_id, stop_after=5)
        assert first.ids == sorted(set(first.ids)) and len(first.ids) == 5
        rest = read_events(client, job_id, last_event_id=first.ids[-1])
        # Exactly the remaining events: no gap, no repeat.
        assert rest.ids[0] > first.ids[-1]
        assert first.ids + rest.ids == sorted(set(first.ids + rest.ids))
        assert rest.final_event == "completed"
        assert first.text + rest.text == rest.result.text
        assert sum(len(e.token_ids) for e in first.tokens + rest.tokens) == 40

        late = read_events(client, job_id)  # after the job finished: the whole history
        assert late.text == rest.result.text and late.final_event == "completed"
        assert late.ids == first.ids + rest.ids

        view = client.get(f"/v1/jobs/{job_id}").json()
        assert view["status"] == "completed"
        assert view["text"] == rest.result.text
        assert view["usage"]["completion_tokens"] == 40


def test_tenants_see_only_their_jobs_and_keys_are_required(api_fleet) -> None:
    api, _, _, _ = api_fleet
    with _client(api, ALICE) as alice, _client(api, BOB) as bob:
        job_id = submit(alice, max_tokens=4)
        assert alice.get(f"/v1/jobs/{job_id}").status_code == 200
        for response in (
            bob.get(f"/v1/jobs/{job_id}"),
            bob.get(f"/v1/jobs/{job_id}/events"),
            bob.delete(f"/v1/jobs/{job_id}"),
        ):
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "job_not_found"
        assert httpx.get(f"{api.url}/v1/jobs/{job_id}").status_code == 401
        wrong = httpx.get(f"{api.url}/v1/models", headers=auth("nope"))
        assert wrong.status_code == 401
        assert wrong.json()["error"]["type"] == "authentication_error"
        metrics = alice.get("/metrics").text
        assert 'route="/v1/jobs/{job_id}",status="404"' in metrics
        assert 'route="/v1/models",status="401"' in metrics
        assert 'genfleet:api_jobs_submitted_total{model_name="' in metrics
        assert 'route="/v1/jobs"' in metrics


def test_job_ids_name_no_other_key_and_tenants_do_not_collide(api_fleet) -> None:
    """Ids that end like Redis keys are refused; the same id from two tenants is two jobs."""
    api, worker, _, _ = api_fleet
    victim = f"shared-{uuid.uuid4().hex[:6]}"
    body = {"prompt": "The sea is", "sampling": {"max_tokens": 4, "ignore_eos": True}}
    with _client(api, ALICE) as alice, _client(api, BOB) as bob:
        for suffix in (":cancel", ":events", ":live", ":x"):
            taken = bob.post("/v1/jobs", json={**body, "job_id": victim + suffix})
            assert taken.status_code == 422, taken.text
            assert taken.json()["error"]["param"] == "job_id"
            for response in (
                alice.get(f"/v1/jobs/{victim}{suffix}"),
                alice.delete(f"/v1/jobs/{victim}{suffix}"),
                alice.get(f"/v1/jobs/{victim}{suffix}/events"),
            ):
                assert response.status_code in (404, 422), response.text
        # Bob takes the id first; Alice's job of the same id runs anyway, and each
        # tenant sees its own job only.
        assert bob.post("/v1/jobs", json={**body, "job_id": victim}).status_code == 202
        assert alice.post("/v1/jobs", json={**body, "job_id": victim}).status_code == 202
        for client in (alice, bob):
            streamed = read_events(client, victim)
            assert streamed.final_event == "completed", streamed
            assert client.get(f"/v1/jobs/{victim}").json()["status"] == "completed"
        again = alice.post("/v1/jobs", json={**body, "job_id": victim})
        assert again.status_code == 409 and again.json()["error"]["code"] == "job_exists"
        # A tenant never learns of another's ids: Alice's fresh id is free for Bob too.
        fresh = f"fresh-{uuid.uuid4().hex[:6]}"
        assert alice.post("/v1/jobs", json={**body, "job_id": fresh}).status_code == 202
        assert bob.get(f"/v1/jobs/{fresh}").status_code == 404
        assert bob.post("/v1/jobs", json={**body, "job_id": fresh}).status_code == 202
    assert worker.alive


def test_bodies_with_extreme_values_get_an_answer_or_a_4xx_and_the_worker_goes_on(
    api_fleet,
) -> None:
    api, worker, _, _ = api_fleet
    routes = st.one_of(
        chat_bodies.map(lambda body: ("/v1/chat/completions", body)),
        completion_bodies.map(lambda body: ("/v1/completions", body)),
        job_records.map(lambda body: ("/v1/jobs", body)),
    )
    statuses: list[int] = []
    with _client(api) as client:

        @hypothesis.settings(
            max_examples=40, deadline=None, database=None, derandomize=True,
            suppress_health_check=list(hypothesis.HealthCheck),
        )  # fmt: skip
        @hypothesis.given(route=routes)
        def attempt(route: tuple[str, dict]) -> None:
            path, body = route
            response = client.post(
                path, content=json.dumps(body), headers={"Content-Type": "application/json"}
            )
            statuses.append(response.status_code)
            assert response.status_code in (200, 202) or 400 <= response.status_code < 500, (
                f"{path} {body!r}: {response.status_code} {response.text}"
            )

        attempt()
        assert worker.alive
        assert read_events(client, submit(client, max_tokens=3)).final_event == "completed"
    assert any(s < 300 for s in statuses) and any(s >= 400 for s in statuses), statuses


def test_bad_input_gets_field_errors_and_size_cap(api_fleet) -> None:
    api, _, _, _ = api_fleet
    with _client(api) as client:
        response = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "temperature": 5},
        )
        assert response.status_code == 422
        assert response.json()["error"]["param"] == "temperature"
        assert "temperature" in response.json()["error"]["message"]
        both = client.post("/v1/jobs", json={"prompt": "a", "prompt_token_ids": [1]})
        assert both.status_code == 422 and "exactly one of" in both.json()["error"]["message"]
        huge = client.post("/v1/jobs", json={"prompt": "x" * 100_000})
        assert huge.status_code == 413
        wrong_model = client.post("/v1/completions", json={"model": "gpt-9", "prompt": "a"})
        assert wrong_model.status_code == 404
        assert wrong_model.json()["error"]["code"] == "model_not_found"
        bad_resume = client.get("/v1/jobs/x/events", headers={"Last-Event-ID": "abc"})
        assert bad_resume.status_code == 422
        # Only the worker knows the context length: its refusal comes back as a 400 ...
        too_long = {"prompt": [5] * 1100, "max_tokens": 2}
        refused = client.post("/v1/completions", json=too_long)
        assert refused.status_code == 400 and "context" in refused.json()["error"]["message"]
        # ... or, in a stream, as an error object before [DONE].
        with client.stream("POST", "/v1/completions", json={**too_long, "stream": True}) as s:
            lines = [line for line in s.iter_lines() if line.startswith("data:")]
        assert "context" in json.loads(lines[-2][len("data:") :])["error"]["message"]
        assert lines[-1] == "data: [DONE]"


def test_delete_ends_a_running_jobs_stream_with_a_cancelled_event(api_fleet) -> None:
    api, worker, _, _ = api_fleet
    with _client(api) as client:
        job_id = submit(client, max_tokens=900)
        started = read_events(client, job_id, stop_after=3)
        assert len(started.tokens) == 3
        response = client.delete(f"/v1/jobs/{job_id}")
        assert response.status_code == 202
        rest = read_events(client, job_id, last_event_id=started.ids[-1])
        assert rest.final_event == "cancelled"
        assert rest.result.finish_reason == "abort"
        assert rest.result.usage.completion_tokens < 900
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
        assert f"cancelling {job_id}" in worker.log()
        assert client.delete(f"/v1/jobs/{job_id}").status_code == 409


def test_openai_stream_closed_early_cancels_the_job_in_the_worker(api_fleet) -> None:
    api, worker, _, _ = api_fleet
    client = OpenAI(base_url=f"{api.url}/v1", api_key=ALICE, timeout=120)
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Count to a thousand."}],
        max_tokens=900,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 4:
            break
    stream.close()
    job_id = f"{chunks[0].id}-0"
    with _client(api) as http:
        deadline = time.monotonic() + 60
        while http.get(f"/v1/jobs/{job_id}").json()["status"] != "cancelled":
            assert time.monotonic() < deadline, "the job was not cancelled"
            time.sleep(0.2)
        result = read_events(http, job_id).result
    assert result.finish_reason == "abort" and result.usage.completion_tokens < 900
    assert f"cancelling {job_id}" in worker.log()


def _hang_up_cancels(api: ApiProcess) -> list[str]:
    """Job ids the API cancelled because their client hung up, from its JSON log."""
    records = [json.loads(line) for line in api.log().splitlines() if line.startswith("{")]
    return [r["job_id"] for r in records if r["message"].startswith("client hung up: cancelled")]


def test_openai_request_abandoned_before_its_answer_cancels_the_job(api_fleet) -> None:
    api, worker, names, redis_url = api_fleet
    redis = Redis.from_url(redis_url)
    before = len(_hang_up_cancels(api))
    unfinished = set(redis.zrange(names.tenant_jobs_key("alice"), 0, -1))
    body = {"messages": [{"role": "user", "content": "Go on."}], "max_tokens": 900,
            "ignore_eos": True}  # fmt: skip

    def running_job() -> str | None:
        """The new job, once its first tokens are out (the worker is generating it)."""
        for job_id in set(redis.zrange(names.tenant_jobs_key("alice"), 0, -1)) - unfinished:
            if redis.xlen(names.events_stream("alice", job_id.decode())):
                return job_id.decode()
        return None

    async def hang_up_while_running() -> str:
        async with httpx.AsyncClient(base_url=api.url, headers=auth(ALICE)) as http:
            asking = asyncio.create_task(http.post("/v1/chat/completions", json=body, timeout=60))
            deadline = time.monotonic() + 30
            while (job_id := running_job()) is None:
                assert not asking.done(), "the job finished before the client could hang up"
                assert time.monotonic() < deadline, "the job did not start"
                await asyncio.sleep(0.01)
            asking.cancel()  # closes the connection mid-request
            await asyncio.gather(asking, return_exceptions=True)
            return job_id

    job_id = asyncio.run(hang_up_while_running())
    deadline = time.monotonic() + 30
    while len(_hang_up_cancels(api)) == before:
        assert time.monotonic() < deadline, "the API did not notice the hang-up"
        time.sleep(0.2)
    assert _hang_up_cancels(api)[-1] == job_id
    with _client(api) as client:
        result = read_events(client, job_id).result
    assert result.status is JobStatus.CANCELLED and result.usage.completion_tokens < 900
    assert f"cancelling {job_id}" in worker.log()
