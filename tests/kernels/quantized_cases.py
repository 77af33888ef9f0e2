"""GGUF-quantized weights for the kernel tests, and the error bound of the native path.

The native kernel rounds each block of 32 activations to 8 bits (scale
max|x_block| / 127), so each product w_k x_k may be off by |w_k| max|x_block| / 254:
the bound below sums that over k. Over re-laid-out weights, steps of 1 or 2 rows
(up to 4 on AVX-512 builds) round x in two parts, the second the first's error
(x ~ d1 q1 + d2 q2, d2 <= d1 / 254): off by at most max|x_block| / 64516 a product.
fp32 summation adds 1e-5 relative; bf16 outputs round once more (2^-8 of the result).
"""

import torch
from gguf import GGMLQuantizationType, quants

from kernels.quantized_weight import LINEAR_TYPES, QuantizedWeight
from kernels.reference import quantized as reference

# (outputs, inputs, rows): odd output counts, one block, many blocks, 1 row and many.
SHAPES = [
    (1, 32, 1), (37, 64, 1), (70, 96, 3), (33, 160, 5), (130, 576, 4), (64, 128, 31),
    (130, 576, 2),
]  # fmt: skip
# Rows of x that every build's packed kernel rounds in two parts.
TWO_PART_ROWS = 2


def quantized(
    ggml_type: GGMLQuantizationType, out_features: int, in_features: int, seed: int = 0
) -> QuantizedWeight:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator)
    data = torch.from_numpy(quants.quantize(weight.numpy(), ggml_type))
    return QuantizedWeight(ggml_type, data, out_features, in_features)


def activation_bound(
    x: torch.Tensor, weight: QuantizedWeight, two_parts: bool = False
) -> torch.Tensor:
    """The most that rounding x to 8 bits per block of 32 (in two parts: about 16) can
    move ``x @ W.T``."""
    rows = x.float().reshape(-1, weight.in_features)
    block_max = rows.abs().view(rows.shape[0], -1, 32).amax(-1, keepdim=True)
    per_element = block_max.expand(-1, -1, 32).reshape(rows.shape)
    dense = per_element @ reference.dequantize(weight, torch.float32).abs().T
    return dense / (64516 if two_parts else 254)


def check_native_against_reference() -> None:
    """Every type, shape and dtype of ``kernels.native.quantized_linear`` within the bound."""
    from kernels.native import quantized as native

    for ggml_type in LINEAR_TYPES:
        for out_features, in_features, rows in SHAPES:
            weight = quantized(ggml_type, out_features, in_features)
            bias = torch.randn(out_features)
            for dtype in (torch.float32, torch.bfloat16):
                x = torch.randn(rows, in_features).to(dtype)
                actual = native.quantized_linear(x, weight, bias.to(dtype)).float()
                # The bias as the kernel is given it (in bf16: rounded by the caller).
                expected = reference.quantized_linear(x.float(), weight, bias.to(dtype).float())
                dense = x.float().abs() @ reference.dequantize(weight, torch.float32).abs().T
                slack = 1e-5 * dense + (expected.abs() / 128 if dtype == torch.bfloat16 else 0)
                excess = (actual - expected).abs() - activation_bound(x, weight) - slack
                assert excess.max() <= 1e-6, (ggml_type.name, rows, dtype, excess.max().item())
                if ggml_type in native.PACKED_TYPES:
                    packed = native.PackedWeight(weight)
                    actual = native.packed_linear(x, packed, bias.to(dtype)).float()
                    two_parts = rows <= TWO_PART_ROWS
                    bound = activation_bound(x, weight, two_parts)
                    excess = (actual - expected).abs() - bound - slack
                    assert excess.max() <= 1e-6, ("packed", ggml_type.name, rows, dtype)
                    rows_out = torch.empty(out_features * in_features, dtype=dtype)
                    whole = packed.dequantize_rows(0, out_features, rows_out)
                    assert torch.equal(whole, reference.dequantize(weight, dtype))
                    index = torch.tensor([out_features - 1, 0, out_features // 2, 0])
                    assert torch.equal(packed.rows(index, dtype), whole[index])
                dequantized = native.dequantize(weight, dtype)
                assert torch.equal(dequantized, reference.dequantize(weight, dtype))
