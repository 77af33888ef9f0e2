"""Every supported dense family at one size against Llama at that size: no family pays for
the registry beyond what its own layers compute.

Each family is built with random weights from its transformers config's defaults
(its windows, norms, soft-caps, multipliers, layers without rotary) at one shape:
8 layers, hidden 512, 8 query and 4 KV heads of 64, MLP 1536, the benchmark
model's vocabulary. Per family: batch-1 decode tokens/s and the burst workload's
output tokens/s (the engines taking turns, in alternating order, median of the
rounds), and each as a ratio to Llama's.
"""

import statistics
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerBase

from genfleet.bench.engine_driver import run_engine
from genfleet.bench.weights import decode_tokens_per_s
from genfleet.bench.workloads import chat_prompt, make_workload
from worker import EngineConfig, LLMEngine
from worker.models.family import Family
from worker.models.registry import FAMILIES

SHAPE = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "pad_token_id": 0,  # some defaults name ids past the benchmark model's vocabulary
}
ROUNDS = 3
# The bar: each family's speed within this share of Llama's.
WITHIN = 0.15


def _build(family: Family, vocab_size: int, folder: Path) -> bool:
    """The family's model at SHAPE in ``folder``; False for a mixture of experts, whose
    active size differs from its total (the experts benchmark compares those)."""
    config = AutoConfig.for_model(family.model_types[0], vocab_size=vocab_size, **SHAPE)
    config.architectures = [family.architectures[0]]
    if family.traits(config).moe is not None:
        return False
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
    return True


def run_families(
    tokenizer: PreTrainedTokenizerBase, seed: int, dtype: str, console: Console
) -> int:
    burst = make_workload("burst", tokenizer, seed)
    prompt = chat_prompt(tokenizer, "Tell me a long story about a lighthouse keeper.")
    speeds: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="genfleet-families-") as root:
        engines = {}
        for family in FAMILIES:
            folder = Path(root) / family.name
            if not _build(family, len(tokenizer), folder):
                continue
            config = EngineConfig(model=str(folder), seed=seed, dtype=dtype)
            engines[family.name] = LLMEngine(config)
            speeds[family.name] = {"decode": [], "burst": []}
        for round_ in range(ROUNDS):
            order = list(engines) if round_ % 2 == 0 else list(reversed(engines))
            for name in order:
                console.print(f"[dim]round {round_ + 1}: {name}[/dim]")
                speeds[name]["decode"].append(decode_tokens_per_s(engines[name], prompt))
                summary = run_engine(engines[name], burst, name)
                speeds[name]["burst"].append(summary.output_tokens_per_s)
    medians = {name: {k: statistics.median(v) for k, v in s.items()} for name, s in speeds.items()}
    llama = medians["llama"]
    table = Table(title=f"every family at one shape ({dtype}), against Llama")
    for column in ("family", "decode tok/s", "vs llama", "burst tok/s", "vs llama"):
        table.add_column(column, justify="left" if column == "family" else "right")
    slow = []
    for name, median in medians.items():
        ratios = {k: median[k] / llama[k] for k in median}
        if min(ratios.values()) < 1 - WITHIN:
            slow.append(name)
        table.add_row(
            name,
            f"{median['decode']:.1f}",
            f"x{ratios['decode']:.2f}",
            f"{median['burst']:.1f}",
            f"x{ratios['burst']:.2f}",
        )
    console.print(table)
    if slow:
        console.print(f"more than {WITHIN:.0%} slower than Llama: {', '.join(slow)}")
    return 0
