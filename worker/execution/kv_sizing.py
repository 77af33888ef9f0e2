"""How many KV-cache blocks a worker gets, as vLLM sizes them.

On a GPU: run one forward pass at ``max_num_batched_tokens`` (the largest step
the scheduler can make), read the allocator's peak, and give the KV cache what
is left of ``gpu_memory_utilization`` of the device's memory after that peak,
the decode CUDA graphs' memory and what other processes hold. On the CPU
there is no allocator to ask: the cache gets ``kv_cache_memory_gib``.
``num_gpu_blocks_override`` wins on both.
"""

from dataclasses import dataclass

from worker.config import GIB


@dataclass(frozen=True)
class DeviceMemory:
    """What a profiling forward pass found, in bytes."""

    total: int  # the device's memory
    peak: int  # torch's peak allocation during the pass (weights included)
    other: int = 0  # held outside this process's torch allocator (other processes, the driver)
    graphs: int = 0  # taken by capturing the decode CUDA graphs


def blocks_from_budget(budget_bytes: float, bytes_per_block: int) -> int:
    return int(budget_bytes // bytes_per_block)


def gpu_blocks(memory: DeviceMemory, utilization: float, bytes_per_block: int) -> int:
    """Blocks that fit in ``utilization`` of the device after the profiled peak; a
    ValueError saying what to change when not even one does."""
    share = memory.total * utilization
    budget = share - memory.peak - memory.graphs - memory.other
    blocks = blocks_from_budget(budget, bytes_per_block)
    if blocks < 1:
        raise ValueError(
            f"no room for a KV cache: gpu_memory_utilization={utilization} of "
            f"{memory.total / GIB:.2f} GiB is {share / GIB:.2f} GiB, and the model's "
            f"profiled peak ({memory.peak / GIB:.2f} GiB), its CUDA graphs "
            f"({memory.graphs / GIB:.2f} GiB) and memory held elsewhere "
            f"({memory.other / GIB:.2f} GiB) leave {max(0.0, budget) / GIB:.2f} GiB; raise "
            "gpu_memory_utilization, lower max_num_batched_tokens, or use a smaller model"
        )
    return blocks


def describe(num_blocks: int, block_size: int, max_model_len: int) -> str:
    """The log line: blocks, tokens, and how many full-context sequences fit at once."""
    tokens = num_blocks * block_size
    return (
        f"KV cache: {num_blocks} blocks of {block_size} = {tokens} tokens, "
        f"{tokens / max_model_len:.2f} concurrent sequences of {max_model_len} tokens"
    )
