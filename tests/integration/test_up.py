"""``genfleet up`` as a new user runs it: one command, a fleet that answers and is
counted, a Ctrl-C that leaves nothing behind; and the clear refusals at start."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from genfleet.local_services import free_port

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


def _sample(url: str, name: str, **labels: str) -> float:
    """One sample of a metrics page (0 when the series is not there yet); labels not
    named match anything."""
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    return 0.0


def _up(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "genfleet.cli", "up", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def test_up_serves_counts_the_job_and_stops_with_nothing_left(chat_model, tmp_path) -> None:
    api_port, metrics_port = free_port(), free_port()
    up = _up(
        "--model", str(chat_model), "--port", str(api_port), "--metrics-port", str(metrics_port),
        "--log-dir", str(tmp_path),
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
        assert httpx.get(f"{worker}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{worker}/readyz", timeout=5).json() == {"status": "ready"}

        tokens_before = _sample(worker, "genfleet:generation_tokens_total")
        e2e_before = _sample(worker, "genfleet:e2e_request_latency_seconds_count")
        route = "/v1/chat/completions"
        jobs_before = _sample(api, "genfleet:api_jobs_submitted_total", route=route)
        body = {
            "model": chat_model.name,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 7,
            "temperature": 0,
        }
        reply = httpx.post(f"{api}{route}", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        completion_tokens = reply.json()["usage"]["completion_tokens"]
        assert completion_tokens > 0
        assert (
            _sample(worker, "genfleet:generation_tokens_total") - tokens_before == completion_tokens
        )
        assert _sample(worker, "genfleet:e2e_request_latency_seconds_count") - e2e_before == 1
        assert _sample(api, "genfleet:api_jobs_submitted_total", route=route) - jobs_before == 1

        children = _descendants(up.pid)
        assert len(children) >= 5  # broker, Redis, worker, its engine process, API
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
