"""Engine settings: the knobs of vLLM's engine arguments that apply here."""

from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EngineConfig:
    """Everything the engine needs to start.

    ``model`` is a Hugging Face model folder or the name of a model that
    ``genfleet model fetch`` knows. The KV cache gets ``num_gpu_blocks_override``
    blocks when set, otherwise as many as fit in ``kv_cache_memory_gib``.
    """

    model: str = "SmolLM2-135M-Instruct"
    dtype: str = "float32"
    device: str = "cpu"
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    block_size: int = 16
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_gib: float = 1.0
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    # Fraction of blocks kept free when admitting a new sequence, so running
    # sequences can still grow without an immediate preemption.
    watermark: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        positive = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
