"""CUDA graphs for decode steps, captured once for a ladder of batch sizes.

A decode step of a small model on a GPU is mostly kernel launches: a few
hundred per forward, each costing the CPU microseconds. Replaying a captured
graph launches them all at once. As in vLLM, the decode-only forward is
captured for batch sizes 1, 2, 4 and every multiple of 8 up to the largest
decode batch; a step of n sequences is padded to the next captured size (its
padding rows run on the scratch block, see ``worker.execution.step_buffers``) and
replayed. Steps with prefill tokens, or larger than the ladder, run eagerly.
Every graph reads the same fixed input buffers and shares one memory pool,
captured largest first so the smaller ones reuse its memory.
"""

import bisect
from collections.abc import Callable

import torch

ForwardOfSize = Callable[[int], torch.Tensor]


def capture_sizes(max_batch: int) -> list[int]:
    """vLLM's ladder: 1, 2, 4, every multiple of 8 up to ``max_batch``, and ``max_batch``."""
    sizes = {size for size in (1, 2, 4) if size <= max_batch}
    sizes.update(range(8, max_batch + 1, 8))
    sizes.add(max_batch)
    return sorted(sizes)


def padded_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds ``num_seqs`` rows, or None past the ladder."""
    index = bisect.bisect_left(sizes, num_seqs)
    return sizes[index] if index < len(sizes) else None


class DecodeGraphs:
    """Captured decode forwards by batch size; ``forward(size)`` runs the model on the
    fixed buffers' first ``size`` rows and returns its hidden states."""

    def __init__(self, forward: ForwardOfSize, sizes: list[int], device: torch.device) -> None:
        self.sizes = sizes
        self._forward = forward
        self._device = device
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def capture(self, prepare: Callable[[int], object]) -> None:
        """Capture every size; ``prepare(size)`` fills the buffers with a padding-only step."""
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self._device)
        for size in reversed(self.sizes):
            prepare(size)
            # Warm up on a side stream first: Triton compiles its kernels on the first
            # launch, and a capture must contain launches only.
            stream.wait_stream(torch.cuda.current_stream(self._device))
            with torch.cuda.stream(stream):
                self._forward(size)
            torch.cuda.current_stream(self._device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                output = self._forward(size)
            self._graphs[size] = (graph, output)
        torch.cuda.synchronize(self._device)

    def size_for(self, num_seqs: int) -> int | None:
        return padded_size(num_seqs, self.sizes) if self._graphs else None

    def replay(self, size: int) -> torch.Tensor:
        """Run the graph of ``size`` on what the buffers hold now; its output tensor."""
        graph, output = self._graphs[size]
        graph.replay()
        return output
