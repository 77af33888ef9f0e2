"""Batched token sampling: penalties, temperature, top-k / top-p / min-p, seeds, logprobs.

Every row is processed independently, so a seeded request draws the same
tokens whatever else shares its batch. Sampling uses the exponential race
(argmax of p / q with q ~ Exp(1)), which equals drawing from p and lets each
seeded row take its noise from its own generator.
"""

from dataclasses import dataclass

import torch

from worker.sequence import Sequence


@dataclass
class SampleResult:
    token_ids: list[int]
    # Per row: {token id: logprob} for the sampled token and the top alternatives.
    logprobs: list[dict[int, float] | None]


def _column(seqs: list[Sequence], attr: str, device: torch.device) -> torch.Tensor:
    return torch.tensor([getattr(s.params, attr) for s in seqs], device=device)


def _token_counts(rows: list[list[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[len(rows), vocab] how often each token occurs in each row."""
    counts = torch.zeros(len(rows), vocab_size, device=device)
    width = max((len(r) for r in rows), default=0)
    if width == 0:
        return counts
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=device)
    present = torch.tensor([[1.0] * len(r) + [0.0] * (width - len(r)) for r in rows], device=device)
    return counts.scatter_add_(1, ids, present)


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Repetition (prompt and output, as in HF), presence and frequency (output only, as OpenAI)."""
    vocab, device = logits.shape[1], logits.device
    output_counts = _token_counts([s.output_token_ids for s in seqs], vocab, device)
    prompt_counts = _token_counts([s.prompt_token_ids for s in seqs], vocab, device)
    seen = (output_counts + prompt_counts) > 0
    repetition = _column(seqs, "repetition_penalty", device).float()[:, None]
    penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, penalized, logits)
    logits = logits - _column(seqs, "frequency_penalty", device)[:, None] * output_counts
    return logits - _column(seqs, "presence_penalty", device)[:, None] * (output_counts > 0)


def _filter(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Mask tokens outside top-k, top-p and min-p with -inf."""
    device = logits.device
    top_k = _column(seqs, "top_k", device)
    top_p = _column(seqs, "top_p", device).float()
    if bool(((top_k > 0) | (top_p < 1)).any()):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        rank = torch.arange(logits.shape[1], device=device)[None, :]
        k = torch.where(top_k > 0, top_k, logits.shape[1])[:, None]
        cut = rank >= k
        probs = sorted_logits.masked_fill(cut, float("-inf")).softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        cut |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
        logits = logits.scatter(1, order, sorted_logits.masked_fill(cut, float("-inf")))
    min_p = _column(seqs, "min_p", device).float()
    if bool((min_p > 0).any()):
        probs = logits.softmax(dim=-1)
        threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


def _exponential_noise(probs: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    noise = torch.empty_like(probs).exponential_()
    for row, seq in enumerate(seqs):
        if seq.generator is not None:
            noise[row].exponential_(generator=seq.generator)
    return noise


def _logprobs(
    raw_logits: torch.Tensor, seqs: list[Sequence], tokens: torch.Tensor
) -> list[dict[int, float] | None]:
    if all(s.params.logprobs is None for s in seqs):
        return [None] * len(seqs)
    logprobs = raw_logits.log_softmax(dim=-1)
    top_n = max(s.params.logprobs or 0 for s in seqs)
    top_values, top_ids = logprobs.topk(top_n, dim=-1)  # k=0: empty, nothing to pick
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
    result: list[dict[int, float] | None] = []
    for row, seq in enumerate(seqs):
        n = seq.params.logprobs
        if n is None:
            result.append(None)
            continue
        entry = {int(tokens[row]): chosen[row]}
        if n:
            entry.update(zip(top_ids[row, :n].tolist(), top_values[row, :n].tolist(), strict=True))
        result.append(entry)
    return result


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
    """Pick the next token of each row; logprobs are of the model's raw distribution."""
    raw_logits = logits
    if any(s.params.uses_penalties for s in seqs):
        logits = apply_penalties(logits, seqs)
    greedy = torch.tensor([s.params.greedy for s in seqs], device=logits.device)
    tokens = logits.argmax(dim=-1)
    if not bool(greedy.all()):
        temperature = _column(seqs, "temperature", logits.device).float()
        temperature = torch.where(greedy, 1.0, temperature)
        probs = _filter(logits / temperature[:, None], seqs).softmax(dim=-1)
        sampled = (probs / _exponential_noise(probs, seqs)).argmax(dim=-1)
        tokens = torch.where(greedy, tokens, sampled)
    return SampleResult(tokens.tolist(), _logprobs(raw_logits, seqs, tokens))
