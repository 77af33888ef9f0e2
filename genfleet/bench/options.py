import argparse


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
        "--device",
        default="auto",
        help="auto, cpu, cuda or cuda:N: the engine's and the transformers baselines' device",
    )
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
        "--enforce-eager", action="store_true", help="CUDA: no graphs for decode steps"
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
    parser.add_argument(
        "--structured",
        action="store_true",
        help="the burst workload with every other request constrained by a JSON Schema, "
        "against it unconstrained: throughput ratio and grammar-mask cost per step",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=None, help="poisson arrivals per second")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
