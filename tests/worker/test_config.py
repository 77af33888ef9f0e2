"""Device and dtype selection: what ``auto`` picks on which hardware, and what is refused."""

import pytest
import torch

from worker import config
from worker.config import EngineConfig, resolve_device, resolve_dtype


def test_auto_takes_the_cpu_without_a_gpu_and_bf16_only_with_bf16_dot_products() -> None:
    built = EngineConfig(device="auto", dtype="auto")
    assert built.device == ("cuda" if torch.cuda.is_available() else "cpu")
    if built.device == "cpu":
        expected = "bfloat16" if config.cpu_has_bf16_dot_products() else "float32"
        assert built.dtype == expected
    assert EngineConfig().device == built.device  # auto is the default device


def test_auto_on_gpus_with_and_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_dtype("auto", "cuda:1") == "float16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_dtype("auto", "cuda") == "bfloat16"


def test_auto_on_cpus_with_and_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "cpu_has_bf16_dot_products", lambda: False)
    assert resolve_dtype("auto", "cpu") == "float32"
    monkeypatch.setattr(config, "cpu_has_bf16_dot_products", lambda: True)
    assert resolve_dtype("auto", "cpu") == "bfloat16"
    assert resolve_dtype("float16", "cpu") == "float16"  # an explicit choice stands


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:12"])
def test_explicit_devices_are_taken_as_given(device: str) -> None:
    assert resolve_device(device) == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "tpu", ""])
def test_a_bad_device_names_the_choices(device: str) -> None:
    with pytest.raises(ValueError, match="auto, cpu, cuda, cuda:N"):
        EngineConfig(device=device)


@pytest.mark.parametrize("dtype", ["fp32", "half", "int8", ""])
def test_a_bad_dtype_names_the_choices(dtype: str) -> None:
    with pytest.raises(ValueError, match="auto, float32, bfloat16, float16"):
        EngineConfig(dtype=dtype)


def test_cpu_threads_must_be_positive_when_given() -> None:
    with pytest.raises(ValueError, match="cpu_threads must be at least 1"):
        EngineConfig(cpu_threads=0)
    assert EngineConfig().cpu_threads is None  # torch's own default
