"""What ``auto`` means for the device and dtype on this machine (imports torch)."""

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# vLLM's names for the fp8 KV cache formats ("fp8" is e4m3, as there).
KV_CACHE_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` as ``bfloat16``: the name logs, metrics and tables show."""
    return str(dtype).removeprefix("torch.")


def cpu_has_bf16_dot_products() -> bool:
    """AVX512-BF16 or AMX: where bf16 matmuls run natively instead of being emulated."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_device(device: str) -> str:
    """``auto``: CUDA when torch sees a GPU, else the CPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    """``auto`` as vLLM means it for the hardware: bf16 on a GPU that has it, else fp16;
    on a CPU bf16 where it has bf16 dot products, else fp32 (emulated bf16 is slower)."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if cpu_has_bf16_dot_products() else "float32"
