"""Verifying drafts against the target model, whoever proposed them.

A step runs the sequence's last token and the k drafts as one
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

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from worker.engine.block_manager import BlockManager
from worker.engine.output_processor import append_token
from worker.engine.sequence import Sequence
from worker.sampling.sampler import apply_penalties, hold_back_stops, probabilities, token_logprobs
from worker.sampling.structured_output import masks_along

# A verifying sequence, the tokens it takes, and their logprobs.
Verified = tuple[Sequence, list[int], list[dict[int, float] | None]]


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


class Verifier:
    """A step's verification: which logits rows sample one token and which verify
    drafts (``split``), and the verified tokens appended (``accept``)."""

    def __init__(
        self, block_manager: BlockManager, eos_token_ids: set[int], max_model_len: int
    ) -> None:
        self.block_manager = block_manager
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.stats = SpecDecodeStats()

    def split(
        self, logits: torch.Tensor, sampling: list[Sequence]
    ) -> tuple[list[Sequence], list[int], list[Verified]]:
        """The sequences that sample one token, and their logits rows; and those that
        verify drafts, with the tokens they take (drafts kept, then the model's own) and
        their logprobs."""
        plain: list[Sequence] = []
        plain_rows: list[int] = []
        verifying: list[tuple[Sequence, int]] = []
        row = 0
        for seq in sampling:
            if seq.draft_token_ids:
                verifying.append((seq, row))
            else:
                plain.append(seq)
                plain_rows.append(row)
            row += 1 + len(seq.draft_token_ids)
        if not verifying:
            return plain, plain_rows, []
        # One argmax over every row: a greedy row without penalties or grammar chooses it.
        choices = logits.argmax(dim=-1).tolist()
        verified = []
        for seq, first in verifying:
            width = 1 + len(seq.draft_token_ids)
            rows = logits[first : first + width]
            choice = choices[first : first + width]
            verified.append((seq, *verify(rows, seq, choice, self.eos_token_ids)))
        return plain, plain_rows, verified

    def accept(
        self, seq: Sequence, tokens: list[int], logprobs: list[dict[int, float] | None]
    ) -> Iterator[tuple[int, bool]]:
        """Append a verifying sequence's tokens (the drafts it kept, then one of the
        model's own) up to where it stops, yielding each with whether it finished the
        sequence: the engine emits one delta per token, so a regenerated job's events
        group its tokens as any other attempt's do. The rejected drafts' cache slots are
        the next step's to write."""
        drafts, seq.draft_token_ids = seq.draft_token_ids, []
        self.stats.record(len(drafts), len(tokens) - 1)
        computed = seq.num_tokens + len(tokens) - 1  # the last token and the kept drafts
        # A draft model saw the drafts: its cache stands up to the last one kept.
        seq.num_draft_computed_tokens = min(seq.num_draft_computed_tokens, computed)
        for position, (token, chosen) in enumerate(zip(tokens, logprobs, strict=True)):
            finished = append_token(seq, token, chosen, self.eos_token_ids, self.max_model_len)
            if finished or position == len(tokens) - 1:
                seq.num_computed_tokens = min(computed, seq.num_tokens)
                self.block_manager.register_computed_blocks(seq)
            yield token, finished
            if finished:
                return
