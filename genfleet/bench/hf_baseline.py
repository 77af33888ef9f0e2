"""Hugging Face transformers as a server would use it without continuous batching.

One batch at a time, left-padded: a batch starts when it is full or when no
more requests will come, and runs until its longest request ends; every
request of the batch is answered at that end.
"""

import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from genfleet.bench.metrics import RequestTiming, RunSummary, summarize
from genfleet.bench.workloads import BenchRequest


class _FirstStepClock(LogitsProcessor):
    """Records when generate produced its first token (after the prefill)."""

    def __init__(self) -> None:
        self.first: float | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.first is None:
            self.first = time.perf_counter()
        return scores


def load_hf_model(model: Path, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """transformers' model of a folder, or of a GGUF file (de-quantized: the same weights)."""
    if model.is_file():
        source = AutoModelForCausalLM.from_pretrained(
            model.parent, gguf_file=model.name, dtype=dtype
        )
    else:
        source = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    return source.to(device).eval()


def _generate(model: torch.nn.Module, batch: list[BenchRequest], pad_id: int) -> float:
    """Run one left-padded batch; return the perf_counter time of its first token."""
    width = max(len(r.prompt_token_ids) for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long, device=model.device)
    mask = torch.zeros_like(ids)
    for row, request in enumerate(batch):
        n = len(request.prompt_token_ids)
        ids[row, width - n :] = torch.tensor(request.prompt_token_ids, device=model.device)
        mask[row, width - n :] = 1
    longest = max(r.output_len for r in batch)
    clock = _FirstStepClock()
    with torch.inference_mode():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=longest,
            min_new_tokens=longest,  # ignore EOS, like the engine's ignore_eos
            do_sample=False,
            pad_token_id=pad_id,
            logits_processor=LogitsProcessorList([clock]),
        )
    assert clock.first is not None
    return clock.first


def run_hf(
    model: torch.nn.Module, requests: list[BenchRequest], batch_size: int, label: str
) -> RunSummary:
    pad_id = model.generation_config.pad_token_id or 0
    timings: list[RequestTiming] = []
    peak_used, peak_allocated = 0, 0
    start = time.perf_counter()
    served = 0
    while served < len(requests):
        now = time.perf_counter() - start
        arrived = sum(1 for r in requests if r.arrival <= now) - served
        last_ones = served + arrived == len(requests)
        if arrived < batch_size and not last_ones:
            time.sleep(max(0.0, requests[served + arrived].arrival - now))
            continue
        batch = requests[served : served + min(batch_size, arrived)]
        first = _generate(model, batch, pad_id) - start
        finish = time.perf_counter() - start
        for request in batch:
            timings.append(RequestTiming(request.arrival, first, finish, request.output_len))
        width = max(len(r.prompt_token_ids) for r in batch) + max(r.output_len for r in batch)
        used = sum(len(r.prompt_token_ids) + r.output_len for r in batch)
        if width * len(batch) > peak_allocated:
            peak_used, peak_allocated = used, width * len(batch)
        served += len(batch)
    return summarize(label, timings, peak_used, peak_allocated)
