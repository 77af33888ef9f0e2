"""``genfleet <command>`` as a child process with its output in a log file: how tests,
the chaos scenarios and a local fleet start workers and APIs."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from genfleet.local_services import free_port

API_START_TIMEOUT_S = 30.0


class FleetProcess:
    """``own_group`` puts the child in a process group of its own: a Ctrl-C in the
    terminal then reaches only its parent, which stops the children in order."""

    def __init__(
        self,
        command: str,
        args: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        own_group: bool = False,
    ) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")  # a restarted process goes on in the same log
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "genfleet.cli", command, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            process_group=0 if own_group else None,
        )

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """``kill -9``: no goodbye to the group, no flush."""
        if self.alive:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def terminate(self, timeout_s: float) -> None:
        """SIGTERM (a worker drains, the API finishes its requests); SIGKILL after
        ``timeout_s``."""
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def stop(self) -> None:
        self.kill()
        self._log.close()


class ApiProcess(FleetProcess):
    """``genfleet api`` on a free loopback port, returned once ``/healthz`` answers."""

    def __init__(
        self, args: list[str], log_path: Path, port: int | None = None, own_group: bool = False
    ) -> None:
        self.port = port or free_port()
        super().__init__("api", [*args, "--port", str(self.port)], log_path, own_group=own_group)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + API_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(f"the API exited at start:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"the API did not start:\n{self.log()}")
