"""Attack a fleet the way its users and its outages will, and print one line per scenario.

Against a whole fleet started here (the local broker and Redis, N workers):

    python scripts/chaos.py --local --model PATH [--workers 2] [--scenario poison_records] \
        [--worker-flag=--kafka-session-timeout-ms --worker-flag=3000] [--log-dir DIR]

Against your own deployment, with the faults given as shell commands (a
scenario whose fault is not given is skipped); ``{seconds}`` is replaced by the
length of the fault:

    python scripts/chaos.py --kafka-bootstrap kafka:9092 --redis-url redis://redis:6379/0 \\
        --kill-worker 'kubectl delete pod -l app=genfleet-worker --force --grace-period=0 \\
                       -o name | head -1' \\
        --pause-broker 'docker pause kafka; sleep {seconds}; docker unpause kafka' \\
        --restart-redis 'docker stop redis; sleep {seconds}; docker start redis' \\
        --workers-alive 'kubectl get pods -l app=genfleet-worker --no-headers | wc -l'

The exit status is 0 when every scenario run passed. Scenarios produce jobs of
their own (ids ``chaos-<run>-...``) to the fleet's jobs topic and read the
results and dead-letter topics and Redis, as an ETL team and an SSE client
would; they need the tenant ``default`` (the worker's default).
"""

import argparse
import asyncio
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from genfleet.chaos import scenarios
from genfleet.chaos.target import Faults, Target, Verdict
from genfleet.local_fleet import local_fleet
from worker.engine_process.threads import threads_per_worker

SCENARIOS = {scenario.__name__: scenario for scenario in scenarios.ALL}


def _shell(command: str, seconds: float | None = None) -> str:
    if seconds is not None:
        command = command.replace("{seconds}", f"{seconds:g}")
    done = subprocess.run(command, shell=True, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _worker_hook(command: str | None) -> Callable[[str | None], str] | None:
    if command is None:
        return None
    return lambda worker_id: _shell(command.replace("{worker}", worker_id or ""))


def _hook(command: str | None, takes_seconds: bool = False) -> Callable | None:
    if command is None:
        return None
    if takes_seconds:
        return lambda seconds: _shell(command, seconds)
    return lambda: _shell(command)


def remote_target(args: argparse.Namespace) -> Target:
    alive = _hook(args.workers_alive)
    faults = Faults(
        # The command picks its victim: the worker id a scenario would prefer is in
        # {worker}, for a command that can use it.
        kill_worker=_worker_hook(args.kill_worker),
        pause_broker=_hook(args.pause_broker, takes_seconds=True),
        restart_broker=_hook(args.restart_broker),
        restart_redis=_hook(args.restart_redis, takes_seconds=True),
        workers_alive=None if alive is None else lambda: int(alive()),
    )
    return Target(args.kafka_bootstrap, args.redis_url, args.topic_prefix, faults=faults)


async def run_all(
    target: Target, names: list[str], between: Callable[[], None] | None = None
) -> list[Verdict]:
    """Each scenario in turn; ``between`` runs before each (a local fleet revives the
    workers the last one killed)."""
    verdicts = []
    for name in names:
        if between is not None:
            await asyncio.to_thread(between)
        verdict = await SCENARIOS[name](target)
        print(verdict.line(), flush=True)
        verdicts.append(verdict)
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS),
        help="run this scenario (repeatable; default: all)",
    )  # fmt: skip
    parser.add_argument("--timeout-s", type=float, default=240.0, help="patience per step")
    local = parser.add_argument_group("a fleet started here")
    local.add_argument("--local", action="store_true")
    local.add_argument("--model", type=Path, help="model folder for the local workers")
    local.add_argument("--workers", type=int, default=2)
    local.add_argument("--worker-flag", action="append", default=[], help="passed to workers")
    local.add_argument("--log-dir", type=Path, help="keep the fleet's logs here")
    remote = parser.add_argument_group("your deployment")
    remote.add_argument("--kafka-bootstrap")
    remote.add_argument("--redis-url")
    remote.add_argument("--topic-prefix", default="genfleet.")
    remote.add_argument(
        "--kill-worker",
        help="kill -9 one worker; may print its worker id ({worker}: the one a scenario "
        "would pick, e.g. the busiest)",
    )
    remote.add_argument("--pause-broker", help="freeze the broker for {seconds}")
    remote.add_argument("--restart-broker", help="restart the broker")
    remote.add_argument("--restart-redis", help="stop Redis, wait {seconds}, start it")
    remote.add_argument("--workers-alive", help="print how many workers are alive")
    args = parser.parse_args(argv)
    names = args.scenario or list(SCENARIOS)

    if args.local:
        if args.model is None:
            parser.error("--local needs --model")
        with (
            tempfile.TemporaryDirectory() as scratch,
            local_fleet(args.model, args.log_dir or Path(scratch)) as fleet,
        ):
            # Workers on one host share its cores, as under `genfleet up --workers N`.
            share = ["--engine-threads", str(threads_per_worker(args.workers))]
            for _ in range(args.workers):
                fleet.start_worker(*share, *args.worker_flag)
            fleet.wait_until_serving()
            target = fleet.target()
            target.timeout_s = args.timeout_s
            verdicts = asyncio.run(run_all(target, names, between=fleet.revive))
    else:
        if not args.kafka_bootstrap or not args.redis_url:
            parser.error("give --local, or --kafka-bootstrap and --redis-url")
        target = remote_target(args)
        target.timeout_s = args.timeout_s
        verdicts = asyncio.run(run_all(target, names))
    return 0 if all(verdict.passed for verdict in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
