"""How block layers run many rows: de-quantized tiles per step, and de-quantized copies
(``dense_weights_memory_gib``) kept within the budget and counted in the weights'
bytes; each taken only from the rows the load timed it faster at, and as exact as the
de-quantized weight in the activation dtype."""

import time

import pytest
import torch
from gguf import GGMLQuantizationType

from kernels import dequantize, dispatch
from tests.conftest import build_tiny_model
from tests.worker.models.gguf_files import write_gguf
from worker import LLM
from worker.models import linear
from worker.models.footprint import weight_footprint
from worker.models.linear import NEVER, Linear, first_faster_rows
from worker.models.loader import load_model

native_only = pytest.mark.skipif(
    not dispatch._native_builds(), reason="no C++ compiler builds the native kernels here"
)
MiB = 1 << 20


@pytest.mark.parametrize(
    ("dense_faster_at", "expected"),
    [
        ({8, 16, 32, 64, 128, 256}, 8),
        ({64, 128, 256}, 64),
        ({16, 256}, 256),  # faster at 16 but not at 32: only from 256 on
        ({8, 16, 32}, NEVER),  # slower at the largest rows: never
        (set(), NEVER),
    ],
)
def test_a_form_serves_from_the_rows_where_it_stays_faster(
    dense_faster_at: set[int], expected: int
) -> None:
    times = {
        rows: (1.0, 0.5 if rows in dense_faster_at else 2.0) for rows in linear.CALIBRATION_ROWS
    }
    assert first_faster_rows(times) == expected


