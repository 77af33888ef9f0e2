"""One burst through an offline ``LLM.generate``: genfleet's, or vLLM's, to compare engines.

    python scripts/offline_generate.py --engine genfleet --model SmolLM2-135M-Instruct
    VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 \\
        VLLM_VENV/bin/python scripts/offline_generate.py --engine vllm --model FOLDER

The requests are ``genfleet bench``'s burst (20 chat-templated prompts of 100-300
tokens given as token ids, 20-200 output tokens each, greedy, ``ignore_eos``), built
from this checkout's ``genfleet.bench.workloads`` (the script puts the checkout on the
path, so vLLM's environment needs nothing of genfleet installed) with the engine's
own tokenizer (the model's). Each engine runs with its own defaults
but the dtype; one warm-up call first. Prints the requests' digest (the same in both
environments, or the comparison is void) and the output tokens per second.
"""

import argparse
import hashlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from genfleet.bench.workloads import BenchRequest, make_workload

WARMUP = [BenchRequest(0.0, [1] * 64, 4)] * 4

# Output tokens made for a list of requests; and the engine's tokenizer.
Generate = Callable[[list[BenchRequest]], int]


def digest(requests: list[BenchRequest]) -> str:
    text = ";".join(f"{r.prompt_token_ids}:{r.output_len}" for r in requests)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def engine_generate(engine: str, model: str, dtype: str) -> tuple[Generate, object]:
    """The engine's ``LLM.generate`` over requests; both take vLLM's prompt and params."""
    if engine == "vllm":
        from vllm import LLM, SamplingParams
    else:
        from worker.llm import LLM  # type: ignore[assignment]
        from worker.sampling_params import SamplingParams  # type: ignore[assignment]

    llm = LLM(model=model, dtype=dtype)

    def generate(requests: list[BenchRequest]) -> int:
        params = [
            SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
            for r in requests
        ]
        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    return generate, llm.get_tokenizer()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("genfleet", "vllm"), required=True)
    parser.add_argument("--model", required=True, help="what the engine loads")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    generate, tokenizer = engine_generate(args.engine, args.model, args.dtype)
    requests = make_workload("burst", tokenizer, args.seed)  # type: ignore[arg-type]
    generate(WARMUP)
    began = time.perf_counter()
    tokens = generate(requests)
    elapsed = time.perf_counter() - began
    asked = sum(r.output_len for r in requests)
    if tokens != asked:
        raise SystemExit(f"{tokens} output tokens, {asked} asked: ignore_eos was not honoured")
    print(
        f"{args.engine} {args.dtype}: requests {digest(requests)}, {tokens} output tokens "
        f"in {elapsed:.2f} s = {tokens / elapsed:.1f} tok/s"
    )


if __name__ == "__main__":
    main()
