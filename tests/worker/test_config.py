"""Device and dtype selection: what ``auto`` picks on which hardware, and what is refused;
the engine's knobs defined once and shared by the worker's settings."""

import pytest
import torch

from worker import device as devices
from worker.config import EngineConfig
from worker.device import resolve_device, resolve_dtype
from worker.service.settings import WorkerSettings


def test_auto_takes_the_cpu_without_a_gpu_and_bf16_only_with_bf16_dot_products() -> None:
    built = EngineConfig(device="auto", dtype="auto").resolved()
    assert built.device == ("cuda" if torch.cuda.is_available() else "cpu")
    if built.device == "cpu":
        expected = "bfloat16" if devices.cpu_has_bf16_dot_products() else "float32"
        assert built.dtype == expected
    assert EngineConfig().resolved().device == built.device  # auto is the default device


def test_auto_on_gpus_with_and_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_dtype("auto", "cuda:1") == "float16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_dtype("auto", "cuda") == "bfloat16"


def test_auto_on_cpus_with_and_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "cpu_has_bf16_dot_products", lambda: False)
    assert resolve_dtype("auto", "cpu") == "float32"
    monkeypatch.setattr(devices, "cpu_has_bf16_dot_products", lambda: True)
    assert resolve_dtype("auto", "cpu") == "bfloat16"
    assert resolve_dtype("float16", "cpu") == "float16"  # an explicit choice stands


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:12"])
def test_explicit_devices_are_taken_as_given(device: str) -> None:
    assert EngineConfig(device=device).resolved().device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "tpu", ""])
def test_a_bad_device_names_the_choices(device: str) -> None:
    with pytest.raises(ValueError, match="auto, cpu, cuda, cuda:N"):
        EngineConfig(device=device)


@pytest.mark.parametrize("dtype", ["fp32", "half", "int8", ""])
def test_a_bad_dtype_names_the_choices(dtype: str) -> None:
    with pytest.raises(ValueError, match="'auto', 'float32', 'bfloat16' or 'float16'"):
        EngineConfig(dtype=dtype)  # type: ignore[arg-type]


def test_engine_threads_must_be_positive_when_given() -> None:
    with pytest.raises(ValueError, match="engine_threads"):
        EngineConfig(engine_threads=0)
    assert EngineConfig().engine_threads is None  # torch's own default


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_num_seqs", 0), ("max_num_batched_tokens", 0), ("block_size", 0), ("watermark", 1.0)],
)
def test_a_knob_out_of_bounds_is_refused_by_the_engine_and_the_worker_alike(
    field: str, value: float
) -> None:
    for settings in (EngineConfig, WorkerSettings):
        with pytest.raises(ValueError, match=field):
            settings(**{field: value})


def test_the_worker_passes_every_engine_knob_it_was_given_to_its_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GENFLEET_MAX_NUM_SEQS", "7")
    monkeypatch.setenv("GENFLEET_OVERRIDE_GENERATION_CONFIG", '{"temperature": 0.3}')
    settings = WorkerSettings(block_size=32, generation_config="vllm", engine_threads=3)
    config = settings.engine_config()
    assert type(config) is EngineConfig
    assert (config.max_num_seqs, config.block_size, config.engine_threads) == (7, 32, 3)
    assert config.generation_config == "vllm"
    assert config.override_generation_config == {"temperature": 0.3}


def test_an_override_of_the_generation_config_is_json() -> None:
    config = EngineConfig(override_generation_config='{"max_new_tokens": 12}')
    assert config.override_generation_config == {"max_new_tokens": 12}
    with pytest.raises(ValueError, match="not JSON"):
        EngineConfig(override_generation_config="{temperature: 1}")


@pytest.mark.parametrize(
    ("name", "element"),
    [("fp8", torch.float8_e4m3fn), ("fp8_e4m3", torch.float8_e4m3fn),
     ("fp8_e5m2", torch.float8_e5m2), ("auto", torch.bfloat16)],
)  # fmt: skip
def test_kv_cache_dtypes_take_vllms_names(name: str, element: torch.dtype) -> None:
    assert EngineConfig(kv_cache_dtype=name, dtype="bfloat16").cache_torch_dtype == element


def test_a_bad_kv_cache_dtype_names_the_choices() -> None:
    with pytest.raises(ValueError, match="fp8_e5m2"):
        EngineConfig(kv_cache_dtype="int8")


def test_the_cpu_kv_cache_budget_takes_vllms_variable(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    assert EngineConfig().kv_cache_memory_gib == 3.0
    assert EngineConfig(kv_cache_memory_gib=0.5).kv_cache_memory_gib == 0.5  # given wins
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0")  # vLLM's "choose for me"
    assert EngineConfig().kv_cache_memory_gib == 1.0
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "lots")
    with pytest.raises(ValueError, match="VLLM_CPU_KVCACHE_SPACE is GiB"):
        EngineConfig()
