"""Owns the model and the KV cache tensors; turns a scheduled step into one forward pass."""

import torch

from worker.block_manager import cdiv
from worker.config import EngineConfig
from worker.kv_sizing import GIB, DeviceMemory, blocks_from_budget, gpu_blocks
from worker.models.attention_metadata import AttentionMetadata
from worker.models.llama import LlamaForCausalLM, head_dim_of
from worker.sampling_params import SamplingParams
from worker.scheduler import SchedulerOutput
from worker.sequence import Sequence


def kv_bytes_per_block(model: LlamaForCausalLM, config: EngineConfig) -> int:
    hf = model.config
    per_token = 2 * hf.num_hidden_layers * hf.num_key_value_heads * head_dim_of(hf)
    return per_token * config.block_size * config.torch_dtype.itemsize


def profile_batch(config: EngineConfig, max_model_len: int) -> SchedulerOutput:
    """The largest step the scheduler can make: ``max_num_batched_tokens`` prompt tokens
    over as many sequences as it runs at once, every one sampling, all on block 0."""
    tokens = config.max_num_batched_tokens
    count = max(min(config.max_num_seqs, tokens), cdiv(tokens, max_model_len - 1))
    lengths = [tokens // count + (i < tokens % count) for i in range(count)]
    batch = SchedulerOutput()
    for i, length in enumerate(lengths):
        seq = Sequence(f"profile-{i}", [0] * length, SamplingParams(max_tokens=1), i)
        seq.block_ids = [0] * cdiv(length, config.block_size)
        batch.seqs.append(seq)
        batch.num_new_tokens.append(length)
    return batch


class ModelRunner:
    def __init__(self, config: EngineConfig, model: LlamaForCausalLM, max_model_len: int) -> None:
        self.config = config
        self.model = model
        self.max_model_len = max_model_len
        self.device = torch.device(config.device)
        self.num_blocks = self._plan_blocks()
        self._allocate_kv_cache()

    def _plan_blocks(self) -> int:
        config, per_block = self.config, kv_bytes_per_block(self.model, self.config)
        if config.num_gpu_blocks_override:
            return config.num_gpu_blocks_override
        if self.device.type != "cuda":
            return blocks_from_budget(config.kv_cache_memory_gib * GIB, per_block)
        return gpu_blocks(self.profile(), config.gpu_memory_utilization, per_block)

    def profile(self) -> DeviceMemory:
        """One forward pass of the largest step on a one-block cache, and the CUDA
        memory it took at its peak (the weights included)."""
        self.num_blocks = 1
        self._allocate_kv_cache()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.execute(profile_batch(self.config, self.max_model_len))
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        other = total - free - torch.cuda.memory_reserved(self.device)
        del self.kv_cache
        torch.cuda.empty_cache()
        return DeviceMemory(total=total, peak=peak, other=max(0, other))

    def _allocate_kv_cache(self) -> None:
        hf = self.model.config
        shape = (
            2,
            hf.num_hidden_layers,
            self.num_blocks,
            self.config.block_size,
            hf.num_key_value_heads,
            head_dim_of(hf),
        )
        self.kv_cache = torch.zeros(shape, dtype=self.config.torch_dtype, device=self.device)
        for i, attention in enumerate(self.model.model.attentions()):
            attention.key_cache = self.kv_cache[0, i]
            attention.value_cache = self.kv_cache[1, i]

    def _prepare(
        self, batch: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flatten the step: input ids, positions, attention metadata, rows to sample."""
        input_ids: list[int] = []
        starts: list[int] = []
        block_tables: list[list[int]] = []
        sample_rows: list[int] = []
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start : start + num_new])
            starts.append(start)
            block_tables.append(seq.block_ids)
            if start + num_new == seq.num_tokens:
                sample_rows.append(len(input_ids) - 1)

        new_counts = torch.tensor(batch.num_new_tokens, dtype=torch.int64)
        query_start_loc = torch.zeros(len(starts) + 1, dtype=torch.int64)
        torch.cumsum(new_counts, 0, out=query_start_loc[1:])
        first_positions = torch.tensor(starts, dtype=torch.int64)
        seq_lens = first_positions + new_counts
        # Position of every token: its sequence's first new position plus its offset.
        seq_of_token = torch.repeat_interleave(torch.arange(len(starts)), new_counts)
        offsets = torch.arange(len(input_ids)) - query_start_loc[seq_of_token]
        positions = first_positions[seq_of_token] + offsets
        width = max(len(table) for table in block_tables)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32)
        # slot = block_table[seq, pos // B] * B + pos % B
        size = self.config.block_size
        slot_mapping = tables[seq_of_token, positions // size].long() * size + positions % size

        device = self.device
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(device),
            block_tables=tables.to(device),
            seq_lens=seq_lens.to(device),
            query_start_loc=query_start_loc.to(device),
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=device)
        return ids, positions.to(device), meta, sample_rows

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput) -> torch.Tensor:
        """Run the step; return float32 logits [num_sampling_seqs, vocab] in batch order."""
        input_ids, positions, meta, sample_rows = self._prepare(batch)
        hidden = self.model(input_ids, positions, meta)
        rows = torch.tensor(sample_rows, dtype=torch.int64, device=self.device)
        return self.model.compute_logits(hidden.index_select(0, rows))
