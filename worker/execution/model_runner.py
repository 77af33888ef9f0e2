"""Owns the model and the KV cache tensors; turns a scheduled step into one forward pass."""

import logging
import math
import time
from typing import TYPE_CHECKING

import torch

from queue_schemas.sampling import SamplingOptions
from worker.config import EngineConfig
from worker.engine.block_manager import cdiv
from worker.engine.scheduler import SchedulerOutput
from worker.engine.sequence import Sequence
from worker.execution.cuda_graphs import DecodeGraphs, capture_sizes
from worker.execution.kv_sizing import GIB, DeviceMemory, blocks_from_budget, gpu_blocks
from worker.execution.step_buffers import Query, StepBuffers
from worker.models.decoder import CausalLM
from worker.models.sharding import TensorParallel

if TYPE_CHECKING:
    from worker.execution.ranks import StepChannel

log = logging.getLogger("genfleet.engine")


def kv_cache_shape(model: CausalLM, blocks: int, block_size: int) -> tuple[int, ...]:
    """The cache of ``blocks`` blocks as this process holds it: [kinds, layers, blocks,
    block_size, KV heads (its rank's, under tensor parallelism), row width], kinds 2
    (key rows, value rows) or 1 where the values are read from the key rows
    (multi-head latent attention's latents)."""
    attention = model.model.attentions()[0]
    kinds = 1 if attention.values_in_keys else 2
    layers = model.config.num_hidden_layers
    return (kinds, layers, blocks, block_size, attention.num_kv_heads, attention.cache_width)


def kv_bytes_per_block(model: CausalLM, config: EngineConfig) -> int:
    elements = math.prod(kv_cache_shape(model, 1, config.block_size))
    return elements * config.cache_torch_dtype.itemsize


def max_step_seqs(config: EngineConfig, max_model_len: int) -> int:
    """Sequences of the largest step: as many as run at once, or more where
    ``max_num_batched_tokens`` prompt tokens need more sequences of the context."""
    tokens = config.max_num_batched_tokens
    return max(min(config.max_num_seqs, tokens), cdiv(tokens, max_model_len - 1))


