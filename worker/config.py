"""Engine settings: the knobs of vLLM's engine arguments that apply here, defined once.

``EngineConfig`` is what the offline ``LLM`` and ``LLMEngine`` take, and the
worker's settings are built on it (``WorkerSettings`` adds the service's own), so
every knob has one name, one default, one bound and one description, from which
the command-line flags of ``genfleet worker``, ``up`` and ``generate`` are made.
Imports no torch: the service process and ``genfleet --help`` read it too;
``resolved()`` settles ``auto`` with torch, in the engine's process.
"""

import json
import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from worker.model_fetch import DEFAULT_MODEL

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
GIB = 1 << 30
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"


class SpeculativeConfig(BaseModel):
    """vLLM's ``speculative_config``: draft tokens verified in one step, proposed from
    the sequence itself (``ngram``: the tokens that followed the latest earlier
    occurrence of its last ``prompt_lookup_max`` .. ``prompt_lookup_min`` tokens) or by
    a smaller model with the same vocabulary (``draft_model``, given as ``model``)."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["ngram", "draft_model"] | None = Field(
        None, description="ngram, or draft_model (the default when a model is given)"
    )
    model: str | None = Field(None, description="the draft model: folder, GGUF or known name")
    num_speculative_tokens: int = Field(ge=1, le=16)
    prompt_lookup_max: int = Field(4, ge=1, le=64)
    prompt_lookup_min: int = Field(1, ge=1, le=64)
    disable_by_batch_size: int | None = Field(
        None, ge=1, description="no speculation in a step with more running sequences"
    )

    @model_validator(mode="after")
    def _consistent(self) -> "SpeculativeConfig":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must not exceed prompt_lookup_max")
        if self.method is None:
            self.method = "ngram" if self.model is None else "draft_model"
        if self.method == "draft_model" and self.model is None:
            raise ValueError('method "draft_model" needs "model": the draft model to run')
        if self.method == "ngram" and self.model is not None:
            raise ValueError('method "ngram" takes no "model": proposals come from the prompt')
        return self


def cpu_kv_cache_space() -> float:
    """vLLM's CPU knob for the KV cache's GiB, ``VLLM_CPU_KVCACHE_SPACE``; 1 GiB when it
    is unset or 0 (vLLM's "choose for me")."""
    value = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    try:
        space = float(value or 0)
    except ValueError:
        raise ValueError(f"VLLM_CPU_KVCACHE_SPACE is GiB, a number; got {value!r}") from None
    return space if space > 0 else 1.0


class EngineConfig(BaseModel):
    """Everything the engine needs to start.

    ``model`` is a Hugging Face model folder or the name of a model that
    ``genfleet model fetch`` knows. The KV cache gets ``num_gpu_blocks_override``
    blocks when set, otherwise as many as fit in ``kv_cache_memory_gib`` (CPU) or
    ``gpu_memory_utilization`` (CUDA).
    """

    model_config = ConfigDict(extra="forbid")

    model: str = Field(DEFAULT_MODEL, description="model folder or known name")
    device: str = Field("auto", description=f"{DEVICE_CHOICES} (auto: CUDA if torch sees a GPU)")
    dtype: Dtype = Field(
        "auto",
        description="auto (bf16 where the hardware has bf16 dot products, else fp16 on a GPU "
        "and fp32 on a CPU), float32, bfloat16, float16",
    )
    max_model_len: int | None = Field(
        None, ge=1, description="context length (default: the model's)"
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="ranks the model is split across, one process each (gloo on a CPU, "
        "NCCL on CUDA with one GPU per rank)",
    )
    max_num_seqs: int = Field(64, ge=1, description="sequences per engine step")
    max_num_batched_tokens: int = Field(512, ge=1, description="tokens per engine step")
    block_size: int = Field(16, ge=1, description="KV cache block size")
    kv_cache_dtype: KvCacheDtype = Field(
        "auto",
        description="auto (the model's dtype), fp8 (= fp8_e4m3), fp8_e4m3, fp8_e5m2: one byte "
        "per element, twice the blocks of a 16-bit cache at one budget, less precise",
    )
    calculate_kv_scales: bool = Field(
        False,
        description="fp8 KV cache: per-layer K and V scales from the first prefill "
        "(max |x| / 200, as vLLM computes them) instead of 1.0",
    )
    num_gpu_blocks_override: int | None = Field(None, ge=1, description="KV blocks, fixed")
    kv_cache_memory_gib: float = Field(
        default_factory=cpu_kv_cache_space,
        gt=0,
        description="CPU: KV cache budget (GiB; default: VLLM_CPU_KVCACHE_SPACE, else 1)",
    )
    dense_weights_memory_gib: float = Field(
        1.0,
        ge=0,
        description="CPU, quantized weights: room (GiB) for de-quantized copies of the "
        "projections and output layer, which steps of many tokens run on where this host "
        "multiplies floats faster than it reads the blocks (timed at load; 0: none)",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="CUDA: share of device memory for the engine, KV included"
    )
    enable_prefix_caching: bool = Field(True, description="reuse cached prefix blocks")
    enforce_eager: bool = Field(False, description="CUDA: no graphs for decode steps")
    enable_chunked_prefill: bool = Field(
        True, description="prefill long prompts over several steps"
    )
    engine_threads: int | None = Field(
        None,
        ge=1,
        description="the engine's CPU threads (offline default: torch's, one per core; a "
        "worker's: all usable cores, but one from four cores on, left to the service; "
        "on a GPU one)",
    )
    watermark: float = Field(
        0.01,
        ge=0,
        lt=1,
        description="share of KV blocks kept free when admitting a sequence, so running "
        "ones can grow without an immediate preemption",
    )
    seed: int = Field(0, description="the engine's random seed (requests without their own)")
    generation_config: str = Field(
        "auto",
        description="where requests' unset sampling fields come from: auto (the model "
        "folder's generation_config.json), vllm (neutral values), or a folder",
    )
    speculative_config: SpeculativeConfig | None = Field(
        None,
        description='speculative decoding, as JSON: \'{"method": "ngram", '
        '"num_speculative_tokens": 4, "prompt_lookup_max": 4}\' or a draft model with the '
        'same vocabulary: \'{"model": "FOLDER", "num_speculative_tokens": 4}\'',
    )
    override_generation_config: dict[str, Any] | None = Field(
        None,
        description='JSON over the generation config, e.g. \'{"temperature": 0.5, '
        '"max_new_tokens": 256}\'',
    )

    @model_validator(mode="after")
    def _draft_without_ranks(self) -> "EngineConfig":
        spec = self.speculative_config
        if self.tensor_parallel_size > 1 and spec is not None and spec.method == "draft_model":
            raise ValueError(
                "a draft model does not run under tensor parallelism yet: use "
                '"method": "ngram", or tensor_parallel_size 1'
            )
        return self

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if device in ("auto", "cpu") or re.fullmatch(r"cuda(:\d+)?", device):
            return device
        raise ValueError(f"device must be one of {DEVICE_CHOICES}; got {device!r}")

    @field_validator("override_generation_config", "speculative_config", mode="before")
    @classmethod
    def _json_text(cls, value: Any) -> Any:
        """A flag gives the override as JSON text."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"not JSON: {error}") from None
        return value

    def resolved(self) -> "EngineConfig":
        """This config with ``auto`` device and dtype settled for this machine."""
        from worker.device import resolve_device, resolve_dtype  # torch

        device = resolve_device(self.device)
        return self.model_copy(
            update={"device": device, "dtype": resolve_dtype(self.dtype, device)}
        )

    def engine_fields(self) -> dict[str, Any]:
        """The engine's knobs of this object (a worker's settings hold more)."""
        return {name: getattr(self, name) for name in EngineConfig.model_fields}

    @property
    def uses_cuda_graphs(self) -> bool:
        """Decode steps replay CUDA graphs (not yet across tensor-parallel ranks)."""
        return (
            self.device.startswith("cuda")
            and not self.enforce_eager
            and self.tensor_parallel_size == 1
        )

    @property
    def torch_dtype(self) -> Any:
        from worker.device import DTYPES  # torch

        return DTYPES[self.dtype]

    @property
    def dense_weights_bytes(self) -> int:
        return int(self.dense_weights_memory_gib * GIB)

    @property
    def cache_torch_dtype(self) -> Any:
        """The KV cache's element type."""
        from worker.device import KV_CACHE_DTYPES  # torch

        return KV_CACHE_DTYPES.get(self.kv_cache_dtype, self.torch_dtype)
