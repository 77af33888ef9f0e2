"""Per-request timings and the summary each system gets in the report."""

import statistics
from dataclasses import dataclass


@dataclass
class RequestTiming:
    arrival: float
    first_token: float
    finish: float
    output_tokens: int


@dataclass
class RunSummary:
    system: str
    output_tokens_per_s: float
    mean_latency: float
    p50_latency: float
    p99_latency: float
    mean_ttft: float
    p50_ttft: float
    mean_tpot: float
    kv_slots_used: int
    kv_slots_allocated: int


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(
    system: str, timings: list[RequestTiming], kv_slots_used: int, kv_slots_allocated: int
) -> RunSummary:
    latencies = [t.finish - t.arrival for t in timings]
    ttfts = [t.first_token - t.arrival for t in timings]
    makespan = max(t.finish for t in timings) - min(t.arrival for t in timings)
    tpots = [
        (t.finish - t.first_token) / (t.output_tokens - 1) for t in timings if t.output_tokens > 1
    ]
    return RunSummary(
        system=system,
        output_tokens_per_s=sum(t.output_tokens for t in timings) / makespan,
        mean_latency=statistics.fmean(latencies),
        p50_latency=_percentile(latencies, 0.5),
        p99_latency=_percentile(latencies, 0.99),
        mean_ttft=statistics.fmean(ttfts),
        p50_ttft=_percentile(ttfts, 0.5),
        mean_tpot=statistics.fmean(tpots),
        kv_slots_used=kv_slots_used,
        kv_slots_allocated=kv_slots_allocated,
    )
