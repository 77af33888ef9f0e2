"""An fp8 KV cache (vLLM's ``kv_cache_dtype`` fp8 / fp8_e4m3 / fp8_e5m2) in every
implementation of the two ops that touch it.

Writing rounds each value to the format as torch's conversion does (e4m3fn
saturates at +-448): at most 2^-4 of the value for e4m3 (3 mantissa bits) and 2^-3
for e5m2 (2 bits) in their normal ranges. Reading widens exactly, so attention over
an fp8 cache must equal dense attention over the rounded K and V within the
implementation's own fp32 (or bf16) tolerance.
"""

import os

import pytest
import torch

from kernels import dispatch, reference
from tests.kernels.paged_cases import dense_attention, make_case

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
RELATIVE_ERROR = {torch.float8_e4m3fn: 2**-4, torch.float8_e5m2: 2**-3}
LARGEST = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def _implementations() -> list:
    found = [pytest.param(reference, id="torch")]
    if dispatch._native_builds():
        from kernels import native

        found.append(pytest.param(native, id="native"))
    try:
        from kernels import triton_ops

        found.append(pytest.param(triton_ops, id="triton"))
    except ImportError:
        pass
    return found


IMPLEMENTATIONS = _implementations()
ON_GPU = os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _native_never_falls_back(monkeypatch, request) -> None:
    """The native implementation must run its own fp8 code, not the torch reference."""
    if "native" not in request.node.name:
        return
    from kernels.native import attention, layer_ops

    def refuse(*args: object) -> None:
        raise AssertionError("the native op fell back to the torch reference")

    monkeypatch.setattr(attention, "reference_paged_attention", refuse)
    monkeypatch.setattr(layer_ops.reference, "write_kv_cache", refuse)


def _device(ops) -> torch.device:
    return torch.device("cuda" if ON_GPU and ops.__name__.endswith("triton_ops") else "cpu")


@pytest.mark.parametrize("ops", IMPLEMENTATIONS)
@pytest.mark.parametrize("fp8", FP8.values(), ids=FP8.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_rounds_each_value_to_the_format(ops, fp8, dtype) -> None:
    device = _device(ops)
    gen = torch.Generator().manual_seed(0)
    key = (torch.randn(7, 2, 64, generator=gen) * 30).to(dtype)
    key[0, 0, :4] = torch.tensor([1000.0, -1000.0, 0.0, 1e-3])  # saturation, zero, tiny
    value = torch.randn(7, 2, 64, generator=gen).to(dtype)
    slots = torch.tensor([3, 0, -1, 17, 9, 30, 12])  # -1: padding, skipped
    caches = [torch.zeros(4, 8, 2, 64, dtype=fp8, device=device) for _ in range(2)]
    ops.write_kv_cache(key.to(device), value.to(device), *caches, slots.to(device))
    for new, cache in ((key, caches[0]), (value, caches[1])):
        stored = cache.float().cpu().view(-1, 2, 64)
        written = slots >= 0
        expected = new[written].to(fp8).float()
        assert torch.equal(stored[slots[written]], expected)
        assert not stored[[1, 2, 4]].any()  # slots no token names stay empty
        size = new[written].float().abs()
        normal = (size > 0.1) & (size <= LARGEST[fp8])
        error = (expected - new[written].float()).abs()
        limit = RELATIVE_ERROR[fp8] * size
        assert (error[normal] <= limit[normal]).all()


@pytest.mark.parametrize("ops", IMPLEMENTATIONS)
@pytest.mark.parametrize("fp8", FP8.values(), ids=FP8.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_reads_an_fp8_cache_exactly(ops, fp8, dtype) -> None:
    device = _device(ops)
    case = make_case([(1, 40), (21, 21), (3, 19)], 8, 2, 64, 16, dtype, cache_dtype=fp8)
    tensors = [t.to(device) for t in case.kernel_tensors()]
    actual = ops.paged_attention(*tensors, case.scale).float().cpu()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual, dense_attention(case).float(), atol=tol, rtol=tol)


@pytest.mark.skipif(not dispatch._native_builds(), reason="no C++ compiler here")
@pytest.mark.parametrize("fp8", FP8.values(), ids=FP8.keys())
def test_native_rounding_is_torchs_bit_for_bit(fp8) -> None:
    """A million values from far below the formats' subnormals to far past their range."""
    from kernels import native

    gen = torch.Generator().manual_seed(1)
    scales = (1e-5, 1e-3, 1e-1, 1.0, 30.0, 300.0, 1e4, 1e6)
    values = torch.cat([torch.randn(131072, generator=gen) * s for s in scales]).view(-1, 1, 64)
    caches = [torch.zeros(values.shape[0], 1, 1, 64, dtype=fp8) for _ in range(2)]
    native.write_kv_cache(values, values, *caches, torch.arange(values.shape[0]))
    expected = values.to(fp8).view(torch.uint8)
    assert torch.equal(caches[0].view(torch.uint8).view(expected.shape), expected)
