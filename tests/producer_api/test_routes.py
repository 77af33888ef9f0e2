"""Every route in process, against fakes of the Kafka submitter and the stores: what
each answers when the request is right, and the error (OpenAI's shape, the right
status, Retry-After where waiting helps) when it is not, with nothing left behind."""

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from queue_schemas import JobStatus
from tests.producer_api.fakes import FakeFleet

Scenario = Callable[[FakeFleet, httpx.AsyncClient], Awaitable[None]]
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def run(fleet: FakeFleet, scenario: Scenario, api_key: str | None = None) -> None:
    async def main() -> None:
        async with fleet.client(api_key) as client:
            await scenario(fleet, client)

    asyncio.run(main())


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"]  # OpenAI's shape: a message a person can read
    return error


@pytest.fixture
def fleet(tmp_path: Path) -> FakeFleet:
    return FakeFleet(tmp_path / "files")


def test_a_job_is_recorded_queued_and_produced_once(fleet: FakeFleet) -> None:
    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        response = await client.post("/v1/jobs", json={"prompt": "The sea", "job_id": "j1"})
        assert response.status_code == 202, response.text
        assert response.headers["Location"] == "/v1/jobs/j1"
        assert [(topic, key) for topic, key, _ in fleet.submitter.sent] == [
            (fleet.settings.names.jobs_topic, "j1")
        ]
        assert (await client.get("/v1/jobs/j1")).json()["status"] == "queued"
        again = await client.post("/v1/jobs", json={"prompt": "The sea", "job_id": "j1"})
        assert error_of(again, 409)["code"] == "job_exists"
        assert len(fleet.submitter.sent) == 1

    run(fleet, scenario)


def test_job_routes_refuse_what_they_cannot_serve(fleet: FakeFleet) -> None:
    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        assert error_of(await client.post("/v1/jobs", json={}), 422)
        bad = await client.post("/v1/jobs", json={"prompt": "x", "max_tokens": -1})
        assert error_of(bad, 422)["param"]
        unknown = await client.post("/v1/jobs", json={"prompt": "x", "model": "nope"})
        assert error_of(unknown, 404)["code"] == "model_not_found"
        for method, path in (
            ("GET", "/v1/jobs/missing"),
            ("GET", "/v1/jobs/missing/events"),
            ("DELETE", "/v1/jobs/missing"),
        ):
            response = await client.request(method, path)
            assert error_of(response, 404)["code"] == "job_not_found", path
        assert not fleet.submitter.sent

    run(fleet, scenario)


def test_a_cancelled_job_cannot_be_cancelled_again(fleet: FakeFleet) -> None:
    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        await client.post("/v1/jobs", json={"prompt": "x", "job_id": "c1"})
        cancelled = await client.delete("/v1/jobs/c1")
        assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"
        assert [r.status for r in fleet.submitter.results] == [JobStatus.CANCELLED]
        assert error_of(await client.delete("/v1/jobs/c1"), 409)["code"] == "job_finished"

    run(fleet, scenario)


def test_kafka_down_is_a_503_with_retry_after_and_leaves_no_job_behind(
    fleet: FakeFleet,
) -> None:
    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        fleet.submitter.down = True
        for path, body in (
            ("/v1/jobs", {"prompt": "x", "job_id": "k1"}),
            ("/v1/chat/completions", CHAT),
            ("/v1/completions", {"prompt": "x", "max_tokens": 2}),
        ):
            response = await client.post(path, json=body)
            assert error_of(response, 503)["code"] == "queue_unavailable", path
            assert int(response.headers["Retry-After"]) > 0
        assert not fleet.store.states  # recorded queued, then forgotten
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["kafka"] is False

    run(fleet, scenario)


def test_a_tenant_over_its_limit_gets_429_with_retry_after(tmp_path: Path) -> None:
    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        assert (await client.post("/v1/jobs", json={"prompt": "x"})).status_code == 202
        response = await client.post("/v1/jobs", json={"prompt": "x"})
        assert error_of(response, 429)["code"] == "too_many_outstanding_jobs"
        assert response.headers["Retry-After"] == "5"
        assert len(fleet.submitter.sent) == 1

    run(FakeFleet(tmp_path, max_outstanding=1), scenario)


