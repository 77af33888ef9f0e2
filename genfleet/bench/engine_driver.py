"""Feed a workload to the engine in real time and time every request."""

import time
from collections.abc import Callable

from genfleet.bench.metrics import RequestTiming, RunSummary, summarize
from genfleet.bench.workloads import BenchRequest
from worker import LLMEngine, SamplingParams


def fixed_length(request: BenchRequest, index: int) -> SamplingParams:
    """Greedy, exactly the request's output length: the workloads' default."""
    return SamplingParams(temperature=0, max_tokens=request.output_len, ignore_eos=True)


def run_engine(
    engine: LLMEngine,
    requests: list[BenchRequest],
    label: str,
    params_for: Callable[[BenchRequest, int], SamplingParams] = fixed_length,
) -> RunSummary:
    pool = engine.block_manager
    first_token: dict[str, float] = {}
    timings: dict[str, RequestTiming] = {}
    peak_blocks, peak_tokens = 0, 0
    start = time.perf_counter()
    next_request = 0
    while next_request < len(requests) or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while next_request < len(requests) and requests[next_request].arrival <= now:
            request = requests[next_request]
            params = params_for(request, next_request)
            engine.add_request(str(next_request), request.prompt_token_ids, params)
            next_request += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, requests[next_request].arrival - now))
            continue
        deltas = engine.step()
        now = time.perf_counter() - start
        used_blocks = pool.num_blocks - pool.num_free_blocks
        if used_blocks > peak_blocks:
            peak_blocks = used_blocks
            # Shared prefix blocks are full; only each sequence's last block has empty slots.
            empty = sum(
                len(s.block_ids) * pool.block_size - s.num_computed_tokens
                for s in engine.scheduler.running
            )
            peak_tokens = used_blocks * pool.block_size - empty
        for delta in deltas:
            first_token.setdefault(delta.request_id, now)
            if delta.finished:
                request = requests[int(delta.request_id)]
                timings[delta.request_id] = RequestTiming(
                    request.arrival,
                    first_token[delta.request_id],
                    now,
                    delta.usage.completion_tokens,
                )
    return summarize(label, list(timings.values()), peak_tokens, peak_blocks * pool.block_size)
