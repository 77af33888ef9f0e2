"""KV cache sizing: the arithmetic of gpu_memory_utilization, and the profiling step."""

import pytest
import torch

from worker.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.execution.kv_sizing import GIB, DeviceMemory, describe, gpu_blocks
from worker.execution.model_runner import kv_bytes_per_block, profile_batch

MIB = 1 << 20


def test_the_cache_gets_the_share_left_after_the_peak_and_other_holders() -> None:
    memory = DeviceMemory(total=80 * GIB, peak=10 * GIB, other=1 * GIB)
    # 0.9 x 80 = 72 GiB; minus 10 and 1: 61 GiB of 2 MiB blocks.
    assert gpu_blocks(memory, 0.9, 2 * MIB) == 61 * 512
    assert gpu_blocks(memory, 0.5, 2 * MIB) == 29 * 512
    # A partial block does not count.
    assert gpu_blocks(DeviceMemory(total=10 * GIB, peak=9 * GIB - 3 * MIB), 0.9, 2 * MIB) == 1


def test_the_decode_graphs_memory_is_taken_from_the_cache() -> None:
    memory = DeviceMemory(total=80 * GIB, peak=10 * GIB, other=1 * GIB, graphs=GIB // 2)
    assert gpu_blocks(memory, 0.9, 2 * MIB) == 61 * 512 - 256


def test_weights_beyond_the_share_are_a_clear_error() -> None:
    memory = DeviceMemory(total=16 * GIB, peak=15 * GIB)
    with pytest.raises(ValueError) as error:
        gpu_blocks(memory, 0.9, 2 * MIB)
    message = str(error.value)
    assert "gpu_memory_utilization=0.9 of 16.00 GiB is 14.40 GiB" in message
    assert "peak (15.00 GiB)" in message and "leave 0.00 GiB" in message


def test_the_log_line_says_blocks_tokens_and_full_sequences() -> None:
    assert describe(1024, 16, 2048) == (
        "KV cache: 1024 blocks of 16 = 16384 tokens, 8.00 concurrent sequences of 2048 tokens"
    )


@pytest.mark.parametrize(
    ("tokens", "seqs", "max_len"), [(512, 64, 2048), (512, 1, 100), (7, 64, 50)]
)
def test_the_profiling_step_is_the_largest_the_scheduler_makes(tokens, seqs, max_len) -> None:
    config = EngineConfig(max_num_batched_tokens=tokens, max_num_seqs=seqs, device="cpu")
    batch = profile_batch(config, max_len)
    assert batch.total_tokens == tokens
    assert all(0 < n < max_len for n in batch.num_new_tokens)
    assert len(batch.seqs) == max(min(seqs, tokens), -(-tokens // (max_len - 1)))
    assert all(set(seq.block_ids) == {0} for seq in batch.seqs)


def test_the_profiling_forward_runs_on_a_one_block_cache(tiny_models) -> None:
    """On the CPU there is no allocator peak to read, but the same forward pass runs."""
    folder, _ = tiny_models["llama-untied"]
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", max_num_batched_tokens=96))
    runner = engine.runner
    runner.num_blocks = 1
    runner._allocate_kv_cache()
    logits = runner.execute(profile_batch(engine.config, engine.max_model_len))
    assert logits.shape == (64, engine.vocab_size) and torch.isfinite(logits).all()
    assert kv_bytes_per_block(runner.model, engine.config) > 0
