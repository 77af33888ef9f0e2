"""``genfleet bench --agreement``: how closely each served form of the packaged model
keeps the fp32 model's greedy tokens, one request at a time (batch 1).

The reference is the de-quantized fp32 safetensors (the GGUF's own weights, as
transformers de-quantizes them), so the GGUF forms differ from it only by how the
kernels round; per form, the share of each reply's tokens before its first
difference, averaged over chat prompts.
"""

from pathlib import Path

from rich.console import Console
from rich.table import Table
from transformers import PreTrainedTokenizerBase

from genfleet.bench.vs_llama_cpp import cpu_features
from genfleet.bench.weights import QUESTIONS, agreement
from genfleet.bench.workloads import chat_prompt
from worker import EngineConfig, LLMEngine, SamplingParams
from worker.model_fetch import fetch_model, packaged_gguf

REPLY_TOKENS = 32
REFERENCE = "safetensors fp32"


def _forms(name: str) -> dict[str, dict[str, object]]:
    folder = fetch_model(name)
    gguf: Path = packaged_gguf(folder, name)
    return {
        REFERENCE: {"model": str(folder), "dtype": "float32"},
        "safetensors bf16": {"model": str(folder), "dtype": "bfloat16"},
        "GGUF blocks, fp32 activations": {"model": str(gguf), "dtype": "float32"},
        "GGUF blocks, fp8 KV": {"model": str(gguf), "dtype": "float32", "kv_cache_dtype": "fp8"},
        "GGUF blocks, fp8 KV, calculate_kv_scales": {
            "model": str(gguf), "dtype": "float32", "kv_cache_dtype": "fp8",
            "calculate_kv_scales": True,
        },
    }  # fmt: skip


def batch1_replies(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's greedy reply, alone in the engine."""
    params = SamplingParams(temperature=0, max_tokens=REPLY_TOKENS, ignore_eos=True)
    replies = []
    for i, prompt in enumerate(prompts):
        engine.add_request(f"agree-{i}", prompt, params)
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for delta in engine.step():
                tokens.extend(delta.new_token_ids)
        replies.append(tokens)
    return replies


def run_agreement(name: str, tokenizer: PreTrainedTokenizerBase, console: Console) -> int:
    prompts = [chat_prompt(tokenizer, question) for question in QUESTIONS]
    replies = {}
    for label, settings in _forms(name).items():
        console.print(f"[dim]{label}[/dim]")
        engine = LLMEngine(EngineConfig(**settings, seed=0))  # type: ignore[arg-type]
        replies[label] = batch1_replies(engine, prompts)
        del engine
    table = Table(
        title=f"{name}: greedy agreement with the fp32 model, batch 1, {len(prompts)} chat "
        f"prompts x {REPLY_TOKENS} tokens (CPU: {cpu_features()})"
    )
    table.add_column("form")
    table.add_column("share before the first difference", justify="right")
    for label, form_replies in replies.items():
        if label != REFERENCE:
            share = agreement(form_replies, replies[REFERENCE])
            table.add_row(label, f"{share:.2f}")
    console.print(table)
    return 0
