"""OpenAI's Batch API through the official client, unchanged: a real API, batch runner,
worker, broker and Redis."""

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest
import redis
from openai import OpenAI

from genfleet.processes import ApiProcess, FleetProcess
from tests.integration.batch_helpers import (
    batch_client,
    chat_line,
    create_batch,
    read_jsonl,
    upload,
    wait_for_status,
)
from tests.integration.conftest import fleet_flags, metered_worker


@dataclass
class BatchFleet:
    client: OpenAI
    start_runner: Callable[..., FleetProcess]
    restart_api: Callable[..., OpenAI]
    worker_metrics: str


@dataclass
class BatchWorker:
    """The module's one worker (lines of thousands of tokens taken, its metrics served),
    on topics and keys of the module's prefix."""

    prefix: str
    common: list[str]  # the flags every process of the module's fleet takes
    health_url: str


@pytest.fixture(scope="module")
def batch_worker(services, long_chat_model, tmp_path_factory):
    # A batch's window starts at its creation: a test of it must not spend the
    # window waiting for the worker to load its model and join the group.
    prefix, flags = fleet_flags(services)
    log = tmp_path_factory.mktemp("batch-worker") / "worker.log"
    worker, health_url = metered_worker(flags, long_chat_model, log)
    yield BatchWorker(prefix, flags, health_url)
    worker.stop()


@pytest.fixture
def batch_fleet(batch_worker, tmp_path):
    """The module's worker, and for this test an API, a tenant of its own (its batches
    and files are its alone) and a files folder; runners started by the test;
    ``restart_api(*flags)`` kills the API and starts another, whose client it returns."""
    key = f"sk-{uuid.uuid4().hex[:8]}"
    files = ["--files-dir", str(tmp_path / "files"), "--model", "tiny-chat"]
    common = [*batch_worker.common, *files]
    keys = ["--api-keys", f"{key}=t{key[3:]}"]
    apis: list[ApiProcess] = []
    runners: list[FleetProcess] = []

    def start_api(*extra: str) -> OpenAI:
        apis.append(ApiProcess([*common, *keys, *extra], tmp_path / f"api-{len(apis)}.log"))
        return batch_client(apis[-1], api_key=key)

    def start_runner(*extra: str) -> FleetProcess:
        log = tmp_path / f"runner-{len(runners)}.log"
        runner = FleetProcess("batch-runner", [*common, *extra], log)
        runners.append(runner)
        return runner

    def restart_api(*extra: str) -> OpenAI:
        apis[-1].kill()
        return start_api(*extra)

    client = start_api()
    yield BatchFleet(client, start_runner, restart_api, f"{batch_worker.health_url}/metrics")
    for process in [*runners, *apis]:
        # SIGTERM: a runner leaves the results' consumer group, so the next test's runner
        # joins an empty group instead of waiting out a dead member's session.
        process.terminate(10)
        process.stop()


def test_a_100_line_batch_answers_every_line_once(batch_fleet) -> None:
    client, start_runner = batch_fleet.client, batch_fleet.start_runner
    start_runner()
    lines = [chat_line(i) for i in range(100)]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"team": "etl"},
    )
    assert batch.status == "validating" and batch.metadata == {"team": "etl"}
    done = wait_for_status(client, batch.id, {"completed", "failed"})
    assert done.status == "completed", done
    assert done.request_counts.model_dump() == {"total": 100, "completed": 100, "failed": 0}
    assert done.error_file_id is None and done.output_file_id is not None
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = read_jsonl(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == [f"q-{i}" for i in range(100)]
    for i, line in enumerate(output):
        response = line["response"]
        assert response["status_code"] == 200 and line["error"] is None
        body = response["body"]
        assert body["object"] == "chat.completion" and body["model"] == "tiny-chat"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] <= 4 + i % 5
    assert done.usage.output_tokens == sum(o["response"]["body"]["usage"]["completion_tokens"]
                                           for o in output)  # fmt: skip
    assert [b.id for b in client.batches.list()] == [batch.id]


