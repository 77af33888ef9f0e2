"""Rotary position embedding, in place on q and k; one program per token."""

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    x_ptr, stride_t, token, num_heads, cos, sin,
    HEAD_SIZE: tl.constexpr,
    HALF: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
    IS_NEOX: tl.constexpr,
):  # fmt: skip
    heads = tl.arange(0, HEADS_PAD)[:, None]
    pairs = tl.arange(0, HALF_PAD)[None, :]
    mask = (heads < num_heads) & (pairs < HALF)
    base = x_ptr + token * stride_t + heads * HEAD_SIZE
    if IS_NEOX:  # pair i is (i, i + half)
        first = base + pairs
        second = base + pairs + HALF
    else:  # GPT-J: pair i is (2i, 2i + 1)
        first = base + 2 * pairs
        second = base + 2 * pairs + 1
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(second, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(second, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,  # [num_tokens]
    query_ptr,  # [num_tokens, num_heads * head_size]
    key_ptr,  # [num_tokens, num_kv_heads * head_size]
    cos_sin_ptr,  # [max_position, rotary_dim]: cos | sin
    stride_qt, stride_kt, stride_cs,
    num_heads, num_kv_heads,
    HEAD_SIZE: tl.constexpr,
    HALF: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
    IS_NEOX: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0)
    position = tl.load(positions_ptr + token).to(tl.int64)
    pairs = tl.arange(0, HALF_PAD)[None, :]
    row = cos_sin_ptr + position * stride_cs
    cos = tl.load(row + pairs, mask=pairs < HALF, other=1.0).to(tl.float32)
    sin = tl.load(row + HALF + pairs, mask=pairs < HALF, other=0.0).to(tl.float32)
    _rotate_heads(
        query_ptr, stride_qt, token, num_heads, cos, sin,
        HEAD_SIZE, HALF, HEADS_PAD, HALF_PAD, IS_NEOX,
    )  # fmt: skip
    _rotate_heads(
        key_ptr, stride_kt, token, num_kv_heads, cos, sin,
        HEAD_SIZE, HALF, KV_HEADS_PAD, HALF_PAD, IS_NEOX,
    )  # fmt: skip


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool = True,
) -> None:
    """Same contract as ``kernels.reference.rotary_embedding``."""
    num_tokens = positions.shape[0]
    if num_tokens == 0:
        return
    # Heads must be contiguous within a token; tokens may be strided (views into qkv).
    q2 = query.view(num_tokens, -1)
    k2 = key.view(num_tokens, -1)
    assert q2.stride(1) == 1 and k2.stride(1) == 1, "rotary needs contiguous heads"
    num_heads = q2.shape[1] // head_size
    num_kv_heads = k2.shape[1] // head_size
    half = cos_sin_cache.shape[-1] // 2
    _rotary_kernel[(num_tokens,)](
        positions, q2, k2, cos_sin_cache,
        q2.stride(0), k2.stride(0), cos_sin_cache.stride(0),
        num_heads, num_kv_heads,
        HEAD_SIZE=head_size,
        HALF=half,
        HEADS_PAD=triton.next_power_of_2(num_heads),
        KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HALF_PAD=triton.next_power_of_2(half),
        IS_NEOX=is_neox,
    )  # fmt: skip
