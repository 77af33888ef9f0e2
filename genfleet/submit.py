"""``genfleet submit``: submit one job over HTTP and, with ``--stream``, print its tokens
as they arrive (resuming with ``Last-Event-ID`` if the connection drops)."""

import json
import sys

import httpx
from httpx_sse import connect_sse

from queue_schemas import JobResult, JobStatus, TokenEvent

RECONNECTS = 5


def submit(
    base_url: str,
    api_key: str | None,
    prompt: str,
    sampling: dict[str, float | int],
    stream: bool,
) -> int:
    """``sampling``: the fields given; the others are the served model's defaults."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"messages": [{"role": "user", "content": prompt}], "sampling": sampling}
    with httpx.Client(base_url=base_url, headers=headers, timeout=None) as client:
        response = client.post("/v1/jobs", json=body)
        if response.status_code != 202:
            print(f"genfleet: {response.status_code} {response.text}", file=sys.stderr)
            return 1
        job = response.json()
        if not stream:
            print(json.dumps(job))
            return 0
        result = _follow(client, job["links"]["events"])
    print()
    if result is None:
        print("genfleet: the stream ended without a result", file=sys.stderr)
        return 1
    if result.status is not JobStatus.COMPLETED:
        print(f"[{result.status.value}] {result.error or ''}", file=sys.stderr)
        return 1
    return 0


def _follow(client: httpx.Client, events_url: str) -> JobResult | None:
    last_event_id: str | None = None
    for _ in range(RECONNECTS):
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        try:
            with connect_sse(client, "GET", events_url, headers=headers) as source:
                for sse in source.iter_sse():
                    if sse.event == "token":
                        print(TokenEvent.model_validate_json(sse.data).text, end="", flush=True)
                        last_event_id = sse.id
                    elif sse.data:
                        return JobResult.model_validate_json(sse.data)
        except httpx.TransportError:
            continue
    return None
