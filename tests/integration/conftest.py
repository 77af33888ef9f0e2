"""A real broker, a real Redis, and worker processes for the integration tests."""

import uuid
from collections.abc import Iterator

import pytest

from genfleet.local_services import LocalService, local_services
from genfleet.processes import ApiProcess, FleetProcess

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


@pytest.fixture
def smollm2_fleet(services, smollm2_path, start_api, prefix, tmp_path):
    """A SmolLM2 worker and the API in front of it, on this test's topics."""
    kafka, redis = services
    worker = FleetProcess(
        "worker",
        ["--kafka-bootstrap", kafka.address, "--redis-url", redis.address,
         "--topic-prefix", prefix, "--jobs-partitions", "2", "--model", str(smollm2_path)],
        tmp_path / "worker.log",
    )  # fmt: skip
    yield start_api("--model", MODEL)
    worker.stop()
