"""Small HTTP helpers for the API tests: submit a job, read its server-sent events."""

from dataclasses import dataclass

import httpx
from httpx_sse import aconnect_sse, connect_sse

from queue_schemas import JobResult, TokenEvent

CHAT = [{"role": "user", "content": "Write about the sea."}]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def submit(client: httpx.Client, max_tokens: int = 16, **sampling) -> str:
    body = {
        "messages": CHAT,
        "sampling": {"max_tokens": max_tokens, "ignore_eos": True, **sampling},
    }
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    return response.json()["id"]


@dataclass
class Streamed:
    tokens: list[TokenEvent]
    ids: list[int]
    final_event: str | None = None
    result: JobResult | None = None

    @property
    def text(self) -> str:
        return "".join(event.text for event in self.tokens)


def _take(streamed: Streamed, event: str, data: str, event_id: str) -> None:
    if not data:  # a keep-alive comment
        return
    if event == "token":
        streamed.tokens.append(TokenEvent.model_validate_json(data))
        streamed.ids.append(int(event_id))
    else:
        streamed.final_event = event
        streamed.result = JobResult.model_validate_json(data)


def read_events(
    client: httpx.Client, job_id: str, last_event_id: int | None = None, stop_after: int = 0
) -> Streamed:
    """The job's events; with ``stop_after``, hang up after that many token events."""
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    streamed = Streamed([], [])
    with connect_sse(client, "GET", f"/v1/jobs/{job_id}/events", headers=headers) as source:
        source.response.raise_for_status()
        for sse in source.iter_sse():
            _take(streamed, sse.event, sse.data, sse.id)
            if streamed.result or (stop_after and len(streamed.tokens) >= stop_after):
                break
    return streamed


async def aread_events(client: httpx.AsyncClient, job_id: str) -> Streamed:
    streamed = Streamed([], [])
    async with aconnect_sse(client, "GET", f"/v1/jobs/{job_id}/events") as source:
        source.response.raise_for_status()
        async for sse in source.aiter_sse():
            _take(streamed, sse.event, sse.data, sse.id)
            if streamed.result:
                break
    return streamed
