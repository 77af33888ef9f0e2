"""Section 6 of ``gpu_check.py``: tensor parallelism over two devices (NCCL; gloo in
the CPU dry run) against one, on a random Llama that splits in two."""

import gc
import random
import time
from pathlib import Path

import torch


def tensor_parallel(root: Path, device: str, engine_memory: float) -> str:
    """Section 6: two ranks against one, on a random Llama that splits in two."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from worker import LLM, SamplingParams

    folder = root / "llama-tp"
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024,
        initializer_range=0.1, tie_word_embeddings=False,
    )  # fmt: skip
    hf = LlamaForCausalLM(config).eval()
    hf.save_pretrained(folder)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 32000) for _ in range(n)] for n in (5, 33, 120, 250)]
    with torch.inference_mode():
        expected = [
            hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]
    del hf
    work = [[rng.randrange(3, 32000) for _ in range(200)] for _ in range(32)]
    rows = ["| tensor_parallel_size | parity with transformers | out tok/s (32 x 128) |",
            "| --- | --- | --- |"]  # fmt: skip
    for size in (1, 2):
        llm = LLM(str(folder), device=device, dtype="float32", tensor_parallel_size=size,
                  gpu_memory_utilization=engine_memory)  # fmt: skip
        greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy)
        equal = sum(o.outputs[0].token_ids == e for o, e in zip(outputs, expected, strict=True))
        long = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
        began = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in work], long)
        speed = 32 * 128 / (time.perf_counter() - began)
        rows.append(f"| {size} | {equal}/{len(prompts)} | {speed:.0f} |")
        llm.close()
        del llm
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return "\n".join(rows)
