"""``genfleet up``: the whole fleet on this host, in one command.

Starts, on loopback, the embedded Kafka broker (tansu, in memory), a
``redis-server``, N workers per model and the API; prints where everything is, sends one
first request, and serves until Ctrl-C or SIGTERM. It then stops the pieces in
order — the API (no new jobs), the workers (each drains its running jobs), Redis,
the broker — and leaves no process behind.

The children run in their own process group, so a Ctrl-C in the terminal
reaches this supervisor only: it must not stop Redis under a draining worker.
A worker that exits on its own (a failed engine exits 1 by design) is started
again, as an orchestrator would.

With ``--model`` given more than once, each model gets its own workers: the first
is the fleet's default model (on the plain job lanes), every other one is served
under its name (``--served-model-name``) on lanes of its own.
"""

import argparse
import signal
import socket
import tempfile
import threading
import time
from itertools import islice
from pathlib import Path

import httpx
from pydantic import TypeAdapter, ValidationError
from rich.console import Console

from genfleet.local_fleet import LocalFleet, local_fleet
from genfleet.processes import FleetProcess
from genfleet.settings_flags import add_settings_arguments, as_flags, given_settings
from queue_schemas.bounds import MAX_SERVED_MODEL_CHARS, ServedModelName
from worker.config import EngineConfig
from worker.engine_process.threads import threads_per_worker
from worker.service.settings import REPLY_SETTINGS, WorkerSettings

READY_TIMEOUT_S = 300.0
API_STOP_S = 10.0
BATCH_LINES_PER_WORKER = 16
FIRST_PROMPT = "What is the capital of France? Answer in one sentence."
SHOWN_SAMPLING = ("temperature", "top_p", "top_k", "max_tokens")

SERVED_NAME = TypeAdapter(ServedModelName)
console = Console(soft_wrap=True)  # URLs and commands stay whole in a log


def add_up_arguments(parser: argparse.ArgumentParser) -> None:
    """``up``'s own flags, and every engine knob (``EngineConfig``) and reply setting
    (``REPLY_SETTINGS``), passed to each worker."""
    parser.add_argument(
        "--model",
        action="append",
        help="a model to serve: folder, GGUF file or known name (default "
        f"{EngineConfig.model_fields['model'].default}); again for another model, served "
        "under its folder's name by workers of its own",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="worker processes per model (default 1)"
    )
    parser.add_argument("--port", type=int, default=8000, help="the API's port (default 8000)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9400,
        help="first worker's /metrics, /healthz and /readyz port; the next workers count up",
    )
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="keep Redis's data here (AOF) across restarts"
    )
    parser.add_argument("--log-dir", type=Path, default=None, help="the pieces' log files")
    parser.add_argument(
        "--no-first-request", action="store_true", help="do not send the first request"
    )
    engine_knobs = [name for name in EngineConfig.model_fields if name != "model"]
    add_settings_arguments(
        parser.add_argument_group("engine (each worker's)"), EngineConfig, only=engine_knobs
    )
    add_settings_arguments(
        parser.add_argument_group("replies (each worker's)"), WorkerSettings, only=REPLY_SETTINGS
    )


def reply_flags(args: argparse.Namespace) -> list[str]:
    """The reply settings given to ``up``, as each worker's flags."""
    given = given_settings(args, WorkerSettings)
    return as_flags({name: value for name, value in given.items() if name in REPLY_SETTINGS})


def _check_port_free(port: int, what: str) -> None:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise RuntimeError(
                f"port {port} ({what}) is in use: stop what holds it, or choose another port"
            ) from None


def _served_models(names: list[str]) -> list[tuple[str, str]]:
    """Each model's ``--model`` for its workers and its served name, the names distinct."""
    models = [_workers_model(name) for name in names]
    served = [name for _, name in models]
    for name in served:
        try:
            SERVED_NAME.validate_python(name)
        except ValidationError:
            raise ValueError(
                f"{name!r} cannot be a served model name (at most {MAX_SERVED_MODEL_CHARS} "
                "letters, digits and ._/-): rename its folder"
            ) from None
    if len(set(served)) < len(served):
        raise ValueError(f"two models would be served under one name: {served}")
    return models


