"""A mixture of experts against a dense model of the same active size.

Mixtral's layers at the families benchmark's shape with 8 experts of 768 features,
2 per token, against Llama's with one MLP of 1536 (what a token's two experts add
up to): the same attention, the same active bytes but for the router. Batch-1
decode and the 20-request burst, as in ``--families``; and the grouped experts op
(``kernels.fused_experts``) against a loop over every expert that gathers its
tokens with a mask (transformers' way), on one token and on 256.
"""

import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import PreTrainedTokenizerBase

from genfleet.bench.families import SHAPE, build_model, measure, speed_table
from kernels import fused_experts
from worker import EngineConfig, LLMEngine
from worker.models.families import llama, mixtral

EXPERTS, TOP_K, EXPERT_FEATURES = 8, 2, 768
REPEATS = 20


def _masked_loop(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    out = torch.zeros_like(x)
    for expert in range(gate_up.shape[0]):
        token, slot = torch.where(ids == expert)
        if token.numel() == 0:
            continue
        gate, up = (x[token] @ gate_up[expert].t()).chunk(2, dim=-1)
        rows = (torch.nn.functional.silu(gate) * up) @ down[expert].t()
        out.index_add_(0, token, rows * weights[token, slot, None].to(rows.dtype))
    return out


def _op_times(dtype: torch.dtype) -> dict[int, tuple[float, float]]:
    """Per token count: (grouped ms, masked loop ms), median of REPEATS."""
    hidden = SHAPE["hidden_size"]
    gate_up = torch.randn(EXPERTS, 2 * EXPERT_FEATURES, hidden).to(dtype)
    down = torch.randn(EXPERTS, hidden, EXPERT_FEATURES).to(dtype)
    times = {}
    for tokens in (1, 256):
        x = torch.randn(tokens, hidden).to(dtype)
        weights, ids = torch.topk(torch.softmax(torch.randn(tokens, EXPERTS), -1), TOP_K)
        runs: dict[str, list[float]] = {"grouped": [], "loop": []}
        for _ in range(REPEATS):
            for name in ("grouped", "loop"):
                started = time.perf_counter()
                if name == "grouped":
                    fused_experts(x, gate_up, down, weights, ids, "silu")
                else:
                    _masked_loop(x, gate_up, down, weights, ids)
                runs[name].append((time.perf_counter() - started) * 1000)
        times[tokens] = (statistics.median(runs["grouped"]), statistics.median(runs["loop"]))
    return times


def run_experts(tokenizer: PreTrainedTokenizerBase, seed: int, dtype: str, console: Console) -> int:
    moe = {"num_local_experts": EXPERTS, "num_experts_per_tok": TOP_K}
    with tempfile.TemporaryDirectory(prefix="genfleet-experts-") as root:
        folders = {"dense": Path(root) / "dense", "moe": Path(root) / "moe"}
        build_model(llama.FAMILY, len(tokenizer), folders["dense"])
        build_model(
            mixtral.FAMILY, len(tokenizer), folders["moe"],
            intermediate_size=EXPERT_FEATURES, sliding_window=None, **moe,
        )  # fmt: skip
        engines = {
            name: LLMEngine(EngineConfig(model=str(folder), seed=seed, dtype=dtype))
            for name, folder in folders.items()
        }
        for name, engine in engines.items():
            console.print(f"{name}: {engine.weights.describe()}")
        medians = measure(engines, tokenizer, seed, console)
    title = f"{EXPERTS} experts, {TOP_K} per token, against a dense model of their active size"
    console.print(speed_table(f"{title} ({dtype})", medians, "dense"))
    table = Table(title=f"the grouped experts op against a masked loop over experts ({dtype})")
    for column in ("tokens", "grouped ms", "masked loop ms", "speed-up"):
        table.add_column(column, justify="right")
    for tokens, (grouped, loop) in _op_times(getattr(torch, dtype)).items():
        table.add_row(str(tokens), f"{grouped:.3f}", f"{loop:.3f}", f"x{loop / grouped:.2f}")
    console.print(table)
    return 0
