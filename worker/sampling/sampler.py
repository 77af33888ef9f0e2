"""Batched token sampling: penalties, temperature, top-k / top-p / min-p, seeds, logprobs.

Every row is processed independently, so a seeded request draws the same
tokens whatever else shares its batch. Sampling uses the exponential race
(argmax of p / q with q ~ Exp(1)), which equals drawing from p and lets each
seeded row take its noise from its own generator.

On a GPU the step waits for the device once: the per-row options go over
without blocking, the decisions about which filters to run are taken from the
requests on the host, and the sampled ids (with their logprobs, when asked)
come back in one copy.
"""

import time
from dataclasses import dataclass

import torch

from worker.engine.sequence import Sequence
from worker.sampling.structured_output import apply_masks


@dataclass
class SampleResult:
    token_ids: list[int]
    # Per row: {token id: logprob} for the sampled token and the top alternatives.
    logprobs: list[dict[int, float] | None]
    # Time spent filling and applying grammar masks (0 without constrained rows).
    mask_seconds: float = 0.0


def _to_device(values: list, device: torch.device) -> torch.Tensor:
    """A host list as a device tensor, without waiting for the device."""
    return torch.tensor(values).to(device, non_blocking=True)


def _column(seqs: list[Sequence], attr: str, device: torch.device) -> torch.Tensor:
    return _to_device([getattr(s.params, attr) for s in seqs], device)


