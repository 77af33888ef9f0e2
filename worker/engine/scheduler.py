"""Iteration-level scheduling: which sequences run this step, and how many tokens each.

Each step spends one token budget: running sequences first (a decode token, or
the next chunk of an unfinished prefill), then waiting ones in order: those
resumed from output an earlier attempt streamed (their readers are mid-stream),
then by priority (lower first, first come first served within a priority). A
sequence that cannot get a block preempts the least important running sequence
(not resumed, highest priority value, newest arrival), which drops its blocks
and waits to be recomputed.
"""

import bisect
import heapq
import time
from dataclasses import dataclass, field

from worker.config import EngineConfig
from worker.engine.block_manager import BlockManager
from worker.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.kv = block_manager
        self.waiting: list[tuple[tuple[int, int, int], Sequence]] = []  # heap by order_key
        # Kept sorted by order_key: the budget goes to the most important first,
        # and the preemption victim is always the last one.
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.reserved_blocks = int(config.watermark * block_manager.num_blocks)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        heapq.heappush(self.waiting, (seq.order_key, seq))

    def finish(self, seq: Sequence) -> None:
        """Take a sequence out of the queues and free its blocks (finished or aborted)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting = [entry for entry in self.waiting if entry[1] is not seq]
            heapq.heapify(self.waiting)
        seq.status = SequenceStatus.FINISHED
        self.kv.free(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.draft_token_ids = []
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.add(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens

        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = self._chunk(seq.num_tokens - seq.num_computed_tokens, budget)
            if seq.draft_token_ids:
                # A decode with its drafts, all in this step's budget, or a plain decode.
                if num_new == 1 and 1 + len(seq.draft_token_ids) <= budget:
                    num_new += len(seq.draft_token_ids)
                else:
                    seq.draft_token_ids = []
            if num_new == 0:
                continue
            while not self.kv.allocate_slots(seq, seq.num_computed_tokens + num_new):
                if seq.draft_token_ids:  # drafts never cost another sequence its blocks
                    seq.draft_token_ids = []
                    num_new = 1
                    continue
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.seqs.append(seq)
                out.num_new_tokens.append(num_new)
                budget -= num_new

        # Admit nothing new in a step that had to preempt: memory is short.
        while self.waiting and not out.preempted and budget > 0:
            if len(self.running) >= self.config.max_num_seqs:
                break
            seq = self.waiting[0][1]
            hits = self.kv.get_computed_blocks(seq)
            num_cached = len(hits) * self.kv.block_size
            num_new = self._chunk(seq.num_tokens - num_cached, budget)
            if num_new == 0:
                break
            reserve = self.reserved_blocks
            if not self.kv.allocate_slots(seq, num_cached + num_new, hits, reserve):
                break
            heapq.heappop(self.waiting)
            seq.status = SequenceStatus.RUNNING
            if seq.scheduled_time is None:
                seq.scheduled_time = time.time()
            seq.num_computed_tokens = seq.num_draft_computed_tokens = num_cached
            if seq.num_output_tokens == 0:
                seq.num_cached_prompt_tokens = num_cached
            bisect.insort(self.running, seq, key=lambda s: s.order_key)
            out.seqs.append(seq)
            out.num_new_tokens.append(num_new)
            budget -= num_new
        return out

    def _chunk(self, num_remaining: int, budget: int) -> int:
        """Tokens of a sequence to run now: all, a chunk of the budget, or none."""
        if num_remaining <= budget:
            return num_remaining
        return budget if self.config.enable_chunked_prefill else 0