def _workers_model(name: str) -> tuple[str, str]:
    """What the workers get as ``--model`` and the name the API serves: a folder or GGUF
    file as given, or a known name fetched here once (each worker then takes the form
    for its device, ``worker.model_fetch.resolve_model``)."""
    from worker.model_fetch import (
        KNOWN_MODELS,
        cache_dir,
        fetch_model,
        is_model_folder,
        resolve_model,
    )

    if Path(name).expanduser().exists() or name not in KNOWN_MODELS:
        path = resolve_model(name)  # a ValueError for a name it does not know
        return str(path), path.stem if path.is_file() else path.name
    if is_model_folder(cache_dir() / name):
        fetch_model(name)
    else:
        with console.status(f"fetching and converting {name} (once; later starts read the cache)"):
            fetch_model(name)
    return name, name


def _wait_until_ready(fleet: LocalFleet, urls: list[str], stop: threading.Event) -> None:
    """Every worker answers ``/readyz`` (model loaded, group joined), and the API (a worker
    of the default model reads its jobs: the first request is served at once); a worker
    that exits meanwhile (a model that will not load) is an error naming its log."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    waiting = set(urls)
    with console.status("loading the model in the workers and joining the consumer group"):
        while waiting and time.monotonic() < deadline and not stop.is_set():
            for worker in fleet.workers.values():
                if not worker.alive:
                    raise RuntimeError(
                        f"a worker exited at start (code {worker.process.returncode}); "
                        f"its log, {worker.log_path}, ends:\n{_tail(worker)}"
                    )
            for url in list(waiting):
                try:
                    if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                        waiting.discard(url)
                except httpx.TransportError:
                    pass
            time.sleep(0.25)
    if waiting and not stop.is_set():
        raise RuntimeError(f"workers not ready within {READY_TIMEOUT_S:.0f} s")


def _tail(process: FleetProcess, lines: int = 15) -> str:
    return "\n".join(process.log().splitlines()[-lines:])


def _print_welcome(api_url: str, worker_urls: list[str], models: list[str], log_dir: Path) -> None:
    model = models[0]
    console.print(
        f"[bold green]genfleet is serving[/] {', '.join(models)} with {len(worker_urls)} worker(s)"
    )
    console.print(f"  API           {api_url}  (OpenAPI docs: {api_url}/docs)")
    console.print(f"  API metrics   {api_url}/metrics")
    console.print(f"  batches       {api_url}/v1/files, {api_url}/v1/batches (OpenAI's Batch API)")
    for url in worker_urls:
        console.print(f"  worker        {url}/metrics  {url}/healthz  {url}/readyz")
    console.print(f"  logs          {log_dir}")
    console.print("\nfrom Python, with the openai client:")
    console.print(
        "  from openai import OpenAI\n"
        f'  client = OpenAI(base_url="{api_url}/v1", api_key="unused")\n'
        f'  reply = client.chat.completions.create(model="{model}",\n'
        '      messages=[{"role": "user", "content": "Hello!"}])\n'
        "  print(reply.choices[0].message.content)",
        highlight=False,
    )
    console.print("\nwith curl:")
    console.print(
        f"  curl {api_url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        f'    -d \'{{"model": "{model}", "messages": '
        '[{"role": "user", "content": "Hello!"}]}\'',
        highlight=False,
        markup=False,
    )


def _first_request(api_url: str, model: str) -> None:
    """The banner's own request, as a client with the openai client's defaults sends it
    (no sampling fields), and the sampling the fleet applied to it."""
    body = {"model": model, "messages": [{"role": "user", "content": FIRST_PROMPT}]}
    started = time.monotonic()
    try:
        reply = httpx.post(f"{api_url}/v1/chat/completions", json=body, timeout=120)
        reply.raise_for_status()
        completion = reply.json()
        answer = completion["choices"][0]["message"]["content"].strip()
        job = httpx.get(f"{api_url}/v1/jobs/{completion['id']}-0", timeout=10).json()
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as error:
        console.print(f"[yellow]the first request failed: {error!r}; the fleet serves on[/]")
        return
    console.print(f"\n> {FIRST_PROMPT}\n{answer}", highlight=False, markup=False)
    console.print(f"[dim]({time.monotonic() - started:.1f} s through the whole fleet)[/]")
    applied = job.get("sampling") or {}
    shown = ", ".join(f"{name}={applied[name]}" for name in SHOWN_SAMPLING if name in applied)
    console.print(
        f"[dim]sampled with {shown}: the model's defaults for fields a request leaves unset "
        "(--override-generation-config JSON to change them, --generation-config vllm for "
        "none)[/]",
        highlight=False,
    )


def _serve(fleet: LocalFleet, stop: threading.Event) -> None:
    """Until Ctrl-C or SIGTERM; a worker that exits is started again, with its id."""
    while not stop.wait(0.5):
        for worker_id, worker in list(fleet.workers.items()):
            if not worker.alive:
                code = worker.process.returncode
                console.print(f"[yellow]{worker_id} exited ({code}); starting it again[/]")
                fleet.restart_worker(worker_id)


def run_up(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise ValueError("--workers must be at least 1")
    models = _served_models(args.model or [EngineConfig.model_fields["model"].default])
    engine = given_settings(args, EngineConfig)
    engine.pop("model", None)  # each worker gets its model as resolved here
    EngineConfig(**engine)  # a knob out of bounds stops here, not in every worker
    served_name = models[0][1]  # the default model
    workers = args.workers * len(models)
    metrics_ports = [args.metrics_port + i for i in range(workers)]
    _check_port_free(args.port, "the API")
    for port in metrics_ports:
        _check_port_free(port, "a worker's metrics")
    if workers > 1 and "engine_threads" not in engine:
        # Several workers share this host's cores (all but one from four cores).
        engine["engine_threads"] = threads_per_worker(workers)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="genfleet-up-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    redis_dir = None if args.data_dir is None else args.data_dir / "redis"
    with local_fleet(models[0][0], log_dir, redis_data_dir=redis_dir, own_group=True) as fleet:
        ports = iter(metrics_ports)
        for number, (model, served) in enumerate(models):
            lanes = [] if number == 0 else ["--served-model-name", served]
            for port in islice(ports, args.workers):
                metrics = ["--metrics-host", "127.0.0.1", "--metrics-port", str(port)]
                flags = [*as_flags(engine), *reply_flags(args)]
                fleet.start_worker("--model", model, *lanes, *metrics, *flags)
        shared = ["--model", served_name, "--files-dir", str((args.data_dir or log_dir) / "files")]
        # A window of a quarter of each worker's sequences keeps interactive TTFT near the
        # idle fleet's on CPU workers (docs/benchmarks.md, "Interactive requests while a
        # batch runs").
        window = str(BATCH_LINES_PER_WORKER * args.workers)
        fleet.start_batch_runner(*shared, "--batch-max-in-flight", window)
        api = fleet.start_api("--host", "127.0.0.1", *shared, port=args.port)
        worker_urls = [f"http://127.0.0.1:{port}" for port in metrics_ports]
        try:
            _wait_until_ready(fleet, [*worker_urls, api.url], stop)
            if not stop.is_set():
                _print_welcome(api.url, worker_urls, [served for _, served in models], log_dir)
                if not args.no_first_request:
                    _first_request(api.url, served_name)
                console.print("\n[dim]Ctrl-C stops the fleet[/]")
                _serve(fleet, stop)
        finally:
            with console.status("stopping: the API, then the workers (draining), Redis, Kafka"):
                fleet.stop_gracefully(API_STOP_S)
    console.print("genfleet stopped")
    return 0
