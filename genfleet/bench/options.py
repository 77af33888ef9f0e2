import argparse
from pathlib import Path

from genfleet.settings_flags import add_settings_arguments
from worker.config import EngineConfig

# The engine's knobs the benchmarks take, as every command takes them (one definition).
ENGINE_FLAGS = (
    "device",
    "enforce_eager",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_dtype",
    "dense_weights_memory_gib",
    "speculative_config",
    "tensor_parallel_size",
)


def engine_flags(args: argparse.Namespace) -> dict[str, object]:
    """The engine knobs given on the bench's command line."""
    return {name: getattr(args, name) for name in ENGINE_FLAGS if getattr(args, name) is not None}


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument(
        "--workloads", default="burst,poisson", help="comma-separated: burst, poisson"
    )
    parser.add_argument(
        "--baselines",
        default="static8,static20",
        help="comma-separated HF baselines: single, static8, static20",
    )
    parser.add_argument(
        "--dtypes",
        default=None,
        help="comma-separated dtypes for every system (default float32,bfloat16; "
        "with --fleet one dtype, default bfloat16)",
    )
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="the whole fleet (broker, Redis, one worker, the API) over HTTP "
        "against the offline engine on the same requests",
    )
    parser.add_argument(
        "--serve",
        metavar="URL",
        help="benchmark an OpenAI-compatible server already running there (genfleet up, "
        "vllm serve, ...) with this workload and client; --model gives the tokenizer",
    )
    parser.add_argument(
        "--served-model",
        help="--serve: the model name the server answers to (default: --model)",
    )
    _add_engine_arguments(parser)
    _add_fleet_arguments(parser)
    _add_comparison_arguments(parser)


def _add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """How the engine under test runs, offline and in the fleet's worker (the transformers
    baselines run on the engine's device: like against like)."""
    add_settings_arguments(parser.add_argument_group("engine"), EngineConfig, ENGINE_FLAGS)


def _add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The fleet benchmarks' own."""
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="--fleet: the worker's tokens per published event after a job's first",
    )
    parser.add_argument(
        "--engine-threads",
        type=int,
        default=None,
        help="--fleet, --batch-mix: the engine's CPU threads, offline and in the worker "
        "(default: the worker's own)",
    )
    parser.add_argument(
        "--batch-mix",
        action="store_true",
        help="the fleet with its batch runner: interactive requests' TTFT on the idle fleet "
        "and while a 200-line batch runs",
    )
    parser.add_argument(
        "--batch-max-in-flight",
        type=int,
        default=256,
        help="--batch-mix: the batch runner's window of unfinished lines",
    )


def _add_comparison_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmarks that compare one feature with its absence."""
    parser.add_argument(
        "--structured",
        action="store_true",
        help="the burst workload with every other request constrained by a JSON Schema, "
        "against it unconstrained: throughput ratio and grammar-mask cost per step",
    )
    parser.add_argument(
        "--weights",
        action="store_true",
        help="a packaged model's GGUF blocks against its fp32 and bf16 safetensors: weight "
        "bytes, batch-1 decode, burst throughput, greedy agreement",
    )
    parser.add_argument(
        "--kv-cache",
        action="store_true",
        help="the KV cache in the model's dtype against fp8 (e4m3, e5m2): blocks at one "
        "budget, the largest batch without preemption, decode and burst speed, agreement",
    )
    parser.add_argument(
        "--speculative",
        action="store_true",
        help="n-gram speculative decoding against none (--speculative-config, default "
        "4 tokens, lookups of 2-4): copying and chat prompts one at a time, the burst, "
        "a batch of 64",
    )
    parser.add_argument(
        "--families",
        action="store_true",
        help="every supported family at one shape with random weights against Llama at "
        "that shape: batch-1 decode and burst tokens/s, and their ratios (--dtypes: one)",
    )
    parser.add_argument(
        "--experts",
        action="store_true",
        help="a mixture of 8 experts, 2 per token, against a dense model of its active "
        "size: decode and burst tokens/s; the grouped experts op against a masked loop",
    )
    parser.add_argument(
        "--conversations",
        action="store_true",
        help="multi-turn chats on two workers: jobs keyed by conversation against keyed "
        "by job id, and one worker (prefix-cache hit rate, TTFT of later turns)",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="--conversations: runs of each, alternating"
    )
    _add_llama_cpp_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=None, help="poisson arrivals per second")


def _add_llama_cpp_arguments(parser: argparse.ArgumentParser) -> None:
    """Batch 1 against llama.cpp, which runs in a venv of its own; and against the
    fp32 model's tokens."""
    parser.add_argument(
        "--agreement",
        action="store_true",
        help="greedy agreement with the fp32 model at batch 1: GGUF blocks (with and "
        "without an fp8 KV cache, calculated scales or not) and bf16 safetensors",
    )
    parser.add_argument(
        "--vs-llama-cpp",
        action="store_true",
        help="batch-1 prefill and decode of the packaged GGUF against llama.cpp "
        "(llama-cpp-python in --llama-cpp-venv), alternating, and genfleet's step split",
    )
    parser.add_argument(
        "--llama-cpp-venv",
        type=Path,
        default=Path.home() / ".cache" / "genfleet" / "llama-cpp-venv",
        help="--vs-llama-cpp: the venv that holds llama-cpp-python",
    )
    parser.add_argument(
        "--install-llama-cpp",
        action="store_true",
        help="--vs-llama-cpp: first make that venv and build llama-cpp-python into it "
        "(from source: about 8 minutes on 2 cores)",
    )
