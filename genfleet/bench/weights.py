"""The default model in each form it can be served in: its GGUF blocks (Q4_1, the
projections; Q8_0, the embedding) and its de-quantized safetensors in fp32 and bf16.

Per form: the bytes its weights take, batch-1 decode speed (one request, 128
tokens, the median of three runs; the forms take turns, in alternating order),
the burst workload's throughput, and greedy agreement with the fp32 safetensors
on chat prompts: the share of each reply's tokens before its first difference.
"""

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from transformers import PreTrainedTokenizerBase

from genfleet.bench.engine_driver import run_engine
from genfleet.bench.workloads import chat_prompt, make_workload
from worker import EngineConfig, LLMEngine, SamplingParams
from worker.model_fetch import KNOWN_MODELS, fetch_model, packaged_gguf

DECODE_TOKENS = 128
ROUNDS = 3
AGREEMENT_TOKENS = 64
QUESTIONS = (
    "What is the capital of France?",
    "Explain photosynthesis in two sentences.",
    "Write a haiku about the sea.",
    "List three uses of a paperclip.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
    "Summarise the plot of Romeo and Juliet.",
    "Give me a recipe for pancakes.",
)


def _forms(name: str) -> dict[str, tuple[Path, str]]:
    folder = fetch_model(name)
    gguf = packaged_gguf(folder, name)
    return {
        "GGUF, fp32 activations": (gguf, "float32"),
        "GGUF, bf16 activations": (gguf, "bfloat16"),
        "safetensors fp32": (folder, "float32"),
        "safetensors bf16": (folder, "bfloat16"),
    }


@dataclass
class Timing:
    prefill_tok_s: float  # the prompt over the time to the first token
    decode_tok_s: float  # the other tokens over the rest


def batch1_timing(engine: LLMEngine, prompt: list[int], request_id: str = "decode") -> Timing:
    """One request of DECODE_TOKENS greedy tokens, alone in the engine."""
    params = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS, ignore_eos=True)
    engine.add_request(request_id, prompt, params)
    began = time.perf_counter()
    first = None
    while engine.has_unfinished_requests():
        if engine.step() and first is None:
            first = time.perf_counter()  # the prefill step's token: decoding starts here
    end = time.perf_counter()
    assert first is not None
    return Timing(len(prompt) / (first - began), (DECODE_TOKENS - 1) / (end - first))


def decode_tokens_per_s(engine: LLMEngine, prompt: list[int]) -> float:
    return batch1_timing(engine, prompt).decode_tok_s


def greedy_replies(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=AGREEMENT_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"agree-{i}", prompt, params)
    replies: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for delta in engine.step():
            replies.setdefault(delta.request_id, []).extend(delta.new_token_ids)
    return [replies[f"agree-{i}"] for i in range(len(prompts))]


def agreement(replies: list[list[int]], reference: list[list[int]]) -> float:
    shares = []
    for reply, expected in zip(replies, reference, strict=True):
        pairs = enumerate(zip(reply, expected, strict=True))
        same = next((i for i, (a, b) in pairs if a != b), len(reply))
        shares.append(same / len(expected))
    return statistics.fmean(shares)


def run_weights(name: str, tokenizer: PreTrainedTokenizerBase, seed: int, console: Console) -> int:
    if name not in KNOWN_MODELS:
        raise ValueError(
            f"--weights compares a packaged model's forms: one of {sorted(KNOWN_MODELS)}"
        )
    engines = {}
    for label, (model, dtype) in _forms(name).items():
        engines[label] = LLMEngine(EngineConfig(model=str(model), dtype=dtype, seed=seed))
    prompt = tokenizer.encode("Tell me a long story about a lighthouse keeper.")
    chats = [chat_prompt(tokenizer, q) for q in QUESTIONS]
    decode: dict[str, list[float]] = {label: [] for label in engines}
    for round_ in range(ROUNDS):
        order = list(engines) if round_ % 2 == 0 else list(reversed(engines))
        for label in order:
            console.print(f"[dim]decode round {round_ + 1}: {label}[/dim]")
            decode[label].append(decode_tokens_per_s(engines[label], prompt))
    burst = make_workload("burst", tokenizer, seed)
    throughput = {}
    for label in reversed(engines):
        console.print(f"[dim]burst: {label}[/dim]")
        throughput[label] = run_engine(engines[label], burst, label).output_tokens_per_s
    replies = {label: greedy_replies(engine, chats) for label, engine in engines.items()}
    table = Table(title=f"{name}: weight forms (batch-1 decode: median of {ROUNDS})")
    for column in ("form", "weights", "MiB", "decode tok/s", "burst tok/s", "greedy agreement"):
        table.add_column(column, justify="left" if column in ("form", "weights") else "right")
    for label, engine in engines.items():
        table.add_row(
            label,
            engine.weights.formats,
            f"{engine.weights.bytes / 2**20:.1f}",
            f"{statistics.median(decode[label]):.1f}",
            f"{throughput[label]:.1f}",
            f"{100 * agreement(replies[label], replies['safetensors fp32']):.0f}%",
        )
    console.print(table)
    base = statistics.median(decode["safetensors fp32"])
    for label in ("GGUF, fp32 activations", "GGUF, bf16 activations", "safetensors bf16"):
        ratio = statistics.median(decode[label]) / base
        console.print(f"batch-1 decode, {label} vs safetensors fp32: x{ratio:.2f}")
    return 0
