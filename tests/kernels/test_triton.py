"""Every Triton kernel against its torch reference.

On CPU the kernels run in Triton's interpreter; with ``TRITON_INTERPRET=0``
on a CUDA host (``scripts/gpu_check.py``) they are compiled and run on the
GPU. The default grid is small enough for CI; ``GENFLEET_SLOW_TESTS=1`` adds
a larger sweep. Tolerances per dtype: fp32 1e-4 (the kernels accumulate in a
different order), fp16 2e-3, bf16 2e-2 absolute and relative.
"""

import os

import pytest
import torch

pytest.importorskip("triton")

from kernels import reference, triton_ops
from tests.kernels.paged_cases import dense_attention, make_case, poison_before_window
from tests.kernels.test_experts import _case as _experts_case
from tests.slow import SLOW

TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ON_GPU = os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

# (new tokens, context): decodes, a prefill, a chunk over a cached prefix,
# contexts ending exactly on a block boundary, a context of one token.
SHAPES = [(1, 13), (5, 5), (3, 19), (1, 16), (1, 1), (8, 32)]


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


ATTENTION_GRID = [
    # (heads, kv_heads, head_size, block_size, dtype)
    (4, 4, 64, 16, torch.float32),  # GQA ratio 1
    (6, 2, 64, 8, torch.float16),  # ratio 3
    (8, 2, 64, 32, torch.bfloat16),  # ratio 4
    (6, 2, 80, 16, torch.float32),  # head size that is not a power of two
]
if SLOW:
    ATTENTION_GRID += [
        (heads, kv, head, block, dtype)
        for heads, kv in ((4, 4), (6, 2), (8, 2))
        for head in (64, 80, 96, 128)
        for block in (8, 16, 32)
        for dtype in DTYPES
    ]


@pytest.mark.parametrize(("heads", "kv_heads", "head_size", "block_size", "dtype"), ATTENTION_GRID)
def test_paged_attention(heads, kv_heads, head_size, block_size, dtype) -> None:
    case = make_case(SHAPES, heads, kv_heads, head_size, block_size, dtype, seed=head_size)
    tensors = case.kernel_tensors()
    expected = reference.paged_attention(*tensors, case.scale)
    actual = triton_ops.paged_attention(*(t.to(DEVICE) for t in tensors), case.scale).cpu()
    _close(actual, expected, dtype)
    _close(actual, dense_attention(case), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_reads_values_from_the_keys_own_rows(dtype) -> None:
    """Multi-head latent attention: one KV head, each row's first 32 features its value."""
    case = make_case(SHAPES, 4, 1, 40, 8, dtype, values_in_keys=32)
    tensors = (t.to(DEVICE) for t in case.kernel_tensors())
    _close(triton_ops.paged_attention(*tensors, case.scale).cpu(), dense_attention(case), dtype)


WINDOW_SHAPES = [(1, 70), (40, 40), (9, 61), (1, 33), (1, 5), (20, 50)]


@pytest.mark.parametrize(("sliding_window", "logit_softcap"), [(13, 0.0), (0, 5.0), (16, 3.0)])
def test_paged_attention_with_windows_and_soft_caps(sliding_window, logit_softcap) -> None:
    """Blocks wholly before a sequence's window hold NaN (back in the pool): never read."""
    case = make_case(WINDOW_SHAPES, 6, 2, 64, 8, torch.float32, seed=5)
    expected = dense_attention(case, sliding_window, logit_softcap)
    if sliding_window:
        poison_before_window(case, sliding_window)
    tensors = (t.to(DEVICE) for t in case.kernel_tensors())
    actual = triton_ops.paged_attention(*tensors, case.scale, sliding_window, logit_softcap)
    _close(actual.cpu(), expected, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_cache(dtype) -> None:
    key = torch.randn(5, 3, 24).to(dtype)
    value = torch.randn(5, 3, 24).to(dtype)
    slots = torch.tensor([7, -1, 0, 31, -1])
    caches = [torch.zeros(4, 8, 3, 24, dtype=dtype) for _ in range(2)]
    reference.write_kv_cache(key, value, *caches, slots)
    on_device = [torch.zeros(4, 8, 3, 24, dtype=dtype, device=DEVICE) for _ in range(2)]
    triton_ops.write_kv_cache(key.to(DEVICE), value.to(DEVICE), *on_device, slots.to(DEVICE))
    assert all(torch.equal(a, b.cpu()) for a, b in zip(caches, on_device, strict=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, with_residual) -> None:
    x = torch.randn(7, 100).to(dtype)
    residual = torch.randn(7, 100).to(dtype) if with_residual else None
    weight = torch.randn(100).to(dtype)
    on_device = residual.to(DEVICE) if residual is not None else None
    out, new_residual = triton_ops.rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-5, on_device)
    ref_out, ref_residual = reference.rms_norm(x, weight, 1e-5, residual)
    _close(out.cpu(), ref_out, dtype)
    if with_residual:
        _close(new_residual.cpu(), ref_residual, dtype)
    else:
        assert new_residual is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_embedding(dtype, is_neox) -> None:
    head, heads, kv_heads = 32, 6, 2
    positions = torch.tensor([0, 5, 1, 63, 17])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head))
    freqs = torch.arange(64).float()[:, None] * inv_freq[None, :]
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    # q and k as strided views into one fused projection, as the model produces them.
    sizes = [heads * head, kv_heads * head, kv_heads * head]
    expected = torch.randn(5, sum(sizes)).to(dtype)
    qkv = expected.to(DEVICE)
    q, k, _ = qkv.split(sizes, dim=-1)
    eq, ek, _ = expected.split(sizes, dim=-1)
    triton_ops.rotary_embedding(positions.to(DEVICE), q, k, cache.to(DEVICE), head, is_neox)
    reference.rotary_embedding(positions, eq, ek, cache, head, is_neox)
    _close(qkv.cpu(), expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_tanh_and_mul"])
def test_gated_activations(dtype, op) -> None:
    x = torch.randn(3, 2 * 1500).to(dtype)  # two column blocks, the second partial
    _close(getattr(triton_ops, op)(x.to(DEVICE)).cpu(), getattr(reference, op)(x), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("tokens", "activation"),
    # One token; several per expert; more than a block of rows for some experts.
    [(1, "silu"), (11, "gelu_tanh"), (70, "silu")],
)
def test_fused_experts(dtype, tokens, activation) -> None:
    """The grouped matmuls over pairs sorted by expert (an expert no token chooses
    included) against the reference's loop over experts."""
    case = _experts_case(dtype, tokens)
    actual = triton_ops.fused_experts(*(t.to(DEVICE) for t in case), activation).cpu()
    _close(actual, reference.fused_experts(*case, activation), dtype)
