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
        "--dtypes", default="float32,bfloat16", help="comma-separated dtypes for every system"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=None, help="poisson arrivals per second")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
