"""Linear layers whose weights are re-laid out once for the CPU.

On CPU hosts the small-batch matmuls of decoding are a stream over the
weights, and the plain row-major weight is not the fastest way to read them:
- bf16 on a CPU with AVX512-BF16: the native kernel's streaming layout
  (``kernels.native.linear``): 2.4x oneDNN at one row, about equal at 512;
- otherwise oneDNN's blocked layout, 1.5x (bf16) to 2x (fp32) ``F.linear``.
The packed copy is made after the weights are loaded; on other devices, or
where neither applies, the layer is a plain ``nn.Linear``. A layer loaded from
GGUF blocks (``use_quantized``) holds only those and runs ``quantized_linear``;
on CPU hosts its blocks are re-laid out for the native kernel that advances 8
rows at once (2.4x the blocks as stored, at one row), and the stored form is
dropped. Its steps of many rows (a prefill chunk) can instead de-quantize the
blocks a tile at a time and multiply floats; where that begins is timed once
per model (``tiles_from_rows``): in bf16 from about 192 rows on an AMX core, from
512-1,024 on an AVX512-BF16 one without AMX; in fp32 from about 384 on AVX2 alone,
never with VNNI.

Such a layer can also hold a de-quantized copy of its weight in the activation
dtype (``keep_dense``), re-laid out as a float weight is: where this host
multiplies floats faster than the integer kernel reads blocks, steps of many
rows (a prefill chunk, a large decode batch) take it and skip de-quantizing
tiles per step. Where that begins is timed once per model (``dense_from_rows``):
it differs by CPU (dense from 8 rows on an AVX512-BF16 core without AMX; on an
AMX one the blocks beat the bf16 kernel at 64 rows; never in fp32 with VNNI).
Both timings take the same rule (``first_faster_rows``).
"""

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kernels import (
    PackedLinear,
    pack_bf16_weight,
    pack_quantized_weight,
    packed_quantized_linear,
    quantized_linear,
)
from kernels.quantized_weight import QuantizedWeight

if TYPE_CHECKING:
    from kernels import PackedWeight

# oneDNN picks its blocking for this batch size; decode batches are about this big.
PACK_BATCH_HINT = 32

# Rows at which a layer's two CPU forms are timed against each other: a step's
# tokens, from a decode batch to a prefill chunk. Timed with the weight in cache,
# which flatters the dense form at few rows (a decode step streams it from memory,
# four times the blocks' bytes in bf16), so the ladder starts at 8 rows.
CALIBRATION_ROWS = (8, 16, 32, 64, 128, 256)
# Rows at which the blocks' integer kernel and de-quantized tiles are timed: up to a
# prefill chunk's, since where a matmul overtakes the kernel differs by CPU and dtype
# (fp32 on AVX2 alone: level at 384 and 512 rows, 1.10-1.19x ahead from 768;
# docs/benchmarks.md, "Quantized weights").
TILE_CALIBRATION_ROWS = (16, 32, 64, 128, 256, 512, 1024)
# Output rows of the weight the tiles are timed on: both forms' time grows with them
# alike, and a vocabulary's 49,152 would add seconds to every load.
TILE_CALIBRATION_OUT_FEATURES = 2048
NEVER = 1 << 62


def _onednn(weight: torch.Tensor) -> PackedLinear | None:
    if not torch.backends.mkldnn.is_available():
        return None
    if weight.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None  # oneDNN refuses bf16 without AVX-512 (or AVX-NE-CONVERT): F.linear

    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)
    return lambda x, bias: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack_for_cpu(weight: torch.Tensor) -> PackedLinear | None:
    """The fastest re-laid-out form of ``weight`` for this host, or None (use ``F.linear``)."""
    if weight.device.type != "cpu":
        return None
    return pack_bf16_weight(weight) or _onednn(weight)


def first_faster_rows(times: Mapping[int, tuple[float, float]]) -> int:
    """From rows -> (one form's time, another's): the fewest rows from which the other
    form was faster at every larger count too; ``NEVER`` if not at the largest."""
    first = NEVER
    for rows in sorted(times, reverse=True):
        one, other = times[rows]
        if other >= one:
            break
        first = rows
    return first


def faster_from_rows(
    one: PackedLinear, other: PackedLinear, x_row: torch.Tensor, ladder: tuple[int, ...]
) -> int:
    """The rows from which ``other`` beats ``one`` on this host (``first_faster_rows``
    over ``ladder``, each form's best of three, taken in turn); timed from the most
    rows down, and no further than where ``other`` stops being faster."""
    times: dict[int, tuple[float, float]] = {}
    for rows in sorted(ladder, reverse=True):
        x = x_row.expand(rows, -1).contiguous()
        best = [float("inf"), float("inf")]
        for _ in range(3):
            for form, layer in enumerate((one, other)):
                began = time.perf_counter()
                layer(x, None)
                best[form] = min(best[form], time.perf_counter() - began)
        times[rows] = (best[0], best[1])
        if best[1] >= best[0]:
            break
    return first_faster_rows(times)


def dense_from_rows(blocks: PackedLinear, dense: PackedLinear, x_row: torch.Tensor) -> int:
    """The rows from which a de-quantized copy beats the blocks (as they run many rows)."""
    return faster_from_rows(blocks, dense, x_row, CALIBRATION_ROWS)


