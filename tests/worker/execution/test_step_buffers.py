"""Step inputs laid out in fixed buffers, and decode steps padded for CUDA graphs."""

import pytest
import torch

from worker.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine.scheduler import SchedulerOutput
from worker.engine.sequence import Sequence
from worker.execution.cuda_graphs import capture_sizes, padded_size
from worker.execution.step_buffers import StepBuffers
from worker.sampling_params import SamplingParams

BLOCK = 4


def _seq(name: str, tokens: int, computed: int, blocks: list[int]) -> Sequence:
    seq = Sequence(name, list(range(100, 100 + tokens)), SamplingParams(), 0)
    seq.num_computed_tokens = computed
    seq.block_ids = blocks
    return seq


def _buffers(scratch: int = 9) -> StepBuffers:
    return StepBuffers(64, 8, 6, BLOCK, scratch, torch.device("cpu"))


def test_a_mixed_step_is_laid_out_as_the_kernels_read_it() -> None:
    # A 6-token prefill, one decode at position 5, and a chunk of 2 in the middle of a prompt.
    batch = SchedulerOutput(
        seqs=[_seq("a", 6, 0, [3, 1]), _seq("b", 6, 5, [0, 2]), _seq("c", 9, 4, [4, 5, 6])],
        num_new_tokens=[6, 1, 2],
    )
    step = _buffers().fill(batch)
    assert step.input_ids.tolist() == [100, 101, 102, 103, 104, 105, 105, 104, 105]
    assert step.positions.tolist() == [0, 1, 2, 3, 4, 5, 5, 4, 5]
    # slot = block_table[pos // 4] * 4 + pos % 4
    assert step.meta.slot_mapping.tolist() == [12, 13, 14, 15, 4, 5, 9, 20, 21]
    assert step.meta.seq_lens.tolist() == [6, 6, 6]
    assert step.meta.query_start_loc.tolist() == [0, 6, 7, 9]
    assert step.meta.block_tables[0, :2].tolist() == [3, 1]
    assert step.meta.block_tables[2, :3].tolist() == [4, 5, 6]
    # "c" has 3 more prompt tokens to read: it does not sample.
    assert step.sample_rows.tolist() == [5, 6]
    assert step.num_rows == 9


def test_a_step_leaves_nothing_of_the_one_before() -> None:
    buffers = _buffers()
    buffers.fill(SchedulerOutput([_seq("a", 20, 0, [1, 2, 3, 4, 5])], [20]))
    step = buffers.fill(SchedulerOutput([_seq("b", 3, 2, [7])], [1]))
    assert step.input_ids.tolist() == [102] and step.positions.tolist() == [2]
    assert step.meta.slot_mapping.tolist() == [30]
    assert step.meta.query_start_loc.tolist() == [0, 1] and step.meta.seq_lens.tolist() == [3]


@pytest.mark.parametrize(
    ("largest", "ladder"),
    [
        (64, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]),
        (20, [1, 2, 4, 8, 16, 20]),
        (5, [1, 2, 4, 5]),
        (1, [1]),
    ],
)
def test_the_capture_ladder(largest, ladder) -> None:
    assert capture_sizes(largest) == ladder


def test_a_batch_pads_to_the_next_captured_size() -> None:
    ladder = capture_sizes(64)
    assert padded_size(5, ladder) == 8
    assert padded_size(3, ladder) == 4
    assert padded_size(8, ladder) == 8
    assert padded_size(57, ladder) == 64
    assert padded_size(65, ladder) is None


def test_padding_rows_live_on_the_scratch_block_only() -> None:
    scratch = 9
    seqs = [_seq(f"s{i}", 7, 6, [2 * i, 2 * i + 1]) for i in range(5)]
    step = _buffers(scratch).fill(SchedulerOutput(seqs, [1] * 5), pad_to=8)
    assert step.num_rows == 8 and step.input_ids.shape == (8,)
    real_slots = step.meta.slot_mapping[:5].tolist()
    assert real_slots == [(2 * i + 1) * BLOCK + 2 for i in range(5)]
    padding_slots = step.meta.slot_mapping[5:].tolist()
    assert all(slot // BLOCK == scratch for slot in padding_slots)
    assert step.meta.block_tables[5:, 0].tolist() == [scratch] * 3
    assert step.meta.seq_lens.tolist() == [7] * 5 + [1] * 3
    assert step.meta.query_start_loc.tolist() == list(range(9))
    assert step.sample_rows.tolist() == [0, 1, 2, 3, 4]  # padding never samples


def test_only_a_decode_step_pads() -> None:
    prefill = SchedulerOutput([_seq("a", 6, 0, [1, 2])], [6])
    with pytest.raises(ValueError, match="only a decode step"):
        _buffers().fill(prefill, pad_to=8)
    decodes = SchedulerOutput([_seq(f"s{i}", 3, 2, [i]) for i in range(4)], [1] * 4)
    with pytest.raises(ValueError, match="only a decode step"):
        _buffers().fill(decodes, pad_to=2)


def test_a_padded_decode_forward_equals_the_unpadded_one(tiny_models) -> None:
    """What a replayed graph computes, run eagerly on the CPU: the real rows' outputs and
    the real blocks' K/V are those of the unpadded step, even with garbage (NaN) in the
    scratch block the padding rows read; no other block changes."""
    folder, _ = tiny_models["llama-untied"]
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", num_gpu_blocks_override=32))
    runner = engine.runner
    assert runner.kv_cache.shape[2] == runner.num_blocks + 1  # the scratch block
    seqs = [_seq(f"s{i}", 7 + i, 0, [3 * i, 3 * i + 1, 3 * i + 2]) for i in range(5)]
    for seq in seqs:
        seq.token_ids = [(17 * i + len(seq.token_ids)) % 300 for i in range(seq.num_tokens)]
    runner.execute(SchedulerOutput(list(seqs), [s.num_tokens - 1 for s in seqs]))
    for seq in seqs:
        seq.num_computed_tokens = seq.num_tokens - 1
    decode = SchedulerOutput(list(seqs), [1] * 5)
    scratch = runner.num_blocks
    runner.kv_cache[:, :, scratch] = float("nan")
    cache_before = runner.kv_cache.clone()

    unpadded = runner.execute(decode)
    cache_unpadded = runner.kv_cache.clone()
    runner.kv_cache.copy_(cache_before)
    with torch.inference_mode():
        inputs = runner.buffers.fill(decode, pad_to=8)
        hidden = runner.model(inputs.input_ids, inputs.positions, inputs.meta)
        padded = runner.model.compute_logits(hidden.index_select(0, inputs.sample_rows))

    torch.testing.assert_close(padded, unpadded, rtol=1e-5, atol=1e-5)
    real = runner.kv_cache[:, :, :scratch]
    torch.testing.assert_close(real, cache_unpadded[:, :, :scratch], rtol=1e-5, atol=1e-5)
    touched = (runner.kv_cache != cache_before).flatten(0, 1).transpose(0, 1).flatten(1).any(1)
    used = {b for s in seqs for b in s.block_ids}
    assert set(touched.nonzero().flatten().tolist()) <= used | {scratch}
