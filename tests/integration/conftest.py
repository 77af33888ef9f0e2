"""A real broker, a real Redis, and worker processes for the integration tests."""

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from genfleet.local_services import LocalService, local_services
from genfleet.processes import ApiProcess, FleetProcess
from tests.conftest import build_tiny_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="session")
def services() -> Iterator[tuple[LocalService, LocalService]]:
    with local_services() as pair:
        yield pair


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """A tiny random Llama that speaks through SmolLM2's tokenizer: real text, fast steps."""
    folder = tmp_path_factory.mktemp("tiny-chat")
    build_tiny_model(
        "llama-untied",
        folder,
        vocab_size=49152,
        intermediate_size=128,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        # Peaked logits: greedy choices do not hinge on rounding, so a job
        # regenerated in another batch gives the same text.
        initializer_range=0.3,
    )
    for name in TOKENIZER_FILES:
        if (smollm2_path / name).is_file():
            shutil.copy(smollm2_path / name, folder / name)
    return folder


@pytest.fixture
def prefix() -> str:
    """Fresh topic and key names for each test."""
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.fixture
def start_worker(services, chat_model, prefix, tmp_path):
    """start_worker(*extra_flags) -> a running worker process on this test's topics."""
    kafka, redis = services
    workers: list[FleetProcess] = []

    def start(*extra: str) -> FleetProcess:
        args = [
            "--kafka-bootstrap", kafka.address, "--redis-url", redis.address,
            "--model", str(chat_model), "--topic-prefix", prefix,
            "--jobs-partitions", "4", *extra,
        ]  # fmt: skip
        worker = FleetProcess("worker", args, tmp_path / f"worker-{len(workers)}.log")
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