def tiles_from_rows(blocks: "PackedWeight", x_row: torch.Tensor) -> int:
    """The rows from which de-quantizing ``blocks`` a tile at a time per step beats
    their integer kernel (timed on their first rows)."""
    blocks = blocks.head(TILE_CALIBRATION_OUT_FEATURES)

    def integer(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return packed_quantized_linear(x, blocks, bias)

    def tiles(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return packed_quantized_linear(x, blocks, bias, matmul_from_rows=0)

    return faster_from_rows(integer, tiles, x_row, TILE_CALIBRATION_ROWS)


class Linear(nn.Linear):
    packed: PackedLinear | None = None
    quantized: QuantizedWeight | None = None
    # The re-laid-out blocks behind ``packed``, and a float copy for many rows.
    blocks: "PackedWeight | None" = None
    dense: PackedLinear | None = None
    dense_from: int = NEVER
    dense_nbytes = 0
    # Rows from which a step without the copy de-quantizes the blocks tile by tile.
    tiles_from: int = NEVER
    # How the weight is held when not as a parameter: GGML format name and bytes.
    stored_as: tuple[str, int] | None = None

    def use_quantized(self, weight: QuantizedWeight) -> None:
        """Serve from ``weight``'s blocks; the float weight is dropped."""
        self.quantized = weight
        self.stored_as = (weight.ggml_type.name, weight.nbytes)
        self.register_parameter("weight", None)

    def pack(self) -> None:
        if self.quantized is None:
            self.packed = pack_for_cpu(self.weight)
            return
        packed = pack_quantized_weight(self.quantized)
        if packed is not None:
            # ``tiles_from`` is read at each call (timed after packing).
            self.blocks = packed
            self.packed = lambda x, bias: packed_quantized_linear(x, packed, bias, self.tiles_from)
            self.quantized = None  # the packed copy holds the same bytes

    def dense_bytes(self, dtype: torch.dtype) -> int:
        """What ``keep_dense`` would take; 0 for a layer without re-laid-out blocks."""
        if self.blocks is None:
            return 0
        return self.out_features * self.in_features * dtype.itemsize

    def keep_dense(self, dtype: torch.dtype) -> None:
        """Also hold the blocks de-quantized to ``dtype``, for steps from ``dense_from`` rows."""
        assert self.blocks is not None
        n, k = self.out_features, self.in_features
        weight = self.blocks.dequantize_rows(0, n, torch.empty(n * k, dtype=dtype))
        self.dense = pack_for_cpu(weight) or (lambda x, bias: F.linear(x, weight, bias))
        self.dense_nbytes = self.dense_bytes(dtype)

    def drop_dense(self) -> None:
        self.dense, self.dense_from, self.dense_nbytes = None, NEVER, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense is not None and x.numel() >= self.dense_from * self.in_features:
            return self.dense(x, self.bias)
        if self.quantized is not None:
            return quantized_linear(x, self.quantized, self.bias)
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return self.packed(x, self.bias)


def time_tiles(block_layers: list[Linear], dtype: torch.dtype) -> int:
    """Set the block layers' ``tiles_from`` as timed on the largest of them; the rows."""
    if not block_layers:
        return NEVER
    largest = max(block_layers, key=lambda layer: layer.out_features * layer.in_features)
    assert largest.blocks is not None
    rows = tiles_from_rows(largest.blocks, torch.ones(1, largest.in_features, dtype=dtype))
    for layer in block_layers:
        layer.tiles_from = rows
    return rows


@dataclass(frozen=True)
class DenseCopies:
    """What ``keep_dense_copies`` kept: layers, bytes, and the rows they serve from."""

    layers: int
    bytes: int
    from_rows: int


def keep_dense_copies(linears: list[Linear], dtype: torch.dtype, budget: int) -> DenseCopies:
    """De-quantized copies of block layers, in order, while they fit in ``budget``
    bytes; none where the host, timed on the largest of them, never multiplies the
    copy faster than it reads the blocks."""
    chosen: list[Linear] = []
    for layer in linears:
        size = layer.dense_bytes(dtype)
        if 0 < size <= budget:
            budget -= size
            chosen.append(layer)
    if not chosen:
        return DenseCopies(0, 0, NEVER)
    largest = max(chosen, key=lambda layer: layer.dense_bytes(dtype))
    largest.keep_dense(dtype)
    assert largest.packed is not None and largest.dense is not None
    # Ones, not random rows: the kernels' time does not depend on the values, and a
    # load must not move torch's random state (seeded sampling).
    x_row = torch.ones(1, largest.in_features, dtype=dtype)
    rows = dense_from_rows(largest.packed, largest.dense, x_row)
    if rows == NEVER:
        largest.drop_dense()
        return DenseCopies(0, 0, NEVER)
    for layer in chosen:
        if layer.dense is None:
            layer.keep_dense(dtype)
        layer.dense_from = rows
    return DenseCopies(len(chosen), sum(layer.dense_nbytes for layer in chosen), rows)


@dataclass(frozen=True)
class BlockForms:
    """How a part's block layers run many rows: de-quantized tiles from ``tiles_from``
    rows, and the copies kept (taken first, where both apply)."""

    block_layers: int
    tiles_from: int
    copies: DenseCopies


def choose_block_forms(linears: list[Linear], dtype: torch.dtype, budget: int) -> BlockForms:
    """Time tiles, then keep copies within ``budget`` bytes, timed against the blocks
    as they then run."""
    block_layers = [layer for layer in linears if layer.blocks is not None]
    tiles_from = time_tiles(block_layers, dtype)
    copies = keep_dense_copies(block_layers, dtype, budget)
    return BlockForms(len(block_layers), tiles_from, copies)
