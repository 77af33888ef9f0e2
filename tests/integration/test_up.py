"""``genfleet up`` as a new user runs it: one command, a fleet that answers and is
counted, a Ctrl-C that leaves nothing behind; and the clear refusals at start."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import NotFoundError, OpenAI

from genfleet.local_services import free_port
from tests.integration.metrics import sample, total

READY_LINE = "Ctrl-C stops the fleet"


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _up(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "genfleet.cli", "up", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def _with_sampling_defaults(chat_model: Path, folder: Path) -> Path:
    """The tiny chat model with a generation config, as a model's makers ship one."""
    shutil.copytree(chat_model, folder)
    generation = {"do_sample": True, "temperature": 0.0, "max_new_tokens": 40}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def test_up_serves_counts_the_job_and_stops_with_nothing_left(chat_model, tmp_path) -> None:
    """Also the first hour of a new user: the banner's request and an openai client's
    call, both without sampling fields, take the model's defaults (here temperature 0
    from its generation config, and 6 tokens from the override on the command line).
    And a fleet of two models: a second ``--model`` served by a worker of its own."""
    model = _with_sampling_defaults(chat_model, tmp_path / "chat-model")
    second = _with_sampling_defaults(chat_model, tmp_path / "org_coder")
    api_port, metrics_port = free_port(), free_port()
    up = _up(
        "--model", str(model), "--model", str(second), "--port", str(api_port),
        "--metrics-port", str(metrics_port), "--log-dir", str(tmp_path),
        "--override-generation-config", '{"max_new_tokens": 6}',
    )  # fmt: skip
    assert up.stdout is not None
    output: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while READY_LINE not in "".join(output):
            assert time.monotonic() < deadline and up.poll() is None, "".join(output)
            output.append(up.stdout.readline())
        printed = "".join(output)
        api, worker = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{metrics_port}"
        assert f"{api}/v1" in printed and "curl " in printed
        assert "through the whole fleet" in printed  # the first request was answered
        assert "sampled with temperature=0.0, top_p=1.0, top_k=0, max_tokens=6" in printed
        assert httpx.get(f"{worker}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{worker}/readyz", timeout=5).json() == {"status": "ready"}

        _defaults_apply_and_the_job_is_counted(api, worker, model.name)
        second_worker = f"http://127.0.0.1:{metrics_port + 1}"
        _each_model_answers_through_its_own_workers(
            api, {model.name: worker, second.name: second_worker}
        )
        children = _descendants(up.pid)
        assert len(children) >= 7  # broker, Redis, 2 workers, their engine processes, API
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=120)
        assert up.returncode == 0, rest
        assert "genfleet stopped" in rest
        assert [pid for pid in children if _running(pid)] == []
    finally:
        if up.poll() is None:
            for pid in _descendants(up.pid):
                os.kill(pid, signal.SIGKILL)
            up.kill()


def _defaults_apply_and_the_job_is_counted(api: str, worker: str, model: str) -> None:
    """An openai client's call without sampling fields runs with the defaults (and is
    counted once on both sides); a value the request gives always wins over them."""
    tokens_before = sample(worker, "genfleet:generation_tokens_total")
    e2e_before = sample(worker, "genfleet:e2e_request_latency_seconds_count")
    route = "/v1/chat/completions"
    jobs_before = sample(api, "genfleet:api_jobs_submitted_total", route=route)
    client = OpenAI(base_url=f"{api}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Hello"}]
    reply = client.chat.completions.create(model=model, messages=messages)
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 6
    applied = _applied_sampling(api, reply.id)
    assert (applied["temperature"], applied["max_tokens"], applied["top_p"]) == (0.0, 6, 1.0)
    assert (
        sample(worker, "genfleet:generation_tokens_total") - tokens_before
        == reply.usage.completion_tokens
    )
    assert sample(worker, "genfleet:e2e_request_latency_seconds_count") - e2e_before == 1
    # The tiny chat model: float parameters (bf16 or fp32 by the CPU), a few MiB.
    assert 1 << 20 < total(worker, "genfleet:model_weight_bytes") < 64 << 20
    assert sample(api, "genfleet:api_jobs_submitted_total", route=route) - jobs_before == 1
    given = client.chat.completions.create(
        model=model, messages=messages, max_tokens=3, temperature=0.5, seed=1
    )
    assert given.usage is not None and given.usage.completion_tokens <= 3
    applied = _applied_sampling(api, given.id)
    assert (applied["temperature"], applied["max_tokens"]) == (0.5, 3)


