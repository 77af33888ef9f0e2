"""Linear layers over GGUF blocks (Q4_0, Q4_1, Q8_0): the torch reference against the
``gguf`` package's own de-quantization, the native and Triton kernels against the
reference (``quantized_cases`` states the native bound; Triton, which de-quantizes
in registers, is within fp32 summation error)."""

import os
import platform

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from kernels import dispatch
from kernels.quantized_weight import LINEAR_TYPES, QuantizedWeight
from kernels.reference import quantized as reference
from tests.kernels.native_builds import run_built_for
from tests.kernels.quantized_cases import (
    SHAPES,
    activation_bound,
    check_native_against_reference,
    quantized,
)

native_only = pytest.mark.skipif(
    not dispatch._native_builds(), reason="no C++ compiler builds the native kernels here"
)


@pytest.mark.parametrize("ggml_type", LINEAR_TYPES, ids=lambda t: t.name)
def test_reference_dequantizes_as_the_gguf_package(ggml_type: GGMLQuantizationType) -> None:
    weight = quantized(ggml_type, 37, 96)
    expected = quants.dequantize(weight.data.numpy(), ggml_type)
    np.testing.assert_array_equal(reference.dequantize(weight, torch.float32).numpy(), expected)


def test_a_weight_that_does_not_fit_its_blocks_is_refused() -> None:
    data = torch.zeros(4, 20, dtype=torch.uint8)
    with pytest.raises(ValueError, match="cannot hold"):
        QuantizedWeight(GGMLQuantizationType.Q4_1, data, 4, 64)
    with pytest.raises(ValueError, match="no kernel for Q6_K"):
        QuantizedWeight(GGMLQuantizationType.Q6_K, data, 4, 256)


@native_only
def test_native_kernel_is_within_the_activation_rounding_bound() -> None:
    check_native_against_reference()


def test_the_bound_is_tight_enough_to_catch_a_wrong_kernel() -> None:
    """Reading the nibbles in the wrong order (weight j + 16 for weight j) moves most
    outputs by more than the bound allows."""
    weight = quantized(GGMLQuantizationType.Q4_0, 64, 128)
    x = torch.randn(2, 128)
    blocks = weight.data.view(64, -1, 18).clone()
    nibbles = blocks[..., 2:]
    blocks[..., 2:] = (nibbles << 4) | (nibbles >> 4)
    swapped = QuantizedWeight(weight.ggml_type, blocks.view(64, -1), 64, 128)
    right = reference.quantized_linear(x, weight, None)
    error = (reference.quantized_linear(x, swapped, None) - right).abs()
    assert (error > activation_bound(x, weight)).float().mean() > 0.5


@native_only
def test_many_rows_take_the_matmul_path_at_fp32_precision() -> None:
    from kernels.native import quantized as native

    weight = quantized(GGMLQuantizationType.Q4_1, 70, 96)
    x = torch.randn(native.MATMUL_ROWS + 3, 96)
    torch.testing.assert_close(
        native.quantized_linear(x, weight, None), reference.quantized_linear(x, weight, None)
    )


@native_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_packed_weights_take_the_matmul_from_the_rows_they_are_told(dtype) -> None:
    """Below ``matmul_from_rows`` the integer kernel (8-bit activations, within its
    bound); from it, the de-quantized weight times x at the dtype's matmul precision."""
    from kernels.native import quantized as native

    weight = quantized(GGMLQuantizationType.Q4_1, 70, 96)
    packed = native.PackedWeight(weight)
    dense = reference.dequantize(weight, dtype).float()
    tolerance = {torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype]
    torch.manual_seed(0)
    for count in (15, 16, 40):
        x = torch.randn(count, 96).to(dtype)
        exact = x.float() @ dense.T
        for matmul_from in (None, 16):
            actual = native.packed_linear(x, packed, None, matmul_from).float()
            took_matmul = torch.allclose(actual, exact, atol=tolerance, rtol=tolerance)
            # The integer kernel rounds x to 8 bits a block: far outside that tolerance.
            assert took_matmul == (matmul_from is not None and count >= matmul_from)
            slack = exact.abs() / 128 if dtype == torch.bfloat16 else 1e-3
            assert ((actual - exact).abs() <= activation_bound(x, weight) + slack).all()


@native_only
def test_a_head_of_packed_weights_is_their_first_rows() -> None:
    from kernels.native import quantized as native

    weight = quantized(GGMLQuantizationType.Q8_0, 40, 64)
    packed = native.PackedWeight(weight)
    x = torch.randn(3, 64)
    for rows, kept in ((16, 16), (13, 16), (100, 40)):  # whole groups, at most all
        head = packed.head(rows)
        assert head.out_features == kept and head.data.data_ptr() == packed.data.data_ptr()
        whole = native.packed_linear(x, packed, None)
        assert torch.equal(native.packed_linear(x, head, None), whole[:, :kept])


@native_only
def test_leading_dims_are_kept() -> None:
    from kernels.native import quantized as native

    weight = quantized(GGMLQuantizationType.Q8_0, 40, 64)
    assert native.quantized_linear(torch.randn(2, 3, 64), weight, None).shape == (2, 3, 40)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 feature levels")
def test_a_build_without_avx2_is_within_the_bound(tmp_path) -> None:
    """The plain C++ path (no AVX2, no F16C). The AVX2 build is checked with the other
    kernels' (tests/kernels/test_native.py)."""
    script = "from tests.kernels.quantized_cases import check_native_against_reference as c; c()"
    result = run_built_for("x86-64", script, tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("ggml_type", LINEAR_TYPES, ids=lambda t: t.name)
def test_triton_kernel_matches_the_reference(ggml_type: GGMLQuantizationType) -> None:
    pytest.importorskip("triton")
    from kernels.triton_ops.quantized import quantized_linear

    device = torch.device("cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu")
    for out_features, in_features, rows in SHAPES[:5]:
        weight = quantized(ggml_type, out_features, in_features)
        on_device = QuantizedWeight(ggml_type, weight.data.to(device), out_features, in_features)
        x, bias = torch.randn(rows, in_features), torch.randn(out_features)
        actual = quantized_linear(x.to(device), on_device, bias.to(device)).cpu()
        torch.testing.assert_close(
            actual, reference.quantized_linear(x, weight, bias), atol=1e-4, rtol=1e-4
        )
