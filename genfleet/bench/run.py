"""``genfleet bench``: one seeded workload, the engine and the HF baselines, one table."""

import argparse
import statistics
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich.console import Console
from rich.table import Table
from transformers import PreTrainedTokenizerBase

from genfleet.bench.engine_driver import run_engine
from genfleet.bench.hf_baseline import load_hf_model, run_hf
from genfleet.bench.metrics import RunSummary
from genfleet.bench.options import engine_flags
from genfleet.bench.workloads import OUTPUT_TOKENS, BenchRequest, make_workload
from worker import EngineConfig, LLMEngine, SamplingParams
from worker.device import DTYPES
from worker.engine.tokenizer import load_tokenizer
from worker.model_fetch import resolve_model

if TYPE_CHECKING:
    from worker.service.settings import WorkerSettings

BASELINE_BATCH = {"single": 1, "static8": 8, "static20": 20}
# Poisson arrivals at this fraction of the engine's burst throughput: near capacity.
CAPACITY_FRACTION = 0.9


def _split(value: str, known: Collection[str]) -> list[str]:
    items = [item.strip() for item in value.split(",") if item.strip()]
    unknown = [item for item in items if item not in known]
    if unknown:
        raise ValueError(f"unknown choice(s) {unknown}; known: {sorted(known)}")
    return items


def _kv_cell(r: RunSummary) -> str:
    if not r.kv_slots_allocated:  # a server measured from outside (--serve) does not say
        return "-"
    share = r.kv_slots_used / r.kv_slots_allocated
    return f"{r.kv_slots_used}/{r.kv_slots_allocated} ({share:.0%})"


def _table(title: str, rows: list[RunSummary]) -> Table:
    table = Table(title=title)
    for column in (
        "system", "out tok/s", "mean lat s", "p50 s", "p99 s", "TTFT s", "TPOT ms", "KV used/alloc",
    ):  # fmt: skip
        # Narrow terminals wrap a cell (a --serve URL, the KV figures) rather than cut it.
        justify = "left" if column == "system" else "right"
        table.add_column(column, justify=justify, overflow="fold")
    for r in rows:
        table.add_row(
            r.system,
            f"{r.output_tokens_per_s:.1f}",
            f"{r.mean_latency:.2f}",
            f"{r.p50_latency:.2f}",
            f"{r.p99_latency:.2f}",
            f"{r.mean_ttft:.2f}",
            f"{r.mean_tpot * 1000:.1f}",
            _kv_cell(r),
        )
    return table


def verdict(rows: list[RunSummary]) -> str:
    engines = [r for r in rows if r.system.startswith("genfleet")]
    baselines = [r for r in rows if not r.system.startswith("genfleet")]
    if not engines or not baselines:
        return ""
    engine = max(engines, key=lambda r: r.output_tokens_per_s)
    best = max(baselines, key=lambda r: r.output_tokens_per_s)
    speedup = engine.output_tokens_per_s / best.output_tokens_per_s
    latency_cut = 1 - engine.mean_latency / best.mean_latency
    return (
        f"{engine.system} vs best HF baseline {best.system}: "
        f"throughput x{speedup:.2f}, mean latency {100 * latency_cut:.0f}% lower"
    )


