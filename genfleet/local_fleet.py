"""A whole fleet on this host: the local broker and Redis, N workers, an API, and the
faults the chaos scenarios make of signals and restarts."""

import contextlib
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from genfleet.chaos.target import Faults, Target
from genfleet.local_services import LocalService, start_kafka, start_redis
from genfleet.processes import ApiProcess, FleetProcess

READY_TIMEOUT_S = 120.0
_ASSIGNED = re.compile(r"assigned \[\S")  # a partition or more


class LocalFleet:
    def __init__(
        self,
        kafka: LocalService,
        redis: LocalService,
        model: Path | str,
        log_dir: Path,
        own_group: bool = False,
    ) -> None:
        self.kafka = kafka
        self.redis = redis
        self.model = model
        self.log_dir = log_dir
        self.own_group = own_group
        self.prefix = "genfleet."
        self.workers: dict[str, FleetProcess] = {}  # by worker id
        self._worker_args: dict[str, list[str]] = {}
        self.apis: list[ApiProcess] = []
        self.batch_runners: list[FleetProcess] = []

    def start_worker(self, *extra: str) -> FleetProcess:
        worker_id = f"worker-{len(self.workers)}"
        self._worker_args[worker_id] = [
            "--kafka-bootstrap", self.kafka.address, "--redis-url", self.redis.address,
            "--model", str(self.model), "--topic-prefix", self.prefix,
            "--worker-id", worker_id, *extra,
        ]  # fmt: skip
        return self.restart_worker(worker_id)

    def restart_worker(self, worker_id: str) -> FleetProcess:
        """(Re)start a worker with the arguments it was first started with."""
        log_path = self.log_dir / f"{worker_id}.log"
        worker = FleetProcess(
            "worker", self._worker_args[worker_id], log_path, own_group=self.own_group
        )
        self.workers[worker_id] = worker
        return worker

    def start_batch_runner(self, *extra: str) -> FleetProcess:
        args = [
            "--kafka-bootstrap", self.kafka.address, "--redis-url", self.redis.address,
            "--topic-prefix", self.prefix, *extra,
        ]  # fmt: skip
        log_path = self.log_dir / f"batch-runner-{len(self.batch_runners)}.log"
        runner = FleetProcess("batch-runner", args, log_path, own_group=self.own_group)
        self.batch_runners.append(runner)
        return runner

    def start_api(self, *extra: str, port: int | None = None) -> ApiProcess:
        """An API (on a free loopback port unless given), returned once it answers."""
        args = [
            "--kafka-bootstrap", self.kafka.address, "--redis-url", self.redis.address,
            "--topic-prefix", self.prefix, *extra,
        ]  # fmt: skip
        log_path = self.log_dir / f"api-{len(self.apis)}.log"
        api = ApiProcess(args, log_path, port, own_group=self.own_group)
        self.apis.append(api)
        return api

    def wait_until_serving(self, since: dict[str, int] | None = None) -> None:
        """Every live worker has joined the group and holds a partition (in its log past
        ``since``'s offset, for a worker started again into the same log)."""
        since = since or {}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            live = {i: w for i, w in self.workers.items() if w.alive}
            if all(_ASSIGNED.search(w.log()[since.get(i, 0) :]) for i, w in live.items()):
                return
            time.sleep(0.2)
        raise RuntimeError("workers did not join the group in time")

    def revive(self) -> None:
        """Start again every worker that died, as an orchestrator would, and wait until
        all serve (the chaos scenarios kill workers; the next one needs the fleet whole)."""
        since = {}
        for worker_id, worker in list(self.workers.items()):
            if not worker.alive:
                since[worker_id] = len(worker.log())
                self.restart_worker(worker_id)
        if since:
            self.wait_until_serving(since)

    def kill_worker(self, worker_id: str | None = None) -> str:
        """kill -9 of the worker named, or of the first one alive."""
        if worker_id is None or worker_id not in self.workers:
            worker_id = next(i for i, w in self.workers.items() if w.alive)
        self.workers[worker_id].kill()
        return worker_id

    def pause_broker(self, seconds: float) -> None:
        self.kafka.pause()
        try:
            time.sleep(seconds)
        finally:
            self.kafka.resume()

    def restart_broker(self) -> None:
        self.kafka.stop()
        self.kafka.start()

    def restart_redis(self, down_s: float) -> None:
        self.redis.stop()
        time.sleep(down_s)
        self.redis.start()

    def target(self) -> Target:
        faults = Faults(
            kill_worker=self.kill_worker,
            pause_broker=self.pause_broker,
            restart_broker=self.restart_broker,
            restart_redis=self.restart_redis,
            workers_alive=lambda: sum(w.alive for w in self.workers.values()),
        )
        return Target(self.kafka.address, self.redis.address, self.prefix, faults=faults)

    def stop(self) -> None:
        for process in [*self.apis, *self.batch_runners, *self.workers.values()]:
            process.stop()

    def stop_gracefully(self, api_timeout_s: float, worker_timeout_s: float = 60.0) -> None:
        """The APIs and batch runners first (no new jobs), then the workers, together:
        each drains its running jobs and commits. What does not stop in time is killed."""
        for process in [*self.apis, *self.batch_runners]:
            process.terminate(api_timeout_s)
        for worker in self.workers.values():
            if worker.alive:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers.values():
            worker.terminate(worker_timeout_s)
        self.stop()


@contextlib.contextmanager
def local_fleet(
    model: Path | str, log_dir: Path, redis_data_dir: Path | None = None, own_group: bool = False
) -> Iterator[LocalFleet]:
    """Broker and Redis started here (workers: ``start_worker``), all stopped on exit."""
    kafka = start_kafka(own_group=own_group)
    try:
        redis = start_redis(data_dir=redis_data_dir, own_group=own_group)
        try:
            fleet = LocalFleet(kafka, redis, model, log_dir, own_group)
            try:
                yield fleet
            finally:
                fleet.stop()
        finally:
            redis.stop()
    finally:
        kafka.stop()
