"""The native CPU kernels against the torch references and dense attention.

The library is built with the machine's C++ compiler on first use (what a CPU
worker runs by default). Tolerances: fp32 1e-5 (another summation order);
bf16 2e-2 absolute and relative, since the references round intermediate
results to bf16 where the native ops round once.
"""

import logging
import platform

import pytest
import torch
import torch.nn.functional as F

from kernels import dispatch, native, reference
from kernels.native import build
from kernels.native.linear import PackedBf16Weight, bf16_linear, bf16_linear_available
from tests.kernels.native_builds import run_built_for
from tests.kernels.paged_cases import dense_attention, make_case, poison_before_window

if not dispatch._native_builds():
    pytest.skip("no C++ compiler builds the native kernels here", allow_module_level=True)

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]

# (new tokens, context): decodes, a prefill longer than a tile of query tokens,
# a chunk over a cached prefix, contexts ending on a block boundary, one token.
SHAPES = [(1, 13), (21, 21), (3, 19), (1, 16), (1, 1), (17, 40), (1, 70)]


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_size", "block_size"),
    [
        (9, 3, 64, 16),  # SmolLM2's shape: vector path, GQA ratio 3
        (4, 4, 128, 8),  # vector path, ratio 1
        (6, 2, 80, 16),  # a head size the vector path does not take
        (2, 1, 24, 4),  # tiny head and blocks
    ],
)
def test_paged_attention(heads, kv_heads, head_size, block_size, dtype) -> None:
    case = make_case(SHAPES, heads, kv_heads, head_size, block_size, dtype, seed=head_size)
    actual = native.paged_attention(*case.kernel_tensors(), case.scale)
    _close(actual, dense_attention(case), dtype)


def test_paged_attention_reads_strided_query_rows() -> None:
    """The engine passes q as a view into the fused qkv output, rows wider than q."""
    case = make_case(SHAPES, 9, 3, 64, 16, torch.float32)
    wide = torch.randn(case.query.shape[0], 9 + 6, 64)
    wide[:, :9] = case.query
    query = wide[:, :9]
    assert not query.is_contiguous()
    tensors = (query, *case.kernel_tensors()[1:])
    _close(native.paged_attention(*tensors, case.scale), dense_attention(case), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_attention_of_a_pure_decode_batch(dtype) -> None:
    case = make_case([(1, n) for n in (1, 15, 16, 17, 100, 333)], 9, 3, 64, 16, dtype)
    _close(native.paged_attention(*case.kernel_tensors(), case.scale), dense_attention(case), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("heads", "head_size", "value_size"),
    [(4, 40, 32), (16, 576, 512)],  # a tiny model's latent and DeepSeek's
)
def test_paged_attention_reads_values_from_the_keys_own_rows(
    monkeypatch, dtype, heads, head_size, value_size
) -> None:
    """Multi-head latent attention's cache: one row per token, its first features the
    value; the kernel itself takes it (the reference is not called)."""
    monkeypatch.setattr(native.attention, "reference_paged_attention", None)
    case = make_case(SHAPES, heads, 1, head_size, 8, dtype, values_in_keys=value_size)
    _close(native.paged_attention(*case.kernel_tensors(), case.scale), dense_attention(case), dtype)


WINDOW_SHAPES = [(1, 70), (40, 40), (9, 61), (1, 33), (1, 5), (20, 50)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size", [64, 80])
@pytest.mark.parametrize(("sliding_window", "logit_softcap"), [(13, 0.0), (0, 5.0), (16, 3.0)])
def test_paged_attention_with_windows_and_soft_caps(
    dtype, head_size, sliding_window, logit_softcap
) -> None:
    """Blocks wholly before a sequence's window hold NaN (back in the pool): never read."""
    case = make_case(WINDOW_SHAPES, 6, 2, head_size, 8, dtype, seed=5)
    expected = dense_attention(case, sliding_window, logit_softcap)
    if sliding_window:
        poison_before_window(case, sliding_window)
    actual = native.paged_attention(
        *case.kernel_tensors(), case.scale, sliding_window, logit_softcap
    )
    _close(actual, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, with_residual) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 96, generator=gen).to(dtype)
    weight = torch.randn(96, generator=gen).to(dtype)
    residual = torch.randn(7, 96, generator=gen).to(dtype) if with_residual else None
    out, new_residual = native.rms_norm(x, weight, 1e-6, residual)
    expected, expected_residual = reference.rms_norm(x, weight, 1e-6, residual)
    _close(out, expected, dtype)
    if with_residual:
        _close(new_residual, expected_residual, dtype)
    else:
        assert new_residual is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [32, 16])
