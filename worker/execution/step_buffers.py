"""A step's input tensors, in buffers allocated once.

The runner fills the host side with the step (numpy views, no tensor built per
step) and copies it to the device side without blocking. On a GPU the host
side is pinned memory, so each copy is an asynchronous DMA that the forward
pass queues behind: the step's only synchronisation is the copy of its sampled
tokens back, which also guarantees a copy has finished before the next step
overwrites its host buffer. The device side keeps fixed addresses, which CUDA
graphs replay from. On the CPU both sides are the same tensors and nothing is
copied.

A decode step may be padded to a larger batch (a captured graph's size): the
padding rows are one-token sequences on the scratch block, a block the block
manager never hands out, so they read and write no real sequence's cache.
"""

from dataclasses import dataclass

import numpy as np
import torch

from worker.engine.scheduler import SchedulerOutput
from worker.models.attention_metadata import AttentionMetadata


@dataclass
class Query:
    """One sequence's part of a forward: ``token_ids`` from position ``start`` on, its
    cache blocks, and how many of its last positions' logits are wanted."""

    token_ids: list[int]
    start: int
    block_ids: list[int]
    num_samples: int


@dataclass
class StepInputs:
    """Views of the device buffers for one step (padding rows included)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # rows of the forward's output that sample, in batch order
    num_rows: int  # sequences (= tokens) the forward runs on, padding included


class _Buffers:
    def __init__(
        self, max_tokens: int, max_seqs: int, max_blocks: int, device: torch.device, pin: bool
    ) -> None:
        def empty(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)

        self.input_ids = empty(max_tokens)
        self.positions = empty(max_tokens)
        self.slot_mapping = empty(max_tokens)
        self.block_tables = empty(max_seqs, max_blocks, dtype=torch.int32)
        self.seq_lens = empty(max_seqs)
        self.query_start_loc = empty(max_seqs + 1)
        self.sample_rows = empty(max(max_seqs, max_tokens))  # drafts sample at each position

    def views(self, num_tokens: int, num_seqs: int, num_samples: int) -> StepInputs:
        return StepInputs(
            input_ids=self.input_ids[:num_tokens],
            positions=self.positions[:num_tokens],
            meta=AttentionMetadata(
                slot_mapping=self.slot_mapping[:num_tokens],
                block_tables=self.block_tables[:num_seqs],
                seq_lens=self.seq_lens[:num_seqs],
                query_start_loc=self.query_start_loc[: num_seqs + 1],
            ),
            sample_rows=self.sample_rows[:num_samples],
            num_rows=num_tokens,
        )


class StepBuffers:
    def __init__(
        self,
        max_tokens: int,
        max_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        scratch_block: int,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.scratch_block = scratch_block
        shape = (max_tokens, max_seqs, max_blocks_per_seq)
        self._copies = device.type != "cpu"
        self.host = _Buffers(*shape, torch.device("cpu"), pin=self._copies)
        self.device = _Buffers(*shape, device, pin=False) if self._copies else self.host
        h = self.host
        self._ids = h.input_ids.numpy()
        self._positions = h.positions.numpy()
        self._slots = h.slot_mapping.numpy()
        self._tables = h.block_tables.numpy()
        self._seq_lens = h.seq_lens.numpy()
        self._starts = h.query_start_loc.numpy()
        self._sample_rows = h.sample_rows.numpy()

    def fill(self, batch: SchedulerOutput, pad_to: int | None = None) -> StepInputs:
        """Lay out a scheduled step; with ``pad_to``, a decode step padded to that many rows."""
        queries = []
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start = seq.num_computed_tokens
            drafts = seq.draft_token_ids
            tokens = seq.token_ids[start : start + num_new]
            tokens += drafts[: max(0, start + num_new - seq.num_tokens)]  # verifying
            # The last token samples; with drafts, every position they take verifies.
            sampling = start + num_new == seq.num_tokens + len(drafts)
            queries.append(Query(tokens, start, seq.block_ids, 1 + len(drafts) if sampling else 0))
        return self.fill_queries(queries, pad_to)

    def fill_queries(self, queries: list[Query], pad_to: int | None = None) -> StepInputs:
        """Lay out one forward over ``queries``, each a run of one sequence's tokens."""
        num_seqs = len(queries)
        input_ids: list[int] = []
        samples = 0
        for row, query in enumerate(queries):
            input_ids.extend(query.token_ids)
            self._tables[row, : len(query.block_ids)] = query.block_ids
            for back in range(query.num_samples - 1, -1, -1):
                self._sample_rows[samples] = len(input_ids) - 1 - back
                samples += 1
        num_tokens = len(input_ids)
        counts = np.fromiter((len(q.token_ids) for q in queries), np.int64, num_seqs)
        self._starts[0] = 0
        np.cumsum(counts, out=self._starts[1 : num_seqs + 1])
        starts = np.fromiter((q.start for q in queries), np.int64, num_seqs)
        self._seq_lens[:num_seqs] = starts + counts
        # Each token's position: its sequence's first new position plus its offset.
        seq_of_token = np.repeat(np.arange(num_seqs), counts)
        positions = self._positions[:num_tokens]
        positions[:] = np.arange(num_tokens) + (starts - self._starts[:num_seqs])[seq_of_token]
        self._ids[:num_tokens] = input_ids
        size = self.block_size
        blocks = self._tables[seq_of_token, positions // size].astype(np.int64)
        self._slots[:num_tokens] = blocks * size + positions % size
        if pad_to is None:
            return self._to_device(num_tokens, num_seqs, samples)
        if num_tokens != num_seqs or pad_to < num_seqs:
            raise ValueError(f"only a decode step of at most {pad_to} sequences pads to {pad_to}")
        self._pad(num_seqs, pad_to)
        return self._to_device(pad_to, pad_to, samples)

    def fill_padding(self, rows: int) -> StepInputs:
        """A decode step of padding rows only: what a graph is captured on."""
        self._starts[0] = 0
        self._pad(0, rows)
        return self._to_device(rows, rows, 0)

    def _pad(self, num_seqs: int, rows: int) -> None:
        pad = slice(num_seqs, rows)
        self._ids[pad] = 0
        self._positions[pad] = 0
        self._slots[pad] = self.scratch_block * self.block_size
        self._tables[pad, 0] = self.scratch_block
        self._seq_lens[pad] = 1
        self._starts[num_seqs + 1 : rows + 1] = np.arange(num_seqs + 1, rows + 1)

    def _to_device(self, num_tokens: int, num_seqs: int, num_samples: int) -> StepInputs:
        host = self.host.views(num_tokens, num_seqs, num_samples)
        if not self._copies:
            return host
        target = self.device.views(num_tokens, num_seqs, num_samples)
        pairs = [
            (target.input_ids, host.input_ids),
            (target.positions, host.positions),
            (target.meta.slot_mapping, host.meta.slot_mapping),
            (target.meta.block_tables, host.meta.block_tables),
            (target.meta.seq_lens, host.meta.seq_lens),
            (target.meta.query_start_loc, host.meta.query_start_loc),
            (target.sample_rows, host.sample_rows),
        ]
        for device_view, host_view in pairs:
            device_view.copy_(host_view, non_blocking=True)
        return target