def test_openai_routes_refuse_bad_bodies_and_unknown_models(fleet: FakeFleet) -> None:
    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        for path, body in (
            ("/v1/chat/completions", {"messages": []}),
            ("/v1/chat/completions", {**CHAT, "n": 0}),
            ("/v1/chat/completions", {**CHAT, "top_logprobs": 3}),
            ("/v1/completions", {"prompt": "x", "temperature": "hot"}),
        ):
            assert error_of(await client.post(path, json=body), 422), body
        unknown = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
        assert error_of(unknown, 404)["code"] == "model_not_found"
        raw = await client.post(
            "/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert error_of(raw, 422)
        assert not fleet.submitter.sent

    run(fleet, scenario)


def test_an_overloaded_model_refuses_interactive_requests(fleet: FakeFleet) -> None:
    class Backlog:
        jobs = 10
        measured_at = float("inf")

    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        fleet.fleet.backlog.fresh = lambda model: Backlog()
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert error_of(response, 429)["code"] == "fleet_overloaded"
        assert int(response.headers["Retry-After"]) >= 1
        assert not fleet.submitter.sent
        queued = await client.post("/v1/jobs", json={"prompt": "x"})  # /v1/jobs queues
        assert queued.status_code == 202

    run(FakeFleet(fleet.settings.files_dir, max_queued_jobs=5), scenario)


def test_models_are_listed_with_their_context_and_an_unknown_one_is_404(
    fleet: FakeFleet,
) -> None:
    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        fleet.models.announce(None, 8192)
        fleet.models.announce("other", 1024)
        listed = (await client.get("/v1/models")).json()["data"]
        assert [(m["id"], m.get("max_model_len")) for m in listed] == [
            (fleet.settings.model, 8192),
            ("other", 1024),
        ]
        assert (await client.get("/v1/models/other")).json()["max_model_len"] == 1024
        missing = await client.get("/v1/models/nope")
        assert error_of(missing, 404)["code"] == "model_not_found"
        routed = await client.post("/v1/jobs", json={"prompt": "x", "model": "other"})
        assert routed.status_code == 202
        assert fleet.submitter.sent[-1][0] == fleet.settings.names.for_model("other").jobs_topic

    run(fleet, scenario)


def test_file_routes(tmp_path: Path) -> None:
    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions"})
        upload = await client.post(
            "/v1/files", files={"file": ("in.jsonl", line.encode())}, data={"purpose": "batch"}
        )
        assert upload.status_code == 200, upload.text
        file_id = upload.json()["id"]
        assert (await client.get(f"/v1/files/{file_id}/content")).content == line.encode()
        wrong = await client.post(
            "/v1/files", files={"file": ("x", b"{}")}, data={"purpose": "fine-tune"}
        )
        assert error_of(wrong, 400)["param"] == "purpose"
        lines = await client.post(
            "/v1/files", files={"file": ("x", b"{}\n{}\n{}\n")}, data={"purpose": "batch"}
        )
        assert error_of(lines, 400)["code"] == "too_many_lines"
        big = await client.post(
            "/v1/files", files={"file": ("x", b"x" * 600)}, data={"purpose": "batch"}
        )
        assert error_of(big, 413)["code"] == "file_too_large"
        for method, path in (
            ("GET", "/v1/files/file-missing"),
            ("GET", "/v1/files/file-missing/content"),
            ("DELETE", "/v1/files/file-missing"),
        ):
            assert error_of(await client.request(method, path), 404)["code"] == "file_not_found"
        assert (await client.delete(f"/v1/files/{file_id}")).json()["deleted"] is True
        assert [f["id"] for f in (await client.get("/v1/files")).json()["data"]] == []

    run(FakeFleet(tmp_path, max_file_bytes=500, max_file_lines=2), scenario)


def test_batch_routes(fleet: FakeFleet) -> None:
    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        body = {"endpoint": "/v1/completions", "completion_window": "24h"}
        missing = await client.post("/v1/batches", json={**body, "input_file_id": "file-x"})
        assert error_of(missing, 404)["param"] == "input_file_id"
        assert error_of(await client.post("/v1/batches", json={"endpoint": "/v1/nope"}), 422)
        for method, path in (("GET", "/v1/batches/b1"), ("POST", "/v1/batches/b1/cancel")):
            assert error_of(await client.request(method, path), 404)["param"] == "batch_id"
        upload = await client.post(
            "/v1/files", files={"file": ("in.jsonl", b"{}")}, data={"purpose": "batch"}
        )
        created = await client.post(
            "/v1/batches", json={**body, "input_file_id": upload.json()["id"]}
        )
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
        assert "tenant" not in created.json()
        cancelling = await client.post(f"/v1/batches/{batch_id}/cancel")
        assert cancelling.json()["status"] == "cancelling"
        assert [b["id"] for b in (await client.get("/v1/batches")).json()["data"]] == [batch_id]

    run(fleet, scenario)


def test_keys_map_to_tenants_and_a_tenant_sees_only_its_jobs(tmp_path: Path) -> None:
    fleet = FakeFleet(tmp_path, api_keys="key-a=alpha,key-b=beta")

    async def as_alpha(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        assert (await client.post("/v1/jobs", json={"prompt": "x", "job_id": "a1"})).is_success

    async def as_beta(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        assert error_of(await client.get("/v1/jobs/a1"), 404)["code"] == "job_not_found"
        assert error_of(await client.delete("/v1/jobs/a1"), 404)

    async def anonymous(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        assert error_of(await client.post("/v1/jobs", json={"prompt": "x"}), 401)
        assert (await client.get("/healthz")).status_code == 200

    run(fleet, as_alpha, "key-a")
    run(fleet, as_beta, "key-b")
    run(fleet, anonymous, "wrong-key")
    assert [job.tenant for _, _, job in fleet.submitter.sent] == ["alpha"]


def test_redis_down_is_a_503_state_unavailable(tmp_path: Path) -> None:
    """The real job store, with no Redis behind it."""
    fleet = FakeFleet(tmp_path)
    from producer_api.stores.jobs import JobStore

    fleet.fleet.store = JobStore(fleet.fleet.redis, fleet.settings)

    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        response = await client.get("/v1/jobs/j1")
        assert error_of(response, 503)["code"] == "state_unavailable"
        assert int(response.headers["Retry-After"]) > 0
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["redis"] is False
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200 and b"genfleet" in metrics.content

    run(fleet, scenario)


def test_a_body_over_the_cap_is_413(tmp_path: Path) -> None:
    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        response = await client.post("/v1/jobs", json={"prompt": "x" * 5000})
        assert error_of(response, 413)
        assert not fleet.submitter.sent

    run(FakeFleet(tmp_path, max_body_bytes=1000), scenario)


def test_ready_means_a_worker_of_the_default_model_reads_its_jobs(fleet: FakeFleet) -> None:
    """Until then ``/readyz`` is 503 (a request would wait for the worker); with
    ``fleet=false`` it says only that this process can queue jobs."""

    class AnsweringRedis:
        async def ping(self) -> bool:
            return True

    fleet.fleet.redis = AnsweringRedis()  # type: ignore[assignment]

    async def scenario(fleet: FakeFleet, client: httpx.AsyncClient) -> None:
        async def ready() -> tuple[int, dict]:
            response = await client.get("/readyz")
            return response.status_code, response.json()

        assert (await client.get("/readyz", params={"fleet": "false"})).status_code == 200
        status, body = await ready()
        assert status == 503 and body["workers"] is False
        fleet.models.announce("other-model", 512)  # another model's worker
        fleet.models.announce(None, 512, partitions=0)  # joined, given no partition yet
        status, body = await ready()
        assert status == 503 and body["workers"] is False
        fleet.models.announce(None, 512, partitions=2)
        status, body = await ready()
        assert status == 200 and body["workers"] is True

    run(fleet, scenario)
