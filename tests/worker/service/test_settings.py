"""The worker's engine threads: on a CPU of four cores or more all usable cores but one,
on fewer all of them, unless told otherwise."""

import os
from pathlib import Path

import pytest

from worker.config import EngineConfig
from worker.engine_process.threads import serving_engine_threads, usable_cores
from worker.service.settings import WorkerSettings

NO_CGROUP = Path("/nonexistent/cpu.max")


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 2), (3, 3), (4, 3), (16, 15)])
def test_a_cpu_engine_leaves_one_core_to_the_service_from_four_cores(
    monkeypatch: pytest.MonkeyPatch, cores: int, threads: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)))
    monkeypatch.setattr("worker.engine_process.threads.CGROUP_CPU_MAX", NO_CGROUP)
    assert WorkerSettings(device="cpu").engine_config().engine_threads == threads


def test_engine_threads_given_are_taken_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)))
    assert WorkerSettings(engine_threads=16).engine_config().engine_threads == 16
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        WorkerSettings(engine_threads=0)


def test_a_gpu_engine_takes_one_thread() -> None:
    assert serving_engine_threads("cuda") == serving_engine_threads("cuda:3") == 1


@pytest.mark.parametrize(
    ("cpu_max", "cores"),
    [
        ("max 100000\n", 16),  # no limit: the affinity
        ("400000 100000\n", 4),  # a limit of 4 CPUs
        ("150000 100000\n", 2),  # 1.5 CPUs: the engine still gets a thread
        ("5000000 100000\n", 16),  # a limit above the affinity
        ("garbage", 16),
    ],
)
def test_a_container_cpu_limit_bounds_the_usable_cores(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpu_max: str, cores: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)))
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    assert usable_cores(path) == cores
    assert usable_cores(NO_CGROUP) == 16


def test_a_cpu_worker_steps_with_the_serving_budget_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from worker.service.settings import CPU_SERVING_STEP

    config = WorkerSettings(device="cpu").engine_config()
    assert (config.max_num_batched_tokens, config.max_num_seqs) == (2048, 128)
    assert CPU_SERVING_STEP == {"max_num_batched_tokens": 2048, "max_num_seqs": 128}
    monkeypatch.setenv("GENFLEET_MAX_NUM_SEQS", "7")
    given = WorkerSettings(device="cpu", max_num_batched_tokens=512).engine_config()
    assert (given.max_num_batched_tokens, given.max_num_seqs) == (512, 7)
    # The offline engine's defaults are its own.
    assert (EngineConfig().max_num_batched_tokens, EngineConfig().max_num_seqs) == (512, 64)


def test_every_assignor_a_worker_may_list_is_one_it_has() -> None:
    from worker.service.connections import ASSIGNORS
    from worker.service.settings import KAFKA_ASSIGNORS

    assert set(ASSIGNORS) == set(KAFKA_ASSIGNORS.split("|"))
    assert WorkerSettings(kafka_assignors="sticky-lanes,sticky").kafka_assignors
    with pytest.raises(ValueError, match="kafka_assignors"):
        WorkerSettings(kafka_assignors="range")
