"""The one prepared check for a lent CUDA GPU: one run of a few minutes, one Markdown report.

    scripts/gpu_check_prepare.sh            # here, once: wheels and model files to carry
    python3 scripts/gpu_check.py            # there, with .gpu_check carried

Sections, each written to the report as soon as it is done (``$OUT/gpu_check.md``
when ``OUT`` is set, else ``gpu_check.md``), a failing one recorded and passed:

1. tests on the GPU (``TRITON_INTERPRET=0``): the Triton kernels against the
   references (the quantized linear layer and the fp8 KV cache among them), the
   tiny models' greedy parity against transformers (the engine
   on CUDA, eager and with graphs), CUDA graphs against eager, step buffers;
2. greedy parity on the SmolLM2-135M architecture (its config and tokenizer,
   seeded random weights: the 93 MB model package cannot travel to the GPU
   machine) against transformers on the GPU, fp32, eager and with graphs;
3. ``genfleet bench``'s burst and poisson workloads, bf16: the engine with
   graphs and eager against transformers' static batches of 8 and 20, in the
   same run; goal: throughput at least 3x the best baseline, mean latency 40 %
   lower;
4. decode step time, eager against graphs, at batch 1, 8, 32 and 64;
5. paged attention's bandwidth (``gpu_bandwidth.py``; goal: 70 % of peak at long contexts);
6. (``gpu_tensor_parallel.py``) with two or more GPUs, over two (NCCL): greedy parity
   of a random Llama against transformers, tokens/s of 32 requests at sizes 1 and 2.

``--device cpu`` is a dry run of sections 2-4 and 6 (gloo) here, to find a broken script
before it spends GPU time (its figures say nothing about a GPU).

The GPU machine has no pydantic: ``gpu_check_prepare.sh`` puts its wheels and
SmolLM2's config and tokenizer in ``.gpu_check/`` and prints the command to run there.
"""

import argparse
import gc
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402  (after TRITON_INTERPRET: triton reads it on import)
from gpu_bandwidth import bandwidth  # noqa: E402  (beside this script)
from gpu_tensor_parallel import tensor_parallel  # noqa: E402

TESTS = [
    "tests/kernels/test_triton.py",
    "tests/kernels/test_quantized.py::test_triton_kernel_matches_the_reference",
    "tests/kernels/test_fp8_cache.py",
    "tests/kernels/test_reference.py",
    "tests/worker/execution/test_cuda_graphs.py",
    "tests/worker/execution/test_step_buffers.py",
    "tests/worker/models/test_parity.py::test_tiny_model_greedy_parity",
]
STEP_BATCHES = (1, 8, 32, 64)
# Each engine of the check takes this share of the GPU: one at a time, with room left.
ENGINE_MEMORY = 0.3
DEVICE = "cuda"  # --device cpu: the dry run


class CheckFailed(Exception):
    """A section that ran and found a failure; its text is the section's body."""


def run_tests(sweep: bool) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    if sweep:
        env["GENFLEET_SLOW_TESTS"] = "1"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    summary = lines[-1] if lines else "no output"
    body = "\n".join([f"`pytest {' '.join(TESTS)}`: **{summary}**", "", *failures])
    if done.returncode:
        raise CheckFailed(body)
    return body