def profile_batch(config: EngineConfig, max_model_len: int) -> SchedulerOutput:
    """The largest step the scheduler can make: ``max_num_batched_tokens`` prompt tokens
    over as many sequences as it runs at once, every one sampling, all on block 0."""
    tokens = config.max_num_batched_tokens
    count = max_step_seqs(config, max_model_len)
    lengths = [tokens // count + (i < tokens % count) for i in range(count)]
    batch = SchedulerOutput()
    for i, length in enumerate(lengths):
        seq = Sequence(f"profile-{i}", [0] * length, SamplingOptions(max_tokens=1), i)
        seq.block_ids = [0] * cdiv(length, config.block_size)
        batch.seqs.append(seq)
        batch.num_new_tokens.append(length)
    return batch


class ModelRunner:
    """``shared_bytes_per_block``: what each block costs beyond this model's K/V (a
    draft model's cache on the same block ids), so both fit the KV budget. ``extra_rows``:
    room in the step buffers past the token budget (a draft model's catch-up).
    Under tensor parallelism (``tp``, ``channel``) rank 0's runner sends each step to
    the other ranks, whose runners ``follow``; all hold the same number of blocks."""

    def __init__(
        self,
        config: EngineConfig,
        model: CausalLM,
        max_model_len: int,
        shared_bytes_per_block: int = 0,
        extra_rows: int = 0,
        tp: TensorParallel | None = None,
        channel: "StepChannel | None" = None,
    ) -> None:
        self.config = config
        self.model = model
        self.tp = tp or TensorParallel()
        self.channel = channel
        self.max_model_len = max_model_len
        self.device = torch.device(config.device)
        self.shared_bytes_per_block = shared_bytes_per_block
        self.buffers = StepBuffers(
            max_tokens=config.max_num_batched_tokens + extra_rows,
            max_seqs=max_step_seqs(config, max_model_len),
            max_blocks_per_seq=cdiv(max_model_len, config.block_size),
            block_size=config.block_size,
            scratch_block=0,  # set with the cache
            device=self.device,
        )
        self.graphs: DecodeGraphs | None = None
        self.num_blocks = self._plan_blocks()
        self._allocate_kv_cache()
        if config.uses_cuda_graphs:
            started = time.perf_counter()
            self.graphs = self._capture_graphs()
            log.info(
                "CUDA graphs for decode batches of %s captured in %.1f s",
                self.graphs.sizes,
                time.perf_counter() - started,
            )
        if config.calculate_kv_scales and self.kv_cache.element_size() == 1:
            # After profiling and capture: the first real forward is a prefill.
            for attention in self.model.model.attentions():
                attention.calculate_scales = True

    def _plan_blocks(self) -> int:
        config = self.config
        per_block = kv_bytes_per_block(self.model, config) + self.shared_bytes_per_block
        if config.num_gpu_blocks_override:
            return config.num_gpu_blocks_override
        if self.device.type != "cuda":
            blocks = blocks_from_budget(config.kv_cache_memory_gib * GIB, per_block)
        else:
            blocks = gpu_blocks(self.profile(), config.gpu_memory_utilization, per_block)
        return self.tp.minimum(blocks)  # every rank's cache holds the same block ids

    def profile(self) -> DeviceMemory:
        """One forward pass of the largest step on a one-block cache, and the CUDA
        memory it took at its peak (the weights included); then the decode graphs,
        captured on that cache to count their memory, and dropped."""
        self.num_blocks = 1
        self._allocate_kv_cache()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        if self.tp.rank == 0:
            self.execute(profile_batch(self.config, self.max_model_len))
        else:
            self.follow()
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        other = total - free - torch.cuda.memory_reserved(self.device)
        graphs = 0
        if self.config.uses_cuda_graphs:
            captured = self._capture_graphs()
            graphs = max(0, free - torch.cuda.mem_get_info(self.device)[0])
            del captured
        del self.kv_cache
        torch.cuda.empty_cache()
        return DeviceMemory(total=total, peak=peak, other=max(0, other), graphs=graphs)

    def _capture_graphs(self) -> DecodeGraphs:
        largest = min(self.config.max_num_seqs, self.config.max_num_batched_tokens)
        graphs = DecodeGraphs(self._forward_rows, capture_sizes(largest), self.device)
        with torch.inference_mode():
            graphs.capture(self.buffers.fill_padding)
        return graphs

    def _forward_rows(self, rows: int) -> torch.Tensor:
        """The model over the device buffers' first ``rows`` one-token sequences."""
        inputs = self.buffers.device.views(rows, rows, 0)
        return self.model(inputs.input_ids, inputs.positions, inputs.meta)

    def _allocate_kv_cache(self) -> None:
        # The last block: scratch for a padded decode's padding rows.
        shape = kv_cache_shape(self.model, self.num_blocks + 1, self.config.block_size)
        self.kv_cache = torch.zeros(shape, dtype=self.config.cache_torch_dtype, device=self.device)
        self.buffers.scratch_block = self.num_blocks
        # Scales of 1.0 (vLLM's default) cost nothing: only calculated ones are kept.
        scaled = self.kv_cache.element_size() == 1 and self.config.calculate_kv_scales
        for i, attention in enumerate(self.model.model.attentions()):
            attention.bind_cache(self.kv_cache[:, i])
            if scaled:
                attention.k_scale = torch.ones((), device=self.device)
                attention.v_scale = torch.ones((), device=self.device)
        self.model.bind_chain()

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput) -> torch.Tensor:
        """Run the step; return float32 logits [num_sampling_seqs, vocab] in batch order.

        A decode step replays the captured graph of its padded size where there is one."""
        decode = batch.total_tokens == len(batch.seqs)
        size = self.graphs.size_for(len(batch.seqs)) if self.graphs and decode else None
        if size is None:
            inputs = self.buffers.fill(batch)
            if self.channel is not None:
                self.channel.send(inputs)
            hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta)
        else:
            assert self.graphs is not None
            inputs = self.buffers.fill(batch, pad_to=size)
            hidden = self.graphs.replay(size)
        return self.model.compute_logits(hidden.index_select(0, inputs.sample_rows))

    @torch.inference_mode()
    def follow(self) -> bool:
        """A follower rank's step: rank 0's inputs, the forward, this rank's part of the
        logits' all-gather. False when rank 0 stops."""
        assert self.channel is not None
        inputs = self.channel.receive(self.buffers)
        if inputs is None:
            return False
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta)
        self.model.compute_logits(hidden.index_select(0, inputs.sample_rows))
        return True

    @torch.inference_mode()
    def run(self, queries: list[Query]) -> torch.Tensor:
        """One eager forward over ``queries``; float32 logits of their sampled positions."""
        inputs = self.buffers.fill_queries(queries)
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta)
        return self.model.compute_logits(hidden.index_select(0, inputs.sample_rows))
