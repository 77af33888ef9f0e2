"""Section 5 of ``gpu_check.py``: paged attention's memory bandwidth against the
device's spec peak, a measured copy, and ``scaled_dot_product_attention``."""

import gc
from functools import partial

import torch

# Spec sheet HBM bandwidth, bytes/s, by a substring of the device name.
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L40S": 0.864e12}


def _bandwidth_row(case: str, kernel: str, ms: float, nbytes: int, peak: float | None,
                   copy_bw: float) -> str:  # fmt: skip
    bw = nbytes / (ms / 1e3)
    spec = f"{bw / peak:.0%}" if peak else "n/a"
    return f"| {case} | {kernel} | {ms:.3f} | {bw / 1e9:.0f} | {spec} | {bw / copy_bw:.0%} |"


def _attention_case(batch: int, q_len: int, ctx: int, device, dtype) -> tuple[dict, dict, int]:
    """Paged inputs for the Triton kernel, dense ones for SDPA, and the bytes either must move."""
    heads, kv_heads, head, block = ATTENTION_SHAPE
    blocks_per_seq = ctx // block
    num_blocks = batch * blocks_per_seq
    key_cache = torch.randn(num_blocks, block, kv_heads, head, dtype=dtype, device=device)
    value_cache = torch.randn_like(key_cache)
    # Scattered blocks, as after many allocations and frees.
    block_tables = torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq)
    query = torch.randn(batch * q_len, heads, head, dtype=dtype, device=device)
    paged = {
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_tables": block_tables.to(torch.int32),
        "seq_lens": torch.full((batch,), ctx, dtype=torch.int64, device=device),
        "query_start_loc": torch.arange(batch + 1, device=device) * q_len,
        "scale": head**-0.5,
    }
    dense_k = key_cache[block_tables].view(batch, ctx, kv_heads, head).transpose(1, 2)
    dense = {
        "query": query.view(batch, q_len, heads, head).transpose(1, 2).contiguous(),
        "key": dense_k.contiguous(),
        "value": torch.randn_like(dense_k).contiguous(),
        "is_causal": q_len > 1,
        "scale": head**-0.5,
        "enable_gqa": True,
    }
    nbytes = 2 * key_cache.numel() * key_cache.element_size() + 2 * query.numel() * 2
    return paged, dense, nbytes


# heads, kv heads, head size, block size: a Llama-3-8B-like layer.
ATTENTION_SHAPE = (32, 8, 128, 16)
CASES = (("decode b64 ctx16k", 64, 1, 16384), ("decode b64 ctx2k", 64, 1, 2048),
         ("prefill b4 2k", 4, 2048, 2048))  # fmt: skip


def bandwidth() -> str:
    import torch.nn.functional as F
    from triton.testing import do_bench

    from kernels import triton_ops

    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    peak = next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None)
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() / (do_bench(partial(dst.copy_, src)) / 1e3)
    del src, dst
    rows = [
        "| case | kernel | ms | GB/s | of spec peak | of copy peak |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for case, batch, q_len, ctx in CASES:
        paged, dense, nbytes = _attention_case(batch, q_len, ctx, device, torch.bfloat16)
        paged_ms = do_bench(partial(triton_ops.paged_attention, **paged))
        sdpa_ms = do_bench(partial(F.scaled_dot_product_attention, **dense))
        rows.append(_bandwidth_row(case, "triton paged", paged_ms, nbytes, peak, copy_bw))
        rows.append(_bandwidth_row(case, "SDPA dense", sdpa_ms, nbytes, peak, copy_bw))
        gc.collect()
        torch.cuda.empty_cache()
    heads, kv_heads, head, block = ATTENTION_SHAPE
    header = (
        f"spec peak {(peak or 0) / 1e9:.0f} GB/s; measured copy {copy_bw / 1e9:.0f} GB/s; "
        f"bf16, {heads} heads, {kv_heads} KV heads, head size {head}, block size {block}"
    )
    return "\n".join([header, "", *rows])