def warm(engine: LLMEngine) -> None:
    engine.add_request("warmup", [1] * 64, SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


def poisson_rate(burst_tokens_per_s: float) -> float:
    return CAPACITY_FRACTION * burst_tokens_per_s / statistics.fmean(OUTPUT_TOKENS)


def run_benchmark(args: argparse.Namespace) -> int:
    workloads = _split(args.workloads, {"burst", "poisson"})
    if "poisson" in workloads and args.rate is None and workloads[0] != "burst":
        raise ValueError("poisson needs --rate, or the burst workload first to measure capacity")
    folder = resolve_model(args.model)
    tokenizer = load_tokenizer(folder)
    if tokenizer is None:
        raise ValueError("the benchmark needs a model folder with a tokenizer")
    console = Console()
    if args.serve:
        return _serve_benchmark(args, workloads, tokenizer, console)
    if args.batch_mix:
        from genfleet.bench.batch_mix import run_batch_mix
        from genfleet.bench.fleet import worker_flags

        flags = worker_flags(_worker_settings(args, folder))
        window = args.batch_max_in_flight
        return run_batch_mix(folder, flags, args.model, tokenizer, args.seed, window, console)
    if args.conversations:
        from genfleet.bench.conversations import run_conversations
        from genfleet.bench.fleet import worker_flags

        flags = worker_flags(_worker_settings(args, folder))
        return run_conversations(folder, args.model, flags, args.seed, args.rounds, console)
    if args.agreement or args.vs_llama_cpp:  # batch 1: the fp32 model's tokens, llama.cpp
        from genfleet.bench import agreement, vs_llama_cpp

        if args.agreement:
            return agreement.run_agreement(args.model, tokenizer, console)
        venv, install = args.llama_cpp_venv, args.install_llama_cpp
        return vs_llama_cpp.run_vs_llama_cpp(args.model, tokenizer, venv, install, console)
    if args.weights:
        from genfleet.bench.weights import run_weights

        return run_weights(args.model, tokenizer, args.seed, console)
    if args.speculative:
        from genfleet.bench.speculative import run_speculative

        config = EngineConfig(**engine_flags(args)).speculative_config
        return run_speculative(args.model, tokenizer, args.seed, console, config)
    if args.families or args.experts:
        from genfleet.bench.experts import run_experts
        from genfleet.bench.families import run_families

        (dtype,) = _split(args.dtypes or "bfloat16", DTYPES)
        run = run_families if args.families else run_experts
        return run(tokenizer, args.seed, dtype, console)
    if args.kv_cache:
        from genfleet.bench.kv_cache import run_kv_cache

        return run_kv_cache(args.model, tokenizer, args.seed, console)
    if args.fleet:
        return _fleet_benchmark(args, workloads, folder, tokenizer, console)
    if args.structured:
        return _structured_benchmark(args, folder, tokenizer, console)
    return _engine_benchmark(args, workloads, folder, tokenizer, console)


def _engine_benchmark(
    args: argparse.Namespace,
    workloads: list[str],
    folder: Path,
    tokenizer: PreTrainedTokenizerBase,
    console: Console,
) -> int:
    """The engine in each dtype against the transformers baselines, one table a workload."""
    baselines = _split(args.baselines, BASELINE_BATCH)
    dtypes = _split(args.dtypes or "float32,bfloat16", DTYPES)
    engines = {}
    for dtype in dtypes:
        engines[dtype] = LLMEngine(_engine_config(args, folder, dtype))
        warm(engines[dtype])
    hf_models = {
        dtype: load_hf_model(folder, DTYPES[dtype], engines[dtype].config.device)
        for dtype in dtypes
        if baselines
    }
    rate = args.rate
    for workload in workloads:
        requests = make_workload(workload, tokenizer, args.seed, rate)
        rows = []
        for dtype, engine in engines.items():
            console.print(f"[dim]{workload}: genfleet {dtype}[/dim]")
            rows.append(run_engine(engine, requests, f"genfleet {dtype}"))
        for baseline in baselines:
            for dtype, model in hf_models.items():
                console.print(f"[dim]{workload}: HF {baseline} {dtype}[/dim]")
                with torch.inference_mode():
                    rows.append(
                        run_hf(model, requests, BASELINE_BATCH[baseline], f"HF {baseline} {dtype}")
                    )
        title = f"{workload}: {len(requests)} requests"
        if workload == "poisson":
            title += f" at {rate:.2f} req/s"
        console.print(_table(title, rows))
        console.print(verdict(rows))
        if workload == "burst" and rate is None:
            best = max(r.output_tokens_per_s for r in rows if r.system.startswith("genfleet"))
            rate = poisson_rate(best)
    return 0


def _structured_benchmark(
    args: argparse.Namespace, folder: Path, tokenizer: PreTrainedTokenizerBase, console: Console
) -> int:
    from genfleet.bench.structured import run_structured

    dtypes = _split(args.dtypes, DTYPES) if args.dtypes else ["auto"]
    if len(dtypes) != 1:
        raise ValueError("--structured runs one dtype: pass --dtypes with one of them")
    engine = LLMEngine(_engine_config(args, folder, dtypes[0]))  # auto: the worker's choice
    warm(engine)
    return run_structured(engine, make_workload("burst", tokenizer, args.seed), console)


def _engine_config(args: argparse.Namespace, folder: Path, dtype: str) -> EngineConfig:
    """The offline engine under test: the engine flags given, the bench's seed."""
    return EngineConfig(model=str(folder), dtype=dtype, seed=args.seed, **engine_flags(args))


def _worker_settings(args: argparse.Namespace, folder: Path) -> "WorkerSettings":
    """The fleet's worker, as the flags ask for it: one dtype (bf16 unless named)."""
    from worker.service.settings import WorkerSettings

    dtypes = _split(args.dtypes or "bfloat16", DTYPES)
    if len(dtypes) != 1:
        raise ValueError("the fleet runs one dtype: pass --dtypes with one of them")
    return WorkerSettings(
        **engine_flags(args),
        model=str(folder),
        dtype=dtypes[0],
        stream_interval=args.stream_interval,
        engine_threads=args.engine_threads,
    )


def _serve_benchmark(
    args: argparse.Namespace,
    workloads: list[str],
    tokenizer: PreTrainedTokenizerBase,
    console: Console,
) -> int:
    """A running server on each workload; Poisson's rate from its burst unless given."""
    from genfleet.bench.serve import run_serve

    model, rate = args.served_model or args.model, args.rate
    for workload in workloads:
        requests = make_workload(workload, tokenizer, args.seed, rate)
        (summary,) = run_serve(args.serve, model, {workload: requests}, console).values()
        title = f"{workload}: {len(requests)} requests"
        if workload == "poisson":
            title += f" at {rate:.2f} req/s"
        elif rate is None:
            rate = poisson_rate(summary.output_tokens_per_s)
        console.print(_table(title, [summary]))
        console.print(
            f"{workload}: {summary.output_tokens_per_s:.1f} output tok/s, TTFT p50 "
            f"{summary.p50_ttft:.2f} s (mean {summary.mean_ttft:.2f} s)",
            highlight=False,
        )
    return 0


def _fleet_benchmark(
    args: argparse.Namespace,
    workloads: list[str],
    folder: Path,
    tokenizer: PreTrainedTokenizerBase,
    console: Console,
) -> int:
    """The offline engine on each workload, then the fleet on the same requests."""
    # The fleet's modules (Kafka, the wire schemas) only where the fleet runs.
    from genfleet.bench.fleet import run_fleet, worker_flags

    settings = _worker_settings(args, folder)
    dtype = settings.dtype
    engine = LLMEngine(settings.engine_config())  # exactly the worker's engine
    warm(engine)
    rate = args.rate
    requests: dict[str, list[BenchRequest]] = {}
    offline: dict[str, RunSummary] = {}
    for workload in workloads:
        requests[workload] = make_workload(workload, tokenizer, args.seed, rate)
        console.print(f"[dim]{workload}: genfleet offline {dtype}[/dim]")
        offline[workload] = run_engine(engine, requests[workload], f"genfleet offline {dtype}")
        if workload == "burst" and rate is None:
            rate = poisson_rate(offline[workload].output_tokens_per_s)
    del engine
    console.print(f"[dim]starting the fleet; then {', '.join(workloads)} over HTTP[/dim]")
    flags = worker_flags(settings)
    fleet = run_fleet(folder, flags, requests, args.model)
    for workload in workloads:
        alone, through = offline[workload], fleet[workload]
        title = f"{workload}: {len(requests[workload])} requests"
        if workload == "poisson":
            title += f" at {rate:.2f} req/s"
        console.print(_table(title, [alone, through.summary]))
        legs, row = through.breakdown, through.summary
        console.print(
            f"fleet/offline throughput x{row.output_tokens_per_s / alone.output_tokens_per_s:.2f}; "
            f"added TTFT p50 {1000 * (row.p50_ttft - alone.p50_ttft):+.0f} ms, "
            f"mean {1000 * (row.mean_ttft - alone.mean_ttft):+.0f} ms; "
            f"fleet TTFT p50 legs: to API {1000 * legs.to_api:.0f} ms, "
            f"to worker {1000 * legs.to_worker:.0f} ms, "
            f"in engine {1000 * legs.in_engine:.0f} ms, back {1000 * legs.back:.0f} ms"
        )
    return 0
