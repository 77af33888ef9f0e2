"""``genfleet bench --structured``: the burst workload with half its requests constrained by a
JSON Schema, against the same workload unconstrained, on one engine in the same run.

The schema is an array that cannot end before every request's output length, so
constrained requests run exactly as many tokens as unconstrained ones: the runs
differ only by the masks. Their grammar is compiled before the timed runs (its
compile time is printed), as a fleet's cache would hold it.
"""

import time

from rich.console import Console
from rich.table import Table

from genfleet.bench.engine_driver import fixed_length, run_engine
from genfleet.bench.metrics import RunSummary
from genfleet.bench.workloads import OUTPUT_TOKENS, BenchRequest
from queue_schemas import StructuredOutputs
from worker import LLMEngine, SamplingParams

# Every item is at least two tokens, so the output cannot end within the longest request.
WORDS = StructuredOutputs(
    json={
        "type": "object",
        "properties": {
            "words": {
                "type": "array",
                "items": {"type": "string", "maxLength": 12},
                "minItems": OUTPUT_TOKENS[1],
            }
        },
        "required": ["words"],
    }
)
ROUNDS = 4


def _half_constrained(request: BenchRequest, index: int) -> SamplingParams:
    params = fixed_length(request, index)
    if index % 2:
        params.structured_outputs = WORDS
    return params


def _free_run(engine: LLMEngine, requests: list[BenchRequest]) -> RunSummary:
    return run_engine(engine, requests, "unconstrained")


def _masked_run(engine: LLMEngine, requests: list[BenchRequest]) -> tuple[RunSummary, float]:
    """The half-constrained run, and its mask seconds per step that held constrained rows."""
    engine.mask_seconds, engine.masked_steps = 0.0, 0
    summary = run_engine(engine, requests, "half JSON Schema", _half_constrained)
    return summary, engine.mask_seconds / max(1, engine.masked_steps)


def run_structured(engine: LLMEngine, requests: list[BenchRequest], console: Console) -> int:
    assert engine.grammars is not None, "the benchmark's model has a tokenizer"
    began = time.perf_counter()
    engine.grammars.compile(WORDS)
    compile_s = time.perf_counter() - began
    console.print(f"[dim]warm-up: the workload once, {engine.config.dtype}, not shown[/dim]")
    run_engine(engine, requests, "warm-up")
    rows: list[tuple[RunSummary, RunSummary, float]] = []
    for round_ in range(ROUNDS):
        # Each round swaps which run goes first, so drift and what the previous run
        # left in the prefix cache fall on both.
        if round_ % 2:
            console.print(f"[dim]round {round_ + 1}: half constrained, then unconstrained[/dim]")
            (masked, mask_s), free = _masked_run(engine, requests), _free_run(engine, requests)
        else:
            console.print(f"[dim]round {round_ + 1}: unconstrained, then half constrained[/dim]")
            free, (masked, mask_s) = _free_run(engine, requests), _masked_run(engine, requests)
        rows.append((free, masked, mask_s))
    title = f"burst: {len(requests)} requests, every other one constrained, {engine.config.dtype}"
    table = Table(title=title)
    for column in ("round", "unconstrained tok/s", "constrained tok/s", "ratio", "mask ms/step"):
        table.add_column(column, justify="right")
    for round_, (free, masked, mask_s) in enumerate(rows, 1):
        table.add_row(
            str(round_),
            f"{free.output_tokens_per_s:.1f}",
            f"{masked.output_tokens_per_s:.1f}",
            f"x{masked.output_tokens_per_s / free.output_tokens_per_s:.3f}",
            f"{1000 * mask_s:.2f}",
        )
    console.print(table)
    console.print(
        f"the schema compiled in {1000 * compile_s:.0f} ms, with the tokenizer's vocabulary "
        "table (built once per engine); cached after"
    )
    return 0