def test_the_timing_finds_the_rows_where_the_copy_gets_ahead() -> None:
    """Stand-ins whose time is known: the blocks 0.1 ms a row, the copy 2.5 ms a call,
    so the copy is ahead from 32 rows of the ladder on."""

    def blocks(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        time.sleep(x.shape[0] * 1e-4)
        return x

    def dense(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        time.sleep(2.5e-3)
        return x

    assert linear.dense_from_rows(blocks, dense, torch.ones(1, 4)) == 32


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("dense")
    model = build_tiny_model("llama-untied", root / "source")
    return str(write_gguf(model, root / "gguf" / "model.gguf", GGMLQuantizationType.Q4_1))


def _projections(model: torch.nn.Module) -> list[Linear]:
    return [m for m in model.model.layers.modules() if isinstance(m, Linear)]


def _load(
    path: str, dtype: torch.dtype, budget: int, monkeypatch, from_rows: int = 16,
    tiles_from: int = NEVER,
):  # fmt: skip
    monkeypatch.setattr(linear, "dense_from_rows", lambda *_: from_rows)
    monkeypatch.setattr(linear, "tiles_from_rows", lambda *_: tiles_from)
    return load_model(path, dtype, torch.device("cpu"), 512, dense_weights_bytes=budget)


@native_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_copies_fill_the_budget_in_order_and_no_further(gguf_path, monkeypatch, dtype) -> None:
    blocks_only = _load(gguf_path, dtype, 0, monkeypatch)
    layers = _projections(blocks_only)
    sizes = [layer.dense_bytes(dtype) for layer in layers]
    assert all(size > 0 for size in sizes) and all(layer.dense is None for layer in layers)
    budget = sum(sizes[:3])  # the first three fit exactly, then none
    model = _load(gguf_path, dtype, budget, monkeypatch)
    assert [layer.dense is not None for layer in _projections(model)] == [
        i < 3 for i in range(len(sizes))
    ]
    assert all(layer.dense_from == 16 for layer in _projections(model) if layer.dense)
    # The engine's reported weights (logs, metrics) count the copies.
    added = weight_footprint(model).bytes - weight_footprint(blocks_only).bytes
    assert added == budget


@native_only
def test_copies_are_dropped_where_the_blocks_are_never_slower(gguf_path, monkeypatch) -> None:
    model = _load(gguf_path, torch.bfloat16, 64 * MiB, monkeypatch, from_rows=NEVER)
    assert all(layer.dense is None for layer in _projections(model))


@native_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rows_from_the_threshold_are_the_dequantized_weight_exactly(
    gguf_path, monkeypatch, dtype
) -> None:
    """From ``dense_from`` rows the layer is ``x @ W.T`` with W the blocks de-quantized to
    ``dtype`` (no 8-bit activations); below it, the integer kernel as before."""
    layer = _projections(_load(gguf_path, dtype, 64 * MiB, monkeypatch))[-1]
    blocks = _projections(_load(gguf_path, dtype, 0, monkeypatch))[-1]
    assert blocks.blocks is not None
    weight = torch.empty(layer.out_features * layer.in_features, dtype=dtype)
    weight = blocks.blocks.dequantize_rows(0, layer.out_features, weight)
    torch.manual_seed(0)
    many, few = torch.randn(16, layer.in_features), torch.randn(15, layer.in_features)
    exact = torch.nn.functional.linear(many.to(dtype).float(), weight.float())
    tolerance = {torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype]  # the product's rounding
    torch.testing.assert_close(layer(many.to(dtype)).float(), exact, rtol=tolerance, atol=tolerance)
    assert torch.equal(layer(few.to(dtype)), blocks(few.to(dtype)))
    # The blocks' 8-bit activations give other numbers: the copy did the 16 rows.
    assert not torch.equal(layer(many.to(dtype)), blocks(many.to(dtype)))


def test_the_gguf_weights_are_what_the_copy_holds(gguf_path, monkeypatch) -> None:
    """Guards the test above: the re-laid-out blocks de-quantize as the stored ones."""
    monkeypatch.setenv("GENFLEET_KERNELS", "torch")
    stored = _projections(load_model(gguf_path, torch.float32, torch.device("cpu"), 512))[-1]
    assert stored.quantized is not None and stored.dense is None  # no copies off the native path
    monkeypatch.delenv("GENFLEET_KERNELS")
    if not dispatch._native_builds():
        pytest.skip("no C++ compiler builds the native kernels here")
    packed = _projections(_load(gguf_path, torch.float32, 0, monkeypatch))[-1]
    assert packed.blocks is not None
    rows = torch.empty(packed.out_features * packed.in_features)
    rows = packed.blocks.dequantize_rows(0, packed.out_features, rows)
    assert torch.equal(rows, dequantize(stored.quantized, torch.float32))


@native_only
def test_the_engine_keeps_copies_within_its_setting(gguf_path, monkeypatch) -> None:
    monkeypatch.setattr(linear, "dense_from_rows", lambda *_: 8)
    without = LLM(gguf_path, dense_weights_memory_gib=0).engine
    with_copies = LLM(gguf_path).engine  # the default budget holds the tiny model's copies
    model = with_copies.runner.model
    layers = [*_projections(model), model.output_layer()]
    assert all(layer.dense is not None and layer.dense_from == 8 for layer in layers)
    assert all(layer.dense is None for layer in _projections(without.runner.model))
    added = with_copies.weights.bytes - without.weights.bytes
    assert added == sum(layer.dense_nbytes for layer in layers) > 0


@native_only
def test_the_tied_output_layer_is_timed_on_its_own_over_the_embeddings_blocks(
    tmp_path, monkeypatch
) -> None:
    """The output layer sees only a step's sampled rows and its shape is unlike the
    projections': its copy is timed apart. Tied, it runs on the embedding's blocks
    (not a second copy of them, nor counted twice)."""
    source = build_tiny_model("llama-tied", tmp_path / "source")
    path = str(write_gguf(source, tmp_path / "gguf" / "model.gguf", GGMLQuantizationType.Q4_1))
    timed = iter([16, 64])  # the projections' timing, then the output layer's
    monkeypatch.setattr(linear, "dense_from_rows", lambda *_: next(timed))
    dtype = torch.bfloat16
    model = load_model(path, dtype, torch.device("cpu"), 512, dense_weights_bytes=64 * MiB)
    output, embedding = model.output_layer(), model.model.embed_tokens
    assert all(layer.dense_from == 16 for layer in _projections(model))
    assert output is not None and output.dense_from == 64 and output.dense is not None
    assert output.blocks is not None and output.blocks is embedding.packed
    assert output.stored_as is None and not list(output.parameters())
    n, k = output.out_features, output.in_features
    weight = output.blocks.dequantize_rows(0, n, torch.empty(n * k, dtype=dtype)).float()
    torch.manual_seed(0)
    many, few = torch.randn(64, k).to(dtype), torch.randn(63, k).to(dtype)
    exact = torch.nn.functional.linear(many.float(), weight)
    torch.testing.assert_close(model.compute_logits(many), exact, rtol=3e-2, atol=3e-2)
    assert torch.equal(model.compute_logits(few), output.packed(few, None).float())
    assert not torch.equal(model.compute_logits(many), output.packed(many, None).float())


@native_only
def test_tiles_are_timed_once_on_the_largest_layer_and_set_on_all(gguf_path, monkeypatch) -> None:
    timed: list[tuple[int, int]] = []

    def tiles_from_rows(blocks, x_row: torch.Tensor) -> int:
        timed.append((blocks.out_features, blocks.in_features))
        return 32 if len(timed) == 1 else 128  # the projections, then the output layer

    monkeypatch.setattr(linear, "tiles_from_rows", tiles_from_rows)
    model = load_model(gguf_path, torch.float32, torch.device("cpu"), 512)
    projections = _projections(model)
    largest = max(projections, key=lambda layer: layer.out_features * layer.in_features)
    output = model.output_layer()
    assert output is not None
    assert timed == [
        (largest.out_features, largest.in_features),
        (output.out_features, output.in_features),
    ]
    assert all(layer.tiles_from == 32 for layer in projections) and output.tiles_from == 128


@native_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rows_from_the_tiles_threshold_are_the_dequantized_weight(
    gguf_path, monkeypatch, dtype
) -> None:
    """Without a copy, from ``tiles_from`` rows the layer multiplies the de-quantized
    blocks (the copy's numbers); below it, the integer kernel."""
    layer = _projections(_load(gguf_path, dtype, 0, monkeypatch, tiles_from=16))[-1]
    copied = _projections(_load(gguf_path, dtype, 64 * MiB, monkeypatch, from_rows=16))[-1]
    integer = _projections(_load(gguf_path, dtype, 0, monkeypatch))[-1]
    assert layer.dense is None and layer.tiles_from == 16 and copied.dense is not None
    torch.manual_seed(0)
    many, few = torch.randn(16, layer.in_features), torch.randn(15, layer.in_features)
    tolerance = {torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype]  # the product's rounding
    many, few = many.to(dtype), few.to(dtype)
    torch.testing.assert_close(
        layer(many).float(), copied(many).float(), rtol=tolerance, atol=tolerance
    )
    assert not torch.equal(layer(many), integer(many))
    assert torch.equal(layer(few), integer(few))


def test_the_tiles_timing_finds_the_rows_where_the_matmul_gets_ahead(monkeypatch) -> None:
    """A stand-in kernel whose time is known: the integer path 0.02 ms a row, the
    tiles 4 ms a call, so the tiles are ahead from 256 rows of the ladder on."""
    from kernels.native import quantized as native

    def packed_linear(x, blocks, bias, matmul_from_rows=None) -> torch.Tensor:
        tiles = matmul_from_rows is not None and x.shape[0] >= matmul_from_rows
        time.sleep(4e-3 if tiles else x.shape[0] * 2e-5)
        return x

    class Blocks:
        def head(self, rows: int) -> "Blocks":
            return self

    monkeypatch.setattr(native, "packed_linear", packed_linear)
    assert linear.tiles_from_rows(Blocks(), torch.ones(1, 4)) == 256
