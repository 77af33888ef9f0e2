"""The API with fleets of its own: tenants' limits (429), a broker or Redis away (503),
and a worker that groups its tokens (``--stream-interval``)."""

import asyncio
import json
import time

import httpx
from openai import OpenAI

from genfleet.local_services import free_port, start_kafka
from queue_schemas import JobStatus
from tests.integration.api_helpers import auth, read_events, submit


def _client(api, key: str) -> httpx.Client:
    return httpx.Client(base_url=api.url, headers=auth(key), timeout=120)


def test_limits_answer_429_with_retry_after(start_api, tmp_path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(
        json.dumps(
            {
                "k-rate": {"tenant": "rate", "rate_limit_per_minute": 3},
                "k-busy": {"tenant": "busy", "max_outstanding_jobs": 2},
                "k-crowd": {"tenant": "crowd", "max_outstanding_jobs": 5},
            }
        )
    )
    api = start_api("--api-keys-file", str(keys))  # no worker: jobs stay queued
    with _client(api, "k-rate") as rate, _client(api, "k-busy") as busy:
        for _ in range(3):
            submit(rate)
        refused = rate.post("/v1/jobs", json={"prompt": "a"})
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"

        first, _ = submit(busy), submit(busy)
        over = busy.post("/v1/jobs", json={"prompt": "a"})
        assert over.status_code == 429 and "Retry-After" in over.headers
        assert over.json()["error"]["code"] == "too_many_outstanding_jobs"
        # A queued job cancelled ends at once (no worker needed) and frees its place.
        cancelled = busy.delete(f"/v1/jobs/{first}")
        assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"
        assert read_events(busy, first).final_event == "cancelled"
        submit(busy)

    async def crowd() -> list[int]:
        async with httpx.AsyncClient(base_url=api.url, headers=auth("k-crowd")) as client:
            posts = [client.post("/v1/jobs", json={"prompt": "a"}) for _ in range(20)]
            return [response.status_code for response in await asyncio.gather(*posts)]

    # Arriving together, exactly as many as the limit get in.
    assert sorted(asyncio.run(crowd())) == [202] * 5 + [429] * 15


def test_broker_down_answers_503_with_retry_after(start_api) -> None:
    """Within 5 s, the first submission too (with the default send timeout)."""
    kafka = start_kafka()
    try:
        api = start_api("--retry-after-s", "7", kafka_address=kafka.address)
        with httpx.Client(base_url=api.url, timeout=30) as client:
            job_id = submit(client)
            # No worker: the process can queue jobs, the fleet would not serve them yet.
            assert client.get("/readyz", params={"fleet": "false"}).status_code == 200
            alone = client.get("/readyz")
            assert alone.status_code == 503 and alone.json()["workers"] is False
            kafka.stop()
            for _ in range(2):
                started = time.monotonic()
                refused = client.post("/v1/jobs", json={"prompt": "a"})
                assert refused.status_code == 503
                assert time.monotonic() - started < 5.0
            assert refused.headers["Retry-After"] == "7"
            assert refused.json()["error"]["code"] == "queue_unavailable"
            ready = client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["kafka"] is False
            assert client.get(f"/v1/jobs/{job_id}").json()["status"] == JobStatus.QUEUED
            assert client.get("/healthz").status_code == 200
    finally:
        kafka.stop()


def test_the_api_starts_without_redis_and_answers_503(start_api) -> None:
    api = start_api("--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--retry-after-s", "4")
    with httpx.Client(base_url=api.url, timeout=30) as client:
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["redis"] is False
        refused = client.post("/v1/jobs", json={"prompt": "a"})
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "4"
        assert refused.json()["error"]["code"] == "state_unavailable"


def test_a_stream_interval_groups_tokens_and_readers_resume_exactly(
    start_worker, start_api
) -> None:
    start_worker("--stream-interval", "4")
    api = start_api()
    with httpx.Client(base_url=api.url, timeout=120) as client:
        job_id = submit(client, max_tokens=30)
        first = read_events(client, job_id, stop_after=3)
        # The first token alone, then groups ending at multiples of 4; ids name last tokens.
        assert [len(e.token_ids) for e in first.tokens] == [1, 3, 4]
        assert first.ids == [0, 3, 7]
        rest = read_events(client, job_id, last_event_id=first.ids[-1])
        assert rest.tokens[0].token_index == 8 and rest.final_event == "completed"
        assert first.text + rest.text == rest.result.text
        assert sum(len(e.token_ids) for e in first.tokens + rest.tokens) == 30
        assert read_events(client, job_id).ids == first.ids + rest.ids

    openai = OpenAI(base_url=f"{api.url}/v1", api_key="unused", timeout=120)
    asked = {
        "model": "SmolLM2-135M-Instruct",
        "prompt": "The sea is",
        "max_tokens": 30,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = openai.completions.create(**asked)
    chunks = [c for c in openai.completions.create(**asked, stream=True) if c.choices]
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    # Far fewer chunks than tokens: 1, 3, then 4 at a time, and the closing chunk.
    assert len(chunks) <= 2 + 30 // 4 + 1
