"""Draft proposals: n-gram lookups (vLLM's ``"method": "ngram"``) and what every
proposer shares (how many drafts a sequence may take, and when speculation is off).

After each step, a running sequence that speculates looks for the latest earlier
occurrence of its last n tokens (n from ``prompt_lookup_max`` down to
``prompt_lookup_min``, prompt and output alike) and proposes the k tokens that
followed it. ``verification`` checks the drafts against the target model.
"""

from typing import Protocol

import numpy as np

from worker.config import SpeculativeConfig
from worker.engine.sequence import Sequence


def propose_ngram(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the longest
    suffix of ``tokens`` (``max_n`` down to ``min_n`` long); none without a match."""
    ids = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        suffix = ids[-n:]
        # Windows of n tokens that start before the suffix itself does.
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
        matches = np.flatnonzero((windows == suffix).all(axis=1))
        if matches.size:
            start = int(matches[-1]) + n
            return ids[start : start + k].tolist()
    return []


def draft_room(config: SpeculativeConfig, seq: Sequence, max_model_len: int) -> int:
    """How many drafts ``seq`` may take next step: never more than its remaining
    ``max_tokens`` (less the model's own token) or context."""
    room = max_model_len - seq.num_tokens - 1
    if seq.params.max_tokens is not None:
        room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
    return max(0, min(config.num_speculative_tokens, room))


def keep_to_grammar(seq: Sequence) -> None:
    """Cut a constrained sequence's drafts to those its grammar takes."""
    if seq.constraint is not None and seq.draft_token_ids:
        del seq.draft_token_ids[seq.constraint.accepted_prefix(seq.draft_token_ids) :]


def speculation_off(config: SpeculativeConfig, running: list[Sequence]) -> bool:
    """A step too full to speculate (``disable_by_batch_size``)."""
    limit = config.disable_by_batch_size
    return limit is not None and len(running) > limit


def is_decoding(seq: Sequence) -> bool:
    """Past its prefill: only its newest token waits for the model."""
    return seq.num_computed_tokens == seq.num_tokens - 1


class Proposer(Protocol):
    def propose(self, running: list[Sequence]) -> None:
        """Set ``draft_token_ids`` of the running sequences after a step (a sequence
        that still holds drafts was not scheduled: they stand)."""


class NgramProposer:
    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len

    def propose(self, running: list[Sequence]) -> None:
        config = self.config
        if speculation_off(config, running):
            return
        for seq in running:
            if seq.draft_token_ids:
                continue  # left out of the last step: its drafts still stand
            k = draft_room(config, seq, self.max_model_len) if is_decoding(seq) else 0
            if k:
                seq.draft_token_ids = propose_ngram(
                    seq.token_ids, k, config.prompt_lookup_min, config.prompt_lookup_max
                )
                keep_to_grammar(seq)