def _token_counts(rows: list[list[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[len(rows), vocab] how often each token occurs in each row."""
    counts = torch.zeros(len(rows), vocab_size, device=device)
    width = max((len(r) for r in rows), default=0)
    if width == 0:
        return counts
    ids = _to_device([r + [0] * (width - len(r)) for r in rows], device)
    present = _to_device([[1.0] * len(r) + [0.0] * (width - len(r)) for r in rows], device)
    return counts.scatter_add_(1, ids, present)


def apply_penalties(
    logits: torch.Tensor, seqs: list[Sequence], outputs: list[list[int]] | None = None
) -> torch.Tensor:
    """Repetition (prompt and output, as in HF), presence and frequency (output only, as
    OpenAI). ``outputs``: each row's output so far, where it is not its sequence's own
    (a verifying row counts the drafts before it)."""
    vocab, device = logits.shape[1], logits.device
    if outputs is None:
        outputs = [s.output_token_ids for s in seqs]
    output_counts = _token_counts(outputs, vocab, device)
    prompt_counts = _token_counts([s.prompt_token_ids for s in seqs], vocab, device)
    seen = (output_counts + prompt_counts) > 0
    repetition = _column(seqs, "repetition_penalty", device).float()[:, None]
    penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, penalized, logits)
    logits = logits - _column(seqs, "frequency_penalty", device)[:, None] * output_counts
    return logits - _column(seqs, "presence_penalty", device)[:, None] * (output_counts > 0)


def hold_back_stops(
    logits: torch.Tensor,
    seqs: list[Sequence],
    eos_token_ids: set[int],
    lengths: list[int] | None = None,
) -> torch.Tensor:
    """Rows short of their ``min_tokens`` cannot choose a stop token id, nor EOS unless
    ``ignore_eos`` (vLLM's rule). ``lengths``: each row's output length, where it is not
    its sequence's own (a verifying row counts the drafts before it)."""
    if lengths is None:
        lengths = [s.num_output_tokens for s in seqs]
    rows, columns = [], []
    for row, (seq, length) in enumerate(zip(seqs, lengths, strict=True)):
        params = seq.params
        if length >= params.min_tokens:
            continue
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else eos_token_ids)
        for token in stops:
            if 0 <= token < logits.shape[1]:
                rows.append(row)
                columns.append(token)
    if not rows:
        return logits
    held = logits.clone()
    held[rows, columns] = float("-inf")
    return held


def _filter(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Mask tokens outside top-k, top-p and min-p with -inf."""
    device = logits.device
    if any(s.params.top_k > 0 or s.params.top_p < 1 for s in seqs):
        top_k = _column(seqs, "top_k", device)
        top_p = _column(seqs, "top_p", device).float()
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        rank = torch.arange(logits.shape[1], device=device)[None, :]
        k = torch.where(top_k > 0, top_k, logits.shape[1])[:, None]
        cut = rank >= k
        probs = sorted_logits.masked_fill(cut, float("-inf")).softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        cut |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
        logits = logits.scatter(1, order, sorted_logits.masked_fill(cut, float("-inf")))
    if any(s.params.min_p > 0 for s in seqs):
        min_p = _column(seqs, "min_p", device).float()
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


def token_logprobs(
    raw_logits: torch.Tensor, seqs: list[Sequence], tokens: list[int]
) -> list[dict[int, float] | None]:
    """Each row's logprobs (its token's and the top alternatives), as ``sample`` gives them."""
    return _to_host(raw_logits, seqs, torch.tensor(tokens, device=raw_logits.device)).logprobs


def _to_host(raw_logits: torch.Tensor, seqs: list[Sequence], tokens: torch.Tensor) -> SampleResult:
    """The sampled ids and, where asked, logprobs of the model's raw distribution, in one
    device-to-host copy (float64 holds the ids and the fp32 logprobs exactly)."""
    if all(s.params.logprobs is None for s in seqs):
        return SampleResult(tokens.tolist(), [None] * len(seqs))
    logprobs = raw_logits.log_softmax(dim=-1)
    top_n = max(s.params.logprobs or 0 for s in seqs)
    top_values, top_ids = logprobs.topk(top_n, dim=-1)  # k=0: empty, nothing to pick
    chosen = logprobs.gather(1, tokens[:, None])
    columns = (tokens[:, None], chosen, top_values, top_ids)
    packed = torch.cat([c.double() for c in columns], dim=1).cpu()
    token_ids = packed[:, 0].long().tolist()
    chosen_values = packed[:, 1].tolist()
    alternatives_values = packed[:, 2 : 2 + top_n].tolist()
    alternatives_ids = packed[:, 2 + top_n :].long().tolist()
    result: list[dict[int, float] | None] = []
    for row, seq in enumerate(seqs):
        n = seq.params.logprobs
        if n is None:
            result.append(None)
            continue
        entry = {token_ids[row]: chosen_values[row]}
        entry.update(zip(alternatives_ids[row][:n], alternatives_values[row][:n], strict=True))
        result.append(entry)
    return SampleResult(token_ids, result)


def probabilities(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """The distribution each row samples from: temperature, then top-k / top-p / min-p
    (a greedy row at temperature 1: its argmax is what counts)."""
    greedy = _to_device([s.params.greedy for s in seqs], logits.device)
    temperature = _column(seqs, "temperature", logits.device).float()
    temperature = torch.where(greedy, 1.0, temperature)
    return _filter(logits / temperature[:, None], seqs).softmax(dim=-1)


def sample(
    logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: set[int] | None = None
) -> SampleResult:
    """Pick the next token of each row; logprobs are of the model's raw distribution.
    A constrained row picks among what its grammar allows: the mask comes first, so
    penalties, temperature and top-k/p act inside the allowed set; a row short of its
    ``min_tokens`` picks no stop token (``hold_back_stops``)."""
    raw_logits = logits
    began = time.perf_counter()
    logits = apply_masks(logits, seqs)
    mask_seconds = time.perf_counter() - began if logits is not raw_logits else 0.0
    if any(s.params.min_tokens for s in seqs):
        logits = hold_back_stops(logits, seqs, eos_token_ids or set())
    if any(s.params.uses_penalties for s in seqs):
        logits = apply_penalties(logits, seqs)
    tokens = logits.argmax(dim=-1)
    greedy_rows = [s.params.greedy for s in seqs]
    if not all(greedy_rows):
        greedy = _to_device(greedy_rows, logits.device)
        probs = probabilities(logits, seqs)
        sampled = (probs / _exponential_noise(probs, seqs)).argmax(dim=-1)
        tokens = torch.where(greedy, tokens, sampled)
    result = _to_host(raw_logits, seqs, tokens)
    result.mask_seconds = mask_seconds
    return result