def _each_model_answers_through_its_own_workers(api: str, workers: dict[str, str]) -> None:
    """``/v1/models`` lists both; a request (or a batch line) for a model runs on that
    model's worker only; an unknown model is OpenAI's 404."""
    client = OpenAI(base_url=f"{api}/v1", api_key="unused", max_retries=0, timeout=60)
    deadline = time.monotonic() + 10  # the API reads announcements at most every 2 s
    while len(listed := client.models.list().data) < len(workers):
        assert time.monotonic() < deadline, listed
        time.sleep(0.5)
    assert [m.id for m in listed] == list(workers)
    assert all(m.model_extra and m.model_extra["max_model_len"] == 1024 for m in listed)
    assert [client.models.retrieve(name).id for name in workers] == list(workers)
    messages = [{"role": "user", "content": "Hello"}]

    def served() -> dict[str, float]:
        return {name: total(url, "genfleet:request_success_total") for name, url in workers.items()}

    for name, url in workers.items():
        before = served()
        client.chat.completions.create(model=name, messages=messages, max_tokens=2)
        after = served()
        assert {n: after[n] - before[n] for n in workers} == {n: float(n == name) for n in workers}
        assert sample(url, "genfleet:request_success_total", model_name=name) >= 1
    for ask in (
        lambda: client.chat.completions.create(model="no/such-model", messages=messages),
        lambda: client.models.retrieve("no/such-model"),
    ):
        with pytest.raises(NotFoundError) as refused:
            ask()
        assert refused.value.code == "model_not_found"
    lines = [
        {"custom_id": f"{name}-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": name, "messages": messages, "max_tokens": 2}}
        for name in workers for i in range(2)
    ]  # fmt: skip
    before = served()
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = client.files.create(file=("input.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while (batch := client.batches.retrieve(batch.id)).status != "completed":
        assert time.monotonic() < deadline, batch
        assert batch.status in ("validating", "in_progress"), batch
        time.sleep(0.5)
    assert batch.request_counts is not None and batch.request_counts.completed == len(lines)
    after = served()
    assert {n: after[n] - before[n] for n in workers} == {n: 2.0 for n in workers}


def _applied_sampling(api: str, completion_id: str) -> dict:
    """The sampling the fleet applied to a completion's (first) job, from its record."""
    job = httpx.get(f"{api}/v1/jobs/{completion_id}-0", timeout=10).json()
    return job["sampling"]


def test_up_refuses_a_port_in_use_before_starting_anything(chat_model) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = _up("--model", str(chat_model), "--port", str(port))
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 2
    assert f"port {port} (the API) is in use" in out


def test_up_without_redis_server_says_so_and_leaves_nothing_running(chat_model, tmp_path) -> None:
    # A PATH with everything but redis-server.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for tool in Path(folder).glob("*") if Path(folder).is_dir() else []:
            if tool.name != "redis-server" and not (bin_dir / tool.name).exists():
                (bin_dir / tool.name).symlink_to(tool)
    assert shutil.which("redis-server", path=str(bin_dir)) is None
    up = _up(
        "--model", str(chat_model), "--port", str(free_port()),
        "--metrics-port", str(free_port()), env={"PATH": str(bin_dir)},
    )  # fmt: skip
    out, _ = up.communicate(timeout=60)
    assert up.returncode == 2
    assert "redis-server not found" in out
    assert not any(_running(pid) for pid in _descendants(up.pid))


def test_up_with_a_model_that_will_not_load_says_why_and_stops_everything(tmp_path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", "vocab_size": "many"}')
    up = _up(
        "--model", str(broken), "--port", str(free_port()),
        "--metrics-port", str(free_port()), "--log-dir", str(tmp_path / "logs"),
    )  # fmt: skip
    children: set[int] = set()
    deadline = time.monotonic() + 120
    while up.poll() is None and time.monotonic() < deadline:
        children |= _descendants(up.pid)
        time.sleep(0.2)
    out, _ = up.communicate(timeout=120)
    assert up.returncode == 2, out
    assert "a worker exited at start" in out and "worker-0.log" in out
    assert len(children) >= 3  # the broker, Redis and the worker had started
    assert [pid for pid in children if _running(pid)] == []
