"""Speculative decoding with n-gram proposals (vLLM's ``"method": "ngram"``).

After each step, a running sequence that speculates looks for the latest earlier
occurrence of its last n tokens (n from ``prompt_lookup_max`` down to
``prompt_lookup_min``, prompt and output alike) and proposes the k tokens that
followed it. The next step runs the sequence's last token and the k drafts as one
(k+1)-token query; the target model's choice at each position is compared with
the draft there: drafts are accepted up to the first mismatch, and the model's
own token at that position follows them, so every step yields 1 to k+1 tokens
and the output is exactly what decoding one token at a time would give.

Sampled sequences verify by rejection sampling (Leviathan et al., Chen et al.):
with p the target's distribution at a position (temperature, top-k/p, min-p
applied) and the draft a point mass, the draft is kept with probability p(draft);
if not, the token comes from p with the draft's mass removed, renormalised; after
k kept drafts the next token comes from p. Each position's token is then
distributed exactly as p, and a seeded request draws from its own generator.

Which sequences speculate: those with nothing that a per-position choice would
have to replay (no penalties, which depend on the tokens before each position;
no grammar, whose state would have to advance through the drafts; no logprobs;
no ``min_tokens``). Others decode as before, in the same batch.
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from worker.config import SpeculativeConfig
from worker.sequence import Sequence


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


def speculates(seq: Sequence) -> bool:
    """Whether a sequence's choice at each position depends on that position's logits
    alone."""
    params = seq.params
    return (
        params.repetition_penalty in (None, 1.0)
        and not params.presence_penalty
        and not params.frequency_penalty
        and params.logprobs is None
        and seq.constraint is None
        and params.min_tokens == 0
    )


def accepted_drafts(drafts: list[int], targets: list[int]) -> int:
    """How many drafts the model's choices (one per position, one more than drafts)
    confirm: up to the first that differs."""
    for i, (draft, target) in enumerate(zip(drafts, targets, strict=False)):
        if draft != target:
            return i
    return len(drafts)


def rejection_sample(
    probs: torch.Tensor, drafts: list[int], generator: torch.Generator | None
) -> list[int]:
    """The tokens a sampled sequence takes: ``probs`` [k + 1, vocab] is the target's
    distribution at each position, ``drafts`` the k proposed tokens."""
    draft_ids = torch.tensor(drafts, device=probs.device)
    kept = probs[torch.arange(len(drafts), device=probs.device), draft_ids]
    draws = torch.rand(len(drafts), generator=generator, device=probs.device)
    rejected = (draws >= kept).tolist()
    for position, was_rejected in enumerate(rejected):
        if was_rejected:
            residual = probs[position].clone()
            residual[drafts[position]] = 0.0
            token = torch.multinomial(residual, 1, generator=generator).item()
            return [*drafts[:position], int(token)]
    bonus = torch.multinomial(probs[len(drafts)], 1, generator=generator).item()
    return [*drafts, int(bonus)]


@dataclass
class SpecDecodeStats:
    """Running totals, named as vLLM's ``spec_decode_*`` metrics."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, proposed: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        if len(self.accepted_per_position) < proposed:
            self.accepted_per_position += [0] * (proposed - len(self.accepted_per_position))
        for position in range(accepted):
            self.accepted_per_position[position] += 1


class NgramProposer:
    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len

    def propose(self, seq: Sequence, running: int) -> list[int]:
        """Drafts for ``seq``'s next step, none where it may not speculate; never more
        than its remaining ``max_tokens`` (less the model's own token) or context."""
        config = self.config
        if config.disable_by_batch_size is not None and running > config.disable_by_batch_size:
            return []
        if not speculates(seq):
            return []
        room = self.max_model_len - seq.num_tokens - 1
        if seq.params.max_tokens is not None:
            room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
        k = min(config.num_speculative_tokens, room)
        if k <= 0:
            return []
        return propose_ngram(seq.token_ids, k, config.prompt_lookup_min, config.prompt_lookup_max)
