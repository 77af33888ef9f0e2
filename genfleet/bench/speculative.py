"""The engine with speculative decoding (n-gram or a draft model) against the same
engine without it.

Workloads, each run by both engines in alternating order, three times:
- ``copying``: batch-1 requests whose answers copy their prompt: a passage to
  repeat, one to return with its typos fixed, a Python function to return with a
  variable renamed (vLLM measures n-gram proposals on such edits);
- ``chat``: batch-1 open-ended questions, which copy little;
- ``burst``: the 20-request burst at once; ``batch64``: 64 such requests at once.
Greedy, fixed output lengths (``ignore_eos``). Each engine runs a workload once
untimed first (a warm-up, as vLLM's latency benchmark does: an engine's first
steps of a new shape, and prompts not yet in its prefix cache, cost more on
either side). Per workload: output tokens/s of each engine, their ratio, and the
share of draft tokens accepted.
"""

import inspect
import json
import statistics
import textwrap
import time

from rich.console import Console
from rich.table import Table
from transformers import PreTrainedTokenizerBase

from genfleet.bench.weights import QUESTIONS
from genfleet.bench.workloads import chat_prompt, english_passages, make_workload
from worker import EngineConfig, LLMEngine, SamplingParams
from worker.config import SpeculativeConfig

DEFAULT = SpeculativeConfig(
    num_speculative_tokens=5, prompt_lookup_max=6, prompt_lookup_min=3, disable_by_batch_size=8
)
ROUNDS = 3
BATCH_1_TOKENS = 128


def _copying_messages() -> list[str]:
    passage = " ".join(english_passages()[3].split()[:120])
    typos = passage.replace(" the ", " teh ").replace(" and ", " adn ")
    source = textwrap.dedent(inspect.getsource(textwrap.dedent))
    return [
        f"Repeat the following text exactly, word for word:\n\n{passage}",
        f"Fix the typos in this text and return all of it:\n\n{typos}",
        f"Rename the variable `lines` to `rows` and return the whole function:\n\n{source}",
    ]


def _one_at_a_time(engine: LLMEngine, prompts: list[list[int]]) -> tuple[int, float]:
    params = SamplingParams(temperature=0, max_tokens=BATCH_1_TOKENS, ignore_eos=True)
    tokens, started = 0, time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"one-{i}", prompt, params)
        while engine.has_unfinished_requests():
            tokens += sum(len(d.new_token_ids) for d in engine.step())
    return tokens, time.perf_counter() - started


def _all_at_once(
    engine: LLMEngine, prompts: list[list[int]], lengths: list[int]
) -> tuple[int, float]:
    tokens, started = 0, time.perf_counter()
    for i, (prompt, length) in enumerate(zip(prompts, lengths, strict=True)):
        params = SamplingParams(temperature=0, max_tokens=length, ignore_eos=True)
        engine.add_request(f"all-{i}", prompt, params)
    while engine.has_unfinished_requests():
        tokens += sum(len(d.new_token_ids) for d in engine.step())
    return tokens, time.perf_counter() - started


def run_speculative(
    model: str,
    tokenizer: PreTrainedTokenizerBase,
    seed: int,
    console: Console,
    config: SpeculativeConfig | None,
) -> int:
    config = config or DEFAULT
    method = str(config.method)
    engines = {
        "plain": LLMEngine(EngineConfig(model=model, seed=seed, max_num_seqs=64)),
        method: LLMEngine(
            EngineConfig(model=model, seed=seed, max_num_seqs=64, speculative_config=config)
        ),
    }
    burst = make_workload("burst", tokenizer, seed)
    wide = [make_workload("burst", tokenizer, seed + s) for s in range(4)]
    copying = [chat_prompt(tokenizer, c) for c in _copying_messages()]
    chats = [chat_prompt(tokenizer, q) for q in QUESTIONS[:4]]
    workloads = {
        "copying (batch 1)": lambda e: _one_at_a_time(e, copying),
        "chat (batch 1)": lambda e: _one_at_a_time(e, chats),
        "burst (20)": lambda e: _all_at_once(
            e, [r.prompt_token_ids for r in burst], [r.output_len for r in burst]
        ),
        "batch of 64": lambda e: _all_at_once(
            e, [r.prompt_token_ids for w in wide for r in w][:64],
            [r.output_len for w in wide for r in w][:64],
        ),
    }  # fmt: skip
    settings = json.dumps(config.model_dump(exclude_none=True))
    table = Table(title=f"{model}: speculative decoding {settings}")
    for column in ("workload", "plain tok/s", f"{method} tok/s", "ratio", "accepted"):
        table.add_column(column, justify="left" if column == "workload" else "right")
    for name, run in workloads.items():
        speeds: dict[str, list[float]] = {label: [] for label in engines}
        for label, engine in engines.items():
            console.print(f"[dim]{name}, warm-up: {label}[/dim]")
            run(engine)
        stats = engines[method].spec_stats
        drafted, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
        for round_ in range(ROUNDS):
            for label in ("plain", method) if round_ % 2 == 0 else (method, "plain"):
                console.print(f"[dim]{name}, round {round_ + 1}: {label}[/dim]")
                tokens, seconds = run(engines[label])
                speeds[label].append(tokens / seconds)
        plain, spec = statistics.median(speeds["plain"]), statistics.median(speeds[method])
        drafted, accepted = stats.num_draft_tokens - drafted, stats.num_accepted_tokens - accepted
        share = f"{100 * accepted / drafted:.0f}% of {drafted}" if drafted else "no drafts"
        table.add_row(name, f"{plain:.1f}", f"{spec:.1f}", f"x{spec / plain:.2f}", share)
    console.print(table)
    return 0
