"""``genfleet batch run|status|cancel``: a JSONL file through the fleet's Batch API.

``run`` uploads the file, creates the batch, shows its progress and writes the
results in input order (``-o``; failed lines to ``<output>.errors.jsonl``).
Which batch writes an output is recorded beside it (``<output>.batch.json``,
with the input's digest): run again after an interruption, it attaches to that
batch instead of starting over; a changed input starts a new one.
"""

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

FINAL = {"completed", "failed", "expired", "cancelled"}
console = Console(stderr=True)


class BatchCallFailed(RuntimeError):
    """The API refused a call: its status and answer."""


def _client(base_url: str, api_key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=base_url, headers=headers, timeout=60)


def _answer(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise BatchCallFailed(f"{response.status_code} {response.text}")
    return response.json()


def _endpoint_of(content: bytes) -> str:
    """The route of the file's first request: a batch has one endpoint."""
    for line in content.splitlines():
        if line.strip():
            return json.loads(line).get("url", "/v1/chat/completions")
    raise ValueError("the input file has no requests")


def _record_path(output: Path) -> Path:
    return output.with_name(output.name + ".batch.json")


def _recorded_batch(output: Path, digest: str) -> str | None:
    try:
        record = json.loads(_record_path(output).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return record.get("batch_id") if record.get("input_sha256") == digest else None


def _write(path: Path, content: bytes) -> None:
    """Whole or not at all: a rerun never reads a half-written file as done."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(content)
    partial.replace(path)


def run_batch(base_url: str, api_key: str | None, source: Path, output: Path, poll_s: float) -> int:
    content = source.read_bytes()
    digest = hashlib.sha256(content).hexdigest()
    with _client(base_url, api_key) as client:
        batch_id = _recorded_batch(output, digest)
        if batch_id is None:
            uploaded = _answer(
                client.post("/v1/files", files={"file": (source.name, content)},
                            data={"purpose": "batch"})
            )  # fmt: skip
            body = {"input_file_id": uploaded["id"], "endpoint": _endpoint_of(content),
                    "completion_window": "24h"}  # fmt: skip
            batch_id = _answer(client.post("/v1/batches", json=body))["id"]
            record = {"batch_id": batch_id, "input": str(source), "input_sha256": digest}
            _write(_record_path(output), json.dumps(record).encode())
            console.print(f"batch {batch_id} created")
        else:
            console.print(f"attaching to batch {batch_id} (recorded in {_record_path(output)})")
        batch = _follow(client, batch_id, poll_s)
        return _finish(client, batch, output)


def _follow(client: httpx.Client, batch_id: str, poll_s: float) -> dict[str, Any]:
    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed, {task.fields[rate]} tok/s"),
        TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("validating", total=None, failed=0, rate="-")
        last: tuple[float, int] | None = None
        while True:
            batch = _answer(client.get(f"/v1/batches/{batch_id}"))
            counts, tokens = batch["request_counts"], batch["usage"]["output_tokens"]
            now = time.monotonic()
            rate = "-" if last is None else f"{(tokens - last[1]) / max(now - last[0], 1e-9):.0f}"
            last = (now, tokens)
            progress.update(
                task, description=batch["status"], total=counts["total"] or None,
                completed=counts["completed"] + counts["failed"], failed=counts["failed"],
                rate=rate,
            )  # fmt: skip
            if batch["status"] in FINAL:
                return batch
            time.sleep(poll_s)


def _finish(client: httpx.Client, batch: dict[str, Any], output: Path) -> int:
    status, counts = batch["status"], batch["request_counts"]
    if batch.get("errors"):
        for error in batch["errors"]["data"]:
            console.print(f"line {error['line']}: {error['code']}: {error['message']}")
    for key, path in (("output_file_id", output), ("error_file_id", _errors_path(output))):
        if batch.get(key):
            response = client.get(f"/v1/files/{batch[key]}/content")
            if response.status_code >= 400:
                raise BatchCallFailed(f"{response.status_code} {response.text}")
            _write(path, response.content)
    console.print(
        f"batch {batch['id']} {status}: {counts['completed']} of {counts['total']} completed, "
        f"{counts['failed']} failed; output in {output}"
    )
    return 0 if status == "completed" and not counts["failed"] else 1


def _errors_path(output: Path) -> Path:
    return output.with_name(output.stem + ".errors.jsonl")


def batch_status(base_url: str, api_key: str | None, batch_id: str) -> int:
    with _client(base_url, api_key) as client:
        print(json.dumps(_answer(client.get(f"/v1/batches/{batch_id}")), indent=2))
    return 0


def cancel_batch(base_url: str, api_key: str | None, batch_id: str) -> int:
    with _client(base_url, api_key) as client:
        batch = _answer(client.post(f"/v1/batches/{batch_id}/cancel"))
    print(f"batch {batch['id']} {batch['status']}", file=sys.stderr)
    return 0
