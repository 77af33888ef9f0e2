"""A mixture of experts against a dense model of the same active size.

Mixtral's layers at the families benchmark's shape with 8 experts of 768 features,
2 per token, against Llama's with one MLP of 1536 (what a token's two experts add
up to): the same attention, the same active bytes but for the router. Batch-1
decode and the 20-request burst, as in ``--families``; and the grouped experts op
(``kernels.grouped_experts`` over experts re-laid out for the host's linear, as the
engine runs them, and ``kernels.fused_experts`` over the stacked weights) against a
loop over every expert that gathers its tokens with a mask (transformers' way), on
one token and on 256. Then multi-head latent attention's cache bytes per token
against full K/V (``genfleet.bench.latent``).
"""

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import PreTrainedTokenizerBase

from genfleet.bench.families import (
    SHAPE,
    family_config,
    measure,
    save_random_model,
    speed_table,
)
from genfleet.bench.latent import latent_cache_table
from kernels import fused_experts, grouped_experts, silu_and_mul
from worker import EngineConfig, LLMEngine
from worker.models.families import llama, mixtral
from worker.models.linear import pack_for_cpu

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


def _op_times(dtype: torch.dtype) -> dict[int, dict[str, float]]:
    """Per token count, ms (median of REPEATS) of: the grouped op over experts
    re-laid out for this host's linear (the engine's path), over the stacked weights,
    and the masked loop."""
    hidden = SHAPE["hidden_size"]
    gate_up = torch.randn(EXPERTS, 2 * EXPERT_FEATURES, hidden).to(dtype)
    down = torch.randn(EXPERTS, hidden, EXPERT_FEATURES).to(dtype)
    packed = [(pack_for_cpu(g), pack_for_cpu(d)) for g, d in zip(gate_up, down, strict=True)]

    def run_packed(expert: int, rows: torch.Tensor) -> torch.Tensor:
        gate_up_of, down_of = packed[expert]
        assert gate_up_of is not None and down_of is not None
        return down_of(silu_and_mul(gate_up_of(rows, None)), None)

    def forms_on(tokens: int) -> dict[str, Callable[[], torch.Tensor]]:
        x = torch.randn(tokens, hidden).to(dtype)
        weights, ids = torch.topk(torch.softmax(torch.randn(tokens, EXPERTS), -1), TOP_K)
        return {
            "re-laid out": lambda: grouped_experts(x, weights, ids, run_packed),
            "stacked": lambda: fused_experts(x, gate_up, down, weights, ids, "silu"),
            "masked loop": lambda: _masked_loop(x, gate_up, down, weights, ids),
        }

    times = {}
    for tokens in (1, 256):
        forms = forms_on(tokens)
        runs: dict[str, list[float]] = {name: [] for name in forms}
        for _ in range(REPEATS):
            for name, run in forms.items():
                started = time.perf_counter()
                run()
                runs[name].append((time.perf_counter() - started) * 1000)
        times[tokens] = {name: statistics.median(ms) for name, ms in runs.items()}
    return times


def run_experts(tokenizer: PreTrainedTokenizerBase, seed: int, dtype: str, console: Console) -> int:
    moe = {"num_local_experts": EXPERTS, "num_experts_per_tok": TOP_K}
    with tempfile.TemporaryDirectory(prefix="genfleet-experts-") as root:
        folders = {"dense": Path(root) / "dense", "moe": Path(root) / "moe"}
        save_random_model(family_config(llama.FAMILY, len(tokenizer)), folders["dense"])
        sparse = family_config(
            mixtral.FAMILY, len(tokenizer),
            intermediate_size=EXPERT_FEATURES, sliding_window=None, **moe,
        )  # fmt: skip
        save_random_model(sparse, folders["moe"])
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
    columns = ("re-laid out", "stacked", "masked loop")
    for column in ("tokens", *(f"{c} ms" for c in columns), "speed-up"):
        table.add_column(column, justify="right")
    for tokens, ms in _op_times(getattr(torch, dtype)).items():
        speed_up = ms["masked loop"] / ms["re-laid out"]
        table.add_row(str(tokens), *(f"{ms[c]:.3f}" for c in columns), f"x{speed_up:.2f}")
    console.print(table)
    console.print(latent_cache_table())
    return 0
