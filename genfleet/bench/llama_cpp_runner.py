"""llama.cpp's side of ``genfleet bench --vs-llama-cpp``, run by that venv's Python
(it imports nothing of genfleet): loads the GGUF once, then per request line on
stdin ({"prompt": [token ids], "tokens": N}) prefills the prompt and decodes N
greedy tokens one at a time, and prints {"prefill_s": ..., "decode_s": ...}."""

import json
import sys
import time

import numpy as np
from llama_cpp import Llama


def main() -> None:
    path, threads = sys.argv[1], int(sys.argv[2])
    llm = Llama(
        model_path=path, n_ctx=2048, n_batch=512, n_threads=threads,
        n_threads_batch=threads, verbose=False,
    )  # fmt: skip
    for line in sys.stdin:
        request = json.loads(line)
        llm.reset()
        began = time.perf_counter()
        llm.eval(request["prompt"])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        first = time.perf_counter()
        for _ in range(request["tokens"] - 1):
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        end = time.perf_counter()
        print(json.dumps({"prefill_s": first - began, "decode_s": end - first}), flush=True)


if __name__ == "__main__":
    main()
