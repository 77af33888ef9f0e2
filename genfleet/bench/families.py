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
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)

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


def family_config(family: Family, vocab_size: int, **overrides: object) -> PretrainedConfig:
    """The family's config at SHAPE (and ``overrides``), its own defaults otherwise."""
    settings = {**SHAPE, **overrides}
    config = AutoConfig.for_model(family.model_types[0], vocab_size=vocab_size, **settings)
    config.architectures = [family.architectures[0]]
    return config


def save_random_model(config: PretrainedConfig, folder: Path) -> None:
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)


def measure(
    engines: dict[str, LLMEngine], tokenizer: PreTrainedTokenizerBase, seed: int, console: Console
) -> dict[str, dict[str, float]]:
    """Each engine's batch-1 decode and burst output tokens/s: the engines take turns,
    in alternating order, median of ROUNDS."""
    burst = make_workload("burst", tokenizer, seed)
    prompt = chat_prompt(tokenizer, "Tell me a long story about a lighthouse keeper.")
    speeds: dict[str, dict[str, list[float]]] = {n: {"decode": [], "burst": []} for n in engines}
    for round_ in range(ROUNDS):
        for name in list(engines) if round_ % 2 == 0 else list(reversed(engines)):
            console.print(f"[dim]round {round_ + 1}: {name}[/dim]")
            speeds[name]["decode"].append(decode_tokens_per_s(engines[name], prompt))
            speeds[name]["burst"].append(run_engine(engines[name], burst, name).output_tokens_per_s)
    return {name: {k: statistics.median(v) for k, v in s.items()} for name, s in speeds.items()}


def speed_table(title: str, medians: dict[str, dict[str, float]], baseline: str) -> Table:
    table = Table(title=title)
    for column in ("model", "decode tok/s", f"vs {baseline}", "burst tok/s", f"vs {baseline}"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, median in medians.items():
        table.add_row(
            name,
            f"{median['decode']:.1f}",
            f"x{median['decode'] / medians[baseline]['decode']:.2f}",
            f"{median['burst']:.1f}",
            f"x{median['burst'] / medians[baseline]['burst']:.2f}",
        )
    return table


def run_families(
    tokenizer: PreTrainedTokenizerBase, seed: int, dtype: str, console: Console
) -> int:
    with tempfile.TemporaryDirectory(prefix="genfleet-families-") as root:
        engines = {}
        for family in FAMILIES:
            config = family_config(family, len(tokenizer))
            if family.traits(config).moe is not None:
                continue  # its active size is not its total: `--experts` compares those
            folder = Path(root) / family.name
            save_random_model(config, folder)
            engines[family.name] = LLMEngine(
                EngineConfig(model=str(folder), seed=seed, dtype=dtype)
            )
        medians = measure(engines, tokenizer, seed, console)
    console.print(speed_table(f"every dense family at one shape ({dtype})", medians, "llama"))
    slow = [
        name
        for name, median in medians.items()
        if min(median[k] / medians["llama"][k] for k in median) < 1 - WITHIN
    ]
    if slow:
        console.print(f"more than {WITHIN:.0%} slower than Llama: {', '.join(slow)}")
    return 0
