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

Every sequence speculates, whatever its sampling asks: each verifying position is
scored as a one-token step there would be. Penalties count the drafts before the
position as output; a grammar's mask at a position is its state after the drafts
before it (proposals are cut to what the grammar takes, short of its end);
logprobs are the target's at each position kept; ``min_tokens`` and stops are
checked token by token as the kept tokens are appended.
"""

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from worker.config import SpeculativeConfig
from worker.sampler import apply_penalties, hold_back_stops, probabilities, token_logprobs
from worker.sequence import Sequence
from worker.structured_output import masks_along


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


def verify(
    logits: torch.Tensor, seq: Sequence, choices: list[int] | None, eos_token_ids: set[int]
) -> tuple[list[int], list[dict[int, float] | None]]:
    """The tokens a verifying sequence takes (drafts kept, then one of the model's own)
    and their logprobs where asked. ``logits`` [k + 1, vocab] are the model's raw rows
    at its positions; ``choices`` their argmax, when already at hand."""
    drafts = seq.draft_token_ids
    rows = [seq] * (len(drafts) + 1)
    scored = logits
    if seq.constraint is not None:
        scored = masks_along(scored, seq.constraint, drafts)
    if seq.num_output_tokens < seq.params.min_tokens:
        lengths = [seq.num_output_tokens + j for j in range(len(rows))]
        scored = hold_back_stops(scored, rows, eos_token_ids, lengths)
    if seq.params.uses_penalties:
        outputs = seq.output_token_ids
        scored = apply_penalties(scored, rows, [outputs + drafts[:j] for j in range(len(rows))])
    if not seq.params.greedy:
        tokens = rejection_sample(probabilities(scored, rows), drafts, seq.generator)
    else:
        if scored is not logits or choices is None:
            choices = scored.argmax(dim=-1).tolist()
        accepted = accepted_drafts(drafts, choices)
        tokens = [*drafts[:accepted], choices[accepted]]
    if seq.params.logprobs is None:
        return tokens, [None] * len(tokens)
    return tokens, token_logprobs(logits[: len(tokens)], rows[: len(tokens)], tokens)


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