def test_rotary_embedding_on_views_of_fused_qkv(dtype, is_neox, rotary_dim) -> None:
    gen = torch.Generator().manual_seed(2)
    tokens, heads, kv_heads, head = 5, 4, 2, 32
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head, generator=gen).to(dtype)
    cos_sin = torch.randn(64, rotary_dim, generator=gen)
    positions = torch.tensor([0, 3, 63, 7, 7])
    actual, expected = qkv.clone(), qkv.clone()
    for target, op in ((actual, native.rotary_embedding), (expected, reference.rotary_embedding)):
        q, k, _ = target.split([heads * head, kv_heads * head, kv_heads * head], dim=-1)
        op(positions, q, k, cos_sin, head, is_neox)
    _close(actual, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_tanh_and_mul"])
def test_gated_activations(dtype, op) -> None:
    x = torch.randn(6, 2 * 40, generator=torch.Generator().manual_seed(3)).to(dtype)
    _close(getattr(native, op)(x), getattr(reference, op)(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_cache_skips_padding_slots(dtype) -> None:
    gen = torch.Generator().manual_seed(4)
    kv = torch.randn(4, 2 * 2 * 8, generator=gen).to(dtype)
    key, value = (t.view(4, 2, 8) for t in kv.split(16, dim=-1))  # strided views
    slots = torch.tensor([5, -1, 0, 11])
    caches = [torch.zeros(3, 4, 2, 8, dtype=dtype) for _ in range(4)]
    native.write_kv_cache(key, value, caches[0], caches[1], slots)
    reference.write_kv_cache(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[0].abs().sum() > 0


@pytest.mark.skipif(not bf16_linear_available(), reason="this CPU lacks AVX512-BF16")
@pytest.mark.parametrize("rows", [1, 5, 12, 13, 30])
@pytest.mark.parametrize(("out_features", "with_bias"), [(96, True), (70, False), (33, True)])
def test_bf16_linear_against_fp32_matmul(rows, out_features, with_bias) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, 64, generator=gen).bfloat16()
    bias = torch.randn(out_features, generator=gen).bfloat16() if with_bias else None
    x = torch.randn(rows, 64, generator=gen).bfloat16()
    actual = bf16_linear(x, PackedBf16Weight(weight), bias)
    expected = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    assert actual.shape == (rows, out_features)
    # fp32 accumulation, one rounding to bf16 at the end.
    torch.testing.assert_close(actual.float(), expected, atol=2e-2, rtol=1e-2)


def test_cpu_tensors_run_native_by_default(monkeypatch) -> None:
    monkeypatch.delenv("GENFLEET_KERNELS", raising=False)
    assert dispatch.kernel_backend(torch.device("cpu")) == "native"


def test_a_build_that_fails_falls_back_to_the_references(monkeypatch, tmp_path, caplog) -> None:
    monkeypatch.setenv("GENFLEET_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.delenv("GENFLEET_KERNELS", raising=False)
    caches = (build.load_library, dispatch._native_builds, dispatch._backend)
    for cached in caches:
        cached.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert dispatch.kernel_backend(torch.device("cpu")) == "torch"
        assert "no-such-compiler" in caplog.text
        out, _ = dispatch.rms_norm(torch.ones(1, 4), torch.ones(4), 1e-6)
        assert torch.allclose(out, torch.ones(1, 4), atol=1e-5)
        # Asked for by name, a failed build is an error, not a silent fallback.
        with pytest.raises(build.NativeKernelsUnavailable, match="no-such-compiler"):
            build.load_library()
    finally:
        for cached in caches:
            cached.cache_clear()


def test_the_library_is_built_once_per_source(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("GENFLEET_CACHE_DIR", str(tmp_path))
    build.load_library.cache_clear()
    try:
        build.load_library()
        built = list((tmp_path / "kernels").glob("*.so"))
        assert len(built) == 1
        stamp = built[0].stat().st_mtime_ns
        build.load_library.cache_clear()
        build.load_library()
        assert [p.stat().st_mtime_ns for p in (tmp_path / "kernels").glob("*.so")] == [stamp]
    finally:
        build.load_library.cache_clear()


def test_loading_the_library_leaves_denormals_alone() -> None:
    """A library linked with -ffast-math would switch on flush-to-zero for the process."""
    native.load_library()
    tiny = torch.tensor([1e-40], dtype=torch.float32)  # a float32 denormal
    assert (tiny * 2).item() > 0
    assert 1e-310 * 2 > 0  # Python floats run on the same floating-point unit


BASELINE_CHECK = """
import torch
from kernels import native
from kernels.native.linear import bf16_linear_available
from tests.kernels.paged_cases import dense_attention, make_case, poison_before_window
from tests.kernels.quantized_cases import check_native_against_reference

assert not bf16_linear_available()
for dtype in (torch.float32, torch.bfloat16):
    for cache in (None, torch.float8_e4m3fn, torch.float8_e5m2):
        case = make_case([(1, 40), (21, 21), (3, 19)], 9, 3, 64, 16, dtype, cache_dtype=cache)
        error = (native.paged_attention(*case.kernel_tensors(), case.scale).float()
                 - dense_attention(case).float()).abs().max().item()
        assert error < (1e-4 if dtype == torch.float32 else 2e-2), (dtype, cache, error)
check_native_against_reference()  # the quantized linear kernels' AVX2 path
print("ok")
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 feature levels")
def test_a_build_for_cpus_without_avx512_takes_the_plain_paths(tmp_path) -> None:
    """GENFLEET_NATIVE_MARCH=x86-64-v3 (AVX2): the AVX-512 code is left out, not broken."""
    result = run_built_for("x86-64-v3", BASELINE_CHECK, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_shapes_the_kernels_cannot_take_fail_as_the_references_do() -> None:
    """A weight or cache that does not match the rows goes to the reference, which
    raises, instead of to a kernel that would read or write past the tensor."""
    x = torch.randn(3, 8)
    with pytest.raises(RuntimeError):
        native.rms_norm(x, torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError):
        native.silu_and_mul(torch.randn(3, 7))
    key = torch.randn(2, 2, 8)
    small = [torch.zeros(4, 4, 2, 4) for _ in range(2)]
    with pytest.raises(RuntimeError):
        native.write_kv_cache(key, key, *small, torch.tensor([0, 1]))


def test_bf16_linear_keeps_leading_dims() -> None:
    if not bf16_linear_available():
        pytest.skip("this CPU lacks AVX512-BF16")
    weight = torch.randn(48, 64).bfloat16()
    x = torch.randn(2, 3, 64).bfloat16()
    actual = bf16_linear(x, PackedBf16Weight(weight), None)
    expected = F.linear(x.float(), weight.float())
    assert actual.shape == (2, 3, 48)
    torch.testing.assert_close(actual.float(), expected, atol=2e-2, rtol=1e-2)


def test_a_bf16_linear_runs_on_every_cpu() -> None:
    """Where neither the native kernel nor oneDNN takes bf16 (no AVX512-BF16, no
    AVX-512), the layer falls back to F.linear instead of failing to pack."""
    from worker.models.linear import Linear

    torch.manual_seed(0)
    layer = Linear(64, 48, bias=True).to(torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    expected = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
    layer.pack()
    torch.testing.assert_close(layer(x).float(), expected, atol=0.05, rtol=0.02)
