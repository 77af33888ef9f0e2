"""The batch tests' client side: the official openai client on a fleet's API, batch input
lines, and waiting for a batch to reach a status."""

import json
import time
from pathlib import Path

from openai import OpenAI


def batch_client(api, retries: int = 0, api_key: str = "unused") -> OpenAI:
    return OpenAI(base_url=f"{api.url}/v1", api_key=api_key, max_retries=retries, timeout=60)


def chat_line(i: int, **body) -> dict:
    messages = [{"role": "user", "content": f"Question number {i}?"}]
    return {
        "custom_id": f"q-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "tiny-chat", "messages": messages, "max_tokens": 4 + i % 5,
                 "temperature": 0, **body},
    }  # fmt: skip


def upload(client: OpenAI, lines: list[dict]) -> str:
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=("input.jsonl", content), purpose="batch").id


def create_batch(client: OpenAI, lines: list[dict]):
    return client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
        completion_window="24h",
    )  # fmt: skip


def wait_for_status(
    client: OpenAI,
    batch_id: str,
    statuses: set[str],
    timeout_s: float = 180,
    log_dir: Path | None = None,
):
    """The batch once its status is one of ``statuses``; on timeout an AssertionError
    with its counts and the last lines of the fleet's logs in ``log_dir``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.5)
    tails = "".join(
        f"\n--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-40:])
        for path in sorted(log_dir.glob("*.log") if log_dir else [])
    )
    raise AssertionError(
        f"batch {batch_id} still {batch.status} after {timeout_s} s ({batch.request_counts}){tails}"
    )


def read_jsonl(client: OpenAI, file_id: str) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]
