"""The KV cache in the model's dtype against fp8 (``kv_cache_dtype``), same model.

Per cache: bytes per token, blocks at the default budget, the largest batch of
long requests (448 prompt + 64 output tokens) that runs without a preemption at a
small budget, batch-1 decode speed (median of three, the caches taking turns in
alternating order), the burst workload's throughput, and greedy agreement with
the model-dtype cache over chat replies (the share of each reply before its first
different token).
"""

import statistics

from rich.console import Console
from rich.table import Table
from transformers import PreTrainedTokenizerBase

from genfleet.bench.engine_driver import run_engine
from genfleet.bench.weights import QUESTIONS, agreement, decode_tokens_per_s, greedy_replies
from genfleet.bench.workloads import chat_prompt, make_workload
from worker import EngineConfig, LLMEngine, SamplingParams
from worker.device import dtype_name
from worker.execution.model_runner import kv_bytes_per_block

CACHES = ("auto", "fp8", "fp8_e5m2")
SMALL_BUDGET_GIB = 0.05
LONG_PROMPT, LONG_OUTPUT = 448, 64
ROUNDS = 3


def _largest_batch(config: EngineConfig, max_batch: int = 64) -> int:
    """The most long requests that run at once at SMALL_BUDGET_GIB without a preemption."""
    engine = LLMEngine(config.model_copy(update={"kv_cache_memory_gib": SMALL_BUDGET_GIB}))
    params = SamplingParams(temperature=0, max_tokens=LONG_OUTPUT, ignore_eos=True)
    best = 0
    for batch in range(1, max_batch + 1):
        before = engine.scheduler.num_preemptions
        for i in range(batch):
            engine.add_request(f"long-{batch}-{i}", [100 + i] * LONG_PROMPT, params)
        while engine.has_unfinished_requests():
            engine.step()
        if engine.scheduler.num_preemptions > before:
            break
        best = batch
    return best


def run_kv_cache(
    model: str, tokenizer: PreTrainedTokenizerBase, seed: int, console: Console
) -> int:
    configs = {c: EngineConfig(model=model, kv_cache_dtype=c, seed=seed) for c in CACHES}
    engines = {c: LLMEngine(config) for c, config in configs.items()}
    prompt = tokenizer.encode("Tell me a long story about a lighthouse keeper.")
    decode: dict[str, list[float]] = {c: [] for c in engines}
    for round_ in range(ROUNDS):
        for cache in CACHES if round_ % 2 == 0 else tuple(reversed(CACHES)):
            console.print(f"[dim]decode round {round_ + 1}: {cache}[/dim]")
            decode[cache].append(decode_tokens_per_s(engines[cache], prompt))
    burst = make_workload("burst", tokenizer, seed)
    throughput = {}
    for cache in reversed(CACHES):
        console.print(f"[dim]burst: {cache}[/dim]")
        throughput[cache] = run_engine(engines[cache], burst, cache).output_tokens_per_s
    chats = [chat_prompt(tokenizer, q) for q in QUESTIONS]
    replies = {cache: greedy_replies(engine, chats) for cache, engine in engines.items()}
    largest = {}
    for cache, config in configs.items():
        console.print(f"[dim]largest batch without preemption: {cache}[/dim]")
        largest[cache] = _largest_batch(config)
    table = Table(title=f"{model}: KV cache formats")
    columns = ("kv_cache_dtype", "element", "KiB/token", "blocks (1 GiB)",
               f"batch w/o preemption ({SMALL_BUDGET_GIB} GiB)", "decode tok/s",
               "burst tok/s", "greedy agreement")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column in columns[:2] else "right")
    for cache, engine in engines.items():
        per_token = (
            kv_bytes_per_block(engine.runner.model, engine.config) / engine.config.block_size
        )
        table.add_row(
            cache,
            dtype_name(engine.runner.kv_cache.dtype),
            f"{per_token / 1024:.1f}",
            str(engine.runner.num_blocks),
            str(largest[cache]),
            f"{statistics.median(decode[cache]):.1f}",
            f"{throughput[cache]:.1f}",
            f"{100 * agreement(replies[cache], replies['auto']):.0f}%",
        )
    console.print(table)
    blocks = engines["fp8"].runner.num_blocks / engines["auto"].runner.num_blocks
    console.print(f"fp8 blocks vs auto at one budget: x{blocks:.2f}")
    return 0
