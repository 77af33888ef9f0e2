"""Engine settings: the knobs of vLLM's engine arguments that apply here."""

import re
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"


def cpu_has_bf16_dot_products() -> bool:
    """AVX512-BF16 or AMX: where bf16 matmuls run natively instead of being emulated."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_device(device: str) -> str:
    """``auto``: CUDA when torch sees a GPU, else the CPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" or re.fullmatch(r"cuda(:\d+)?", device):
        return device
    raise ValueError(f"device must be one of {DEVICE_CHOICES}; got {device!r}")


def resolve_dtype(dtype: str, device: str) -> str:
    """``auto`` as vLLM means it for the hardware: bf16 on a GPU that has it, else fp16;
    on a CPU bf16 where it has bf16 dot products, else fp32 (emulated bf16 is slower)."""
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}; got {dtype!r}")
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if cpu_has_bf16_dot_products() else "float32"


@dataclass
class EngineConfig:
    """Everything the engine needs to start.

    ``model`` is a Hugging Face model folder or the name of a model that
    ``genfleet model fetch`` knows. The KV cache gets ``num_gpu_blocks_override``
    blocks when set, otherwise as many as fit in ``kv_cache_memory_gib``.
    ``device`` and ``dtype`` may be ``auto`` (``resolve_device``, ``resolve_dtype``);
    after construction they name what was chosen.
    """

    model: str = "SmolLM2-135M-Instruct"
    dtype: str = "float32"
    device: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    block_size: int = 16
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_gib: float = 1.0  # the CPU's KV budget
    # On CUDA: the share of the device's memory this engine may take, KV cache included.
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    # On CUDA decode steps replay captured graphs unless this is set (as in vLLM).
    enforce_eager: bool = False
    enable_chunked_prefill: bool = True
    # torch's intra-op threads in this process (None: torch's default, one per core).
    cpu_threads: int | None = None
    # Fraction of blocks kept free when admitting a new sequence, so running
    # sequences can still grow without an immediate preemption.
    watermark: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        self.device = resolve_device(self.device)
        self.dtype = resolve_dtype(self.dtype, self.device)
        positive = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
        }
        if self.cpu_threads is not None:
            positive["cpu_threads"] = self.cpu_threads
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")

    @property
    def uses_cuda_graphs(self) -> bool:
        return self.device.startswith("cuda") and not self.enforce_eager

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