def test_each_result_lets_the_next_line_in_without_waiting_for_a_tick(batch_fleet) -> None:
    client, start_runner = batch_fleet.client, batch_fleet.start_runner
    batch = create_batch(client, [chat_line(i) for i in range(12)])
    # The runner looks at its batches once at start, then only every 10 minutes: a
    # window of 2 lines gets through 12 within the deadline only if each result wakes
    # it to submit the next lines, and the last one to write the output.
    start_runner("--batch-max-in-flight", "2", "--batch-tick-s", "600")
    done = wait_for_status(client, batch.id, {"completed", "failed"}, timeout_s=120)
    assert done.status == "completed", done
    assert done.request_counts.model_dump() == {"total": 12, "completed": 12, "failed": 0}


def test_invalid_lines_fail_the_batch_with_their_line_numbers(batch_fleet) -> None:
    client, start_runner = batch_fleet.client, batch_fleet.start_runner
    start_runner()
    lines: list = [chat_line(i) for i in range(10)]
    lines[1] = "not json"
    lines[3] = {**chat_line(3), "url": "/v1/completions"}  # not the batch's endpoint
    lines[5] = chat_line(5, temperature=7)  # the route refuses it
    lines[6] = {**chat_line(6), "custom_id": "q-0"}  # a repeated custom_id
    lines[8] = chat_line(8, max_tokens=-1)
    texts = [line if isinstance(line, str) else json.dumps(line) for line in lines]
    content = "".join(text + "\n" for text in texts)
    file_id = client.files.create(file=("bad.jsonl", content.encode()), purpose="batch").id
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    failed = wait_for_status(client, batch.id, {"failed", "completed"})
    assert failed.status == "failed" and failed.failed_at
    errors = {(e.line, e.code, e.param) for e in failed.errors.data}
    assert errors == {
        (2, "invalid_json", None),
        (4, "mismatched_url", "url"),
        (6, "invalid_request", "body.temperature"),
        (7, "duplicate_custom_id", "custom_id"),
        (9, "invalid_request", "body.max_tokens"),
    }
    assert failed.output_file_id is None  # no line ran


def test_a_cancelled_batch_ends_with_its_finished_lines_and_frees_the_worker(batch_fleet) -> None:
    client, start_runner = batch_fleet.client, batch_fleet.start_runner
    start_runner("--batch-max-in-flight", "4")
    # Two short lines, then lines seconds long: running when the cancel comes.
    lines = [chat_line(i, max_tokens=4 if i < 2 else 4000, ignore_eos=True) for i in range(40)]
    batch = create_batch(client, lines)
    deadline = time.monotonic() + 120
    while client.batches.retrieve(batch.id).request_counts.completed < 2 or not (
        _gauge(batch_fleet.worker_metrics, "num_requests_running")
    ):
        assert time.monotonic() < deadline, "the batch did not get going"
        time.sleep(0.1)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    cancelled = wait_for_status(client, batch.id, {"cancelled"}, timeout_s=90)
    finished = cancelled.request_counts.completed
    assert 2 <= finished < 40 and cancelled.request_counts.total == 40
    output = read_jsonl(client, cancelled.output_file_id)
    assert len(output) == finished == len({line["custom_id"] for line in output})
    # The lines running at the cancel were aborted, not left to finish.
    statuses = [_job_status(client, f"{batch.id}-{i + 1}-0") for i in range(40)]
    assert statuses.count("completed") == finished and "cancelled" in statuses
    # The worker let go of the cancelled lines: nothing running, no KV block held.
    deadline = time.monotonic() + 10
    gauges = ("num_requests_running", "kv_cache_usage_perc")
    while (held := [_gauge(batch_fleet.worker_metrics, name) for name in gauges]) != [0, 0]:
        assert time.monotonic() < deadline, f"running, KV usage still {held}"
        time.sleep(0.2)


def _job_status(client: OpenAI, job_id: str) -> str | None:
    """A batch job's status as /v1/jobs shows it; None for a line never submitted."""
    key = {"Authorization": f"Bearer {client.api_key}"}
    response = httpx.get(f"{_api_url(client)}/v1/jobs/{job_id}", headers=key)
    return response.json()["status"] if response.status_code == 200 else None


