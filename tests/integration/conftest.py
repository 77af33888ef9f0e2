"""A real broker, a real Redis, and worker processes for the integration tests."""

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from genfleet.local_services import LocalService, free_port, local_services, start_redis
from genfleet.processes import ApiProcess, FleetProcess
from queue_schemas import Names

MODEL = "SmolLM2-135M-Instruct"
# The tiny chat model's KV cache: the default 1 GiB is 131072 blocks of it, 2 s more of
# every worker's start; 64 MiB (8192 blocks) holds what any test sends.
TINY_KV_FLAGS = ("--kv-cache-memory-gib", "0.0625")


@pytest.fixture(scope="session")
def services() -> Iterator[tuple[LocalService, LocalService]]:
    with local_services() as pair:
        yield pair


@pytest.fixture
def prefix() -> str:
    """Fresh topic and key names for each test."""
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.fixture
def start_worker(services, chat_model, prefix, tmp_path):
    """start_worker(*extra_flags, env=None) -> a running worker process on this test's
    topics (``env``: extra environment variables)."""
    kafka, redis = services
    workers: list[FleetProcess] = []

    def start(*extra: str, env: dict[str, str] | None = None) -> FleetProcess:
        args = [
            "--kafka-bootstrap", kafka.address, "--redis-url", redis.address,
            "--model", str(chat_model), "--topic-prefix", prefix,
            "--jobs-partitions", "4", *TINY_KV_FLAGS, *extra,
        ]  # fmt: skip
        worker = FleetProcess("worker", args, tmp_path / f"worker-{len(workers)}.log", env)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


@pytest.fixture
def start_api(services, prefix, tmp_path):
    """start_api(*extra_flags) -> a running API process on this test's topics."""
    kafka, redis = services
    apis: list[ApiProcess] = []

    def start(*extra: str, kafka_address: str | None = None) -> ApiProcess:
        args = [
            "--kafka-bootstrap", kafka_address or kafka.address, "--redis-url", redis.address,
            "--topic-prefix", prefix, "--jobs-partitions", "4", *extra,
        ]  # fmt: skip
        api = ApiProcess(args, tmp_path / f"api-{len(apis)}.log")
        apis.append(api)
        return api

    yield start
    for api in apis:
        api.stop()


def fleet_flags(services: tuple[LocalService, LocalService]) -> tuple[str, list[str]]:
    """A fresh topic prefix, and the flags that put a process of a shared fleet on it."""
    kafka, redis = services
    prefix = f"f{uuid.uuid4().hex[:8]}."
    flags = [
        "--kafka-bootstrap", kafka.address, "--redis-url", redis.address,
        "--topic-prefix", prefix, "--jobs-partitions", "2",
    ]  # fmt: skip
    return prefix, flags


def metered_worker(
    flags: list[str], model: Path, log: Path, *extra: str
) -> tuple[FleetProcess, str]:
    """A worker on the tiny model's KV budget serving its metrics and health, and their
    URL, once it is ready (model loaded, group joined)."""
    port = free_port()
    worker = FleetProcess(
        "worker",
        [*flags, "--model", str(model), *TINY_KV_FLAGS,
         "--metrics-host", "127.0.0.1", "--metrics-port", str(port), *extra],
        log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while not _ready(url):
        assert time.monotonic() < deadline and worker.alive, worker.log()
        time.sleep(0.2)
    return worker, url


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@dataclass
class SmolFleet:
    api: ApiProcess
    prefix: str  # of its topics and keys
    redis_url: str
    common: list[str]  # its broker, Redis and prefix flags (for a batch runner)

    @property
    def url(self) -> str:
        return self.api.url


@pytest.fixture(scope="session")
def smollm2_fleet(services, smollm2_path, tmp_path_factory):
    """A SmolLM2 worker and the API in front of it, shared by the tests that ask the real
    model (each of its jobs has an id of its own), on topics of their own and a Redis of
    their own: tests that count an API's Redis connections see only their API's."""
    redis = start_redis()
    prefix, common = fleet_flags((services[0], redis))
    logs = tmp_path_factory.mktemp("smollm2-fleet")
    # The worker speculates (n-gram drafts): every request these tests send goes through
    # verification where it may, so the OpenAI routes' guarantees are checked with it on.
    speculation = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'
    worker = FleetProcess(
        "worker",
        [*common, "--model", str(smollm2_path), "--speculative-config", speculation],
        logs / "worker.log",
    )
    api = ApiProcess([*common, "--model", MODEL], logs / "api.log")
    yield SmolFleet(api, prefix, redis.address, [*common, "--model", MODEL])
    api.stop()
    worker.stop()
    redis.stop()


ALICE, BOB = "key-alice", "key-bob"


@pytest.fixture(scope="session")
def api_fleet(services, chat_model, tmp_path_factory):
    """One worker on the tiny chat model and one API with two tenants (``ALICE``, ``BOB``),
    shared by the API's tests: each job is the test's own, in its tenant."""
    prefix, common = fleet_flags(services)
    logs = tmp_path_factory.mktemp("fleet")
    worker = FleetProcess(
        "worker", [*common, "--model", str(chat_model), "--max-num-seqs", "64"], logs / "w.log"
    )
    api = ApiProcess(
        [*common, "--api-keys", f"{ALICE}=alice,{BOB}=bob", "--max-body-bytes", "65536",
         "--rate-limit-per-minute", "100000", "--max-outstanding-jobs", "1000"],
        logs / "api.log",
    )  # fmt: skip
    yield api, worker, Names(prefix), services[1].address
    api.stop()
    worker.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here starts a broker, Redis or a fleet process: ``integration``."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.integration)