def random_smollm2(files: Path, folder: Path) -> Path:
    """SmolLM2's architecture and tokenizer with seeded random weights, peaked enough
    that greedy choices do not hinge on rounding."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(files)
    config.initializer_range = 0.15
    config.eos_token_id = None  # both sides run to max_tokens, nothing masked
    torch.manual_seed(1234)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (files / name).is_file():
            (folder / name).write_bytes((files / name).read_bytes())
    return folder


def _engine(folder: Path, dtype: str, eager: bool):
    from worker import LLMEngine
    from worker.config import EngineConfig

    config = EngineConfig(
        model=str(folder),
        dtype=dtype,
        device=DEVICE,
        enforce_eager=eager,
        gpu_memory_utilization=ENGINE_MEMORY,
    )
    return LLMEngine(config)


def _free() -> None:
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def parity(folder: Path) -> str:
    from transformers import AutoModelForCausalLM

    from worker import SamplingParams

    rng = random.Random(7)
    prompts = [[rng.randrange(3, 49152) for _ in range(n)] for n in (1, 7, 16, 33, 64, 120, 250)]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(DEVICE).eval()
    expected = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=DEVICE)
            out = hf.generate(ids, max_new_tokens=32, do_sample=False)
            expected.append(out[0, len(prompt) :].tolist())
    del hf
    _free()
    rows = ["| engine | prompts equal to transformers |", "| --- | --- |"]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    for eager in (True, False):
        engine = _engine(folder, "float32", eager)
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, params)
        tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
        while engine.has_unfinished_requests():
            for delta in engine.step():
                tokens[delta.request_id].extend(delta.new_token_ids)
        equal = sum(tokens[str(i)] == want for i, want in enumerate(expected))
        rows.append(f"| fp32, {'eager' if eager else 'CUDA graphs'} | {equal}/{len(prompts)} |")
        del engine
        _free()
    return "\n".join(rows)


def _summary_rows(rows) -> list[str]:
    lines = [
        "| system | out tok/s | mean lat s | p50 s | p99 s | TTFT s | TPOT ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.system} | {r.output_tokens_per_s:.1f} | {r.mean_latency:.3f} | "
            f"{r.p50_latency:.3f} | {r.p99_latency:.3f} | {r.mean_ttft:.3f} | "
            f"{1000 * r.mean_tpot:.2f} |"
        )
    return lines


def bench(folder: Path) -> str:
    from genfleet.bench.engine_driver import run_engine
    from genfleet.bench.hf_baseline import load_hf_model, run_hf
    from genfleet.bench.run import poisson_rate, verdict, warm
    from genfleet.bench.workloads import make_workload
    from worker.engine.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(folder)
    if tokenizer is None:
        raise ValueError(f"{folder} has no tokenizer: run scripts/gpu_check_prepare.sh")
    burst = make_workload("burst", tokenizer, 0, None)
    rows: dict[str, list] = {"burst": [], "poisson": []}
    poisson, rate = None, 0.0
    for eager in (False, True):
        engine = _engine(folder, "bfloat16", eager)
        warm(engine)
        label = f"genfleet bf16 {'eager' if eager else 'graphs'}"
        rows["burst"].append(run_engine(engine, burst, label))
        if poisson is None:  # arrivals at 90 % of what the engine with graphs sustains
            rate = poisson_rate(rows["burst"][0].output_tokens_per_s)
            poisson = make_workload("poisson", tokenizer, 0, rate)
        rows["poisson"].append(run_engine(engine, poisson, label))
        del engine
        _free()
    assert poisson is not None
    model = load_hf_model(folder, torch.bfloat16, DEVICE)
    for batch in (8, 20):
        for workload, requests in (("burst", burst), ("poisson", poisson)):
            with torch.inference_mode():
                rows[workload].append(run_hf(model, requests, batch, f"HF static{batch} bf16"))
    del model
    _free()
    out = []
    for workload, summaries in rows.items():
        title = f"{workload}: {len(burst if workload == 'burst' else poisson)} requests"
        if workload == "poisson":
            title += f" at {rate:.2f} req/s"
        out += [f"**{title}**", "", *_summary_rows(summaries), "", verdict(summaries), ""]
    return "\n".join(out)


def _decode_step_ms(engine, batch: int, steps: int = 16) -> float:
    from worker import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", [(i * 31 + j) % 40000 + 3 for j in range(512)], params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.requests.values()):
        engine.step()
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    elapsed = time.perf_counter() - started
    for request_id in list(engine.requests):
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    return 1000 * elapsed / steps


def step_times(folder: Path) -> str:
    times: dict[bool, list[float]] = {}
    for eager in (True, False):
        engine = _engine(folder, "bfloat16", eager)
        _decode_step_ms(engine, 1, steps=2)  # warm-up
        times[eager] = [_decode_step_ms(engine, batch) for batch in STEP_BATCHES]
        del engine
        _free()
    rows = ["| batch | eager ms/step | graphs ms/step | speed-up |", "| --- | --- | --- | --- |"]
    for batch, eager_ms, graph_ms in zip(STEP_BATCHES, times[True], times[False], strict=True):
        rows.append(f"| {batch} | {eager_ms:.2f} | {graph_ms:.2f} | x{eager_ms / graph_ms:.2f} |")
    return "\n".join(rows)


class Report:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.failed = False
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
        self.text = f"# GPU check\n\n{name}; torch {torch.__version__}\n"
        self._write()

    def section(self, title: str, build: Callable[[], str]) -> None:
        started = time.perf_counter()
        try:
            body = build()
        except CheckFailed as failure:
            self.failed, body = True, str(failure)
        except Exception:  # one broken section must not lose the others' figures
            self.failed, body = True, f"```\n{traceback.format_exc()}```"
        self.text += f"\n## {title} ({time.perf_counter() - started:.0f} s)\n\n{body}\n"
        print(f"\n## {title}\n\n{body}", flush=True)
        self._write()

    def _write(self) -> None:
        self.path.write_text(self.text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sweep", action="store_true", help="also run the larger kernel grid")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument(
        "--model-files",
        type=Path,
        default=REPO / ".gpu_check" / "smollm2",
        help="SmolLM2's config.json and tokenizer files",
    )
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    report = Report(Path(os.environ.get("OUT", "."), "gpu_check.md"))
    on_gpu = DEVICE == "cuda"
    if on_gpu:
        report.section("Tests on the GPU", partial(run_tests, args.sweep))
    with tempfile.TemporaryDirectory() as tmp:
        folder = random_smollm2(args.model_files, Path(tmp))
        report.section("Greedy parity, SmolLM2-135M architecture", partial(parity, folder))
        report.section("Benchmark: engine against transformers", partial(bench, folder))
        report.section("Decode step time, eager against CUDA graphs", partial(step_times, folder))
    if on_gpu:
        report.section("Paged attention bandwidth", bandwidth)
    if not on_gpu or torch.cuda.device_count() >= 2:
        with tempfile.TemporaryDirectory() as tmp:
            section = partial(tensor_parallel, Path(tmp), DEVICE, ENGINE_MEMORY)
            report.section("Tensor parallelism over two ranks", section)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