def _api_url(client: OpenAI) -> str:
    return str(client.base_url).removesuffix("/").removesuffix("/v1")


def _gauge(metrics_url: str, name: str) -> float | None:
    """A worker gauge's value, or None before the worker has set it."""
    text = httpx.get(metrics_url).text
    match = re.search(rf"^genfleet:{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    return None if match is None else float(match.group(1))


def test_a_batch_past_its_window_expires_with_what_finished(batch_fleet) -> None:
    client = batch_fleet.restart_api("--batch-window-s", "10")
    batch_fleet.start_runner("--batch-max-in-flight", "4")
    # The first window's lines are short (they finish within the window on a loaded
    # host too), the rest too long for all of them to.
    lines = [chat_line(i, max_tokens=4 if i < 4 else 300, ignore_eos=True) for i in range(80)]
    batch = create_batch(client, lines)
    assert batch.expires_at == batch.created_at + 10
    expired = wait_for_status(client, batch.id, {"expired", "completed"}, timeout_s=60)
    assert expired.status == "expired" and expired.expired_at >= batch.expires_at
    finished = expired.request_counts.completed
    assert 0 < finished < 80
    assert len(read_jsonl(client, expired.output_file_id)) == finished


def test_a_batch_survives_its_runner_and_its_api_dying_mid_batch(batch_fleet) -> None:
    client, start_runner = batch_fleet.client, batch_fleet.start_runner
    runner = start_runner("--batch-max-in-flight", "16")
    lines = [chat_line(i, max_tokens=16, ignore_eos=True) for i in range(100)]
    batch = create_batch(client, lines)
    deadline = time.monotonic() + 120
    while client.batches.retrieve(batch.id).request_counts.completed < 20:
        assert time.monotonic() < deadline, "the batch did not get going"
        time.sleep(0.2)
    runner.kill()  # kill -9, mid-batch: lines submitted, results unread
    client = batch_fleet.restart_api()
    assert client.batches.retrieve(batch.id).status == "in_progress"
    time.sleep(2)  # results land on the topic while no runner reads them
    start_runner("--batch-max-in-flight", "16")
    done = wait_for_status(client, batch.id, {"completed", "failed"})
    assert done.status == "completed"
    assert done.request_counts.model_dump() == {"total": 100, "completed": 100, "failed": 0}
    output = read_jsonl(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == [f"q-{i}" for i in range(100)]
    assert all(line["response"]["body"]["usage"]["completion_tokens"] == 16 for line in output)


def test_the_cli_interrupted_at_half_attaches_again_and_finishes(
    batch_fleet, batch_worker, services, tmp_path
) -> None:
    client, start_runner = batch_fleet.client, batch_fleet.start_runner
    start_runner("--batch-max-in-flight", "8")
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [chat_line(i, max_tokens=16, ignore_eos=True) for i in range(100)]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    command = [sys.executable, "-m", "genfleet.cli", "batch", "run", str(source),
               "-o", str(output), "--url", _api_url(client), "--poll-s", "0.2",
               "--api-key", client.api_key]  # fmt: skip
    # Ctrl-C as in a terminal, even where this suite runs with SIGINT ignored (a
    # background job of a shell), which the CLI would inherit.
    first = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not (batches := list(client.batches.list())) or (
        batches[0].request_counts.completed < 50
    ):
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=30)
    assert first.returncode != 0 and not output.exists()

    second = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stderr
    assert f"attaching to batch {batches[0].id}" in second.stderr
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["custom_id"] for line in written] == [f"q-{i}" for i in range(100)]
    # One batch, one job per line: nothing was submitted again.
    assert [batch.id for batch in client.batches.list()] == [batches[0].id]
    store = redis.Redis.from_url(services[1].address)
    pattern = f"{batch_worker.prefix}job:*:{batches[0].id}-*"
    jobs = [key for key in store.scan_iter(pattern) if key.count(b":") == 2]
    assert len(jobs) == 100
