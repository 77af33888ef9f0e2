"""``genfleet bench --fleet``: the whole fleet against the offline engine, same requests.

A local broker, Redis, one worker and the API are started here; each workload
is sent over HTTP with the official ``openai`` client (streamed, token-id
prompts, so both paths see the same tokens) at its arrival times, and the
offline engine runs the same requests with the same arrival times in this
process while the fleet is stopped. Each job's result carries when the worker
took it and when the engine made its first token, which splits the time to
first token the fleet adds into: reaching the API, reaching the worker (Kafka,
intake), the engine (queue and prefill), and getting back (Redis, API, SSE).
"""

import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaConsumer

from genfleet.bench.metrics import RequestTiming, RunSummary, summarize
from genfleet.bench.workloads import BenchRequest
from genfleet.local_fleet import local_fleet
from genfleet.settings_flags import as_flags
from queue_schemas import JobResult, Names

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from worker.service.settings import WorkerSettings

FLEET_TIMEOUT_S = 600.0


@dataclass
class FleetRequest:
    """One request as the client saw it (wall-clock seconds), and its job id."""

    sent_at: float
    first_chunk_at: float
    done_at: float
    completion_tokens: int
    job_id: str


@dataclass
class Breakdown:
    """Median seconds of each leg of the time to first token, over a run's requests."""

    to_api: float  # arrival -> the API made the job (client, HTTP, validation)
    to_worker: float  # the API made it -> the worker took it (Kafka, intake, Redis)
    in_engine: float  # the worker took it -> its first token (engine queue, prefill)
    back: float  # first token -> the client's first chunk (Redis, API, SSE)


@dataclass
class FleetRun:
    summary: RunSummary
    breakdown: Breakdown


# The settings the worker takes from the benchmark's; engine threads left unset are the
# worker's default, which the offline engine gets too.
WORKER_FIELDS = {
    "device", "dtype", "max_num_seqs", "max_num_batched_tokens", "enforce_eager",
    "engine_threads", "stream_interval",
}  # fmt: skip


def worker_flags(settings: "WorkerSettings") -> list[str]:
    """The worker's engine settings, the same as the offline engine's."""
    given = settings.model_dump(include=WORKER_FIELDS, exclude_none=True)
    # The bench's whole workload is waiting at once in a burst.
    return as_flags({**given, "max_waiting": 256})


async def stream_completion(
    client: "AsyncOpenAI", model: str, request: BenchRequest, start: float
) -> FleetRequest:
    """One streamed completion. The official client makes the request; its chunks are
    read as plain JSON lines, as load generators do (vLLM's serving benchmark too), so
    that building a typed object per token does not take the fleet's cores."""
    await asyncio.sleep(max(0.0, start + request.arrival - time.time()))
    sent_at = start + request.arrival  # latency counts from the arrival, as offline
    first, tokens, run_id = None, 0, ""
    async with client.completions.with_streaming_response.create(
        model=model,
        prompt=request.prompt_token_ids,
        max_tokens=request.output_len,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ) as response:
        async for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue  # keep-alive comments, blank lines, [DONE]
            chunk = json.loads(line[len("data: ") :])
            run_id = chunk["id"]
            if chunk["choices"] and first is None:
                first = time.time()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    done = time.time()
    return FleetRequest(sent_at, first or done, done, tokens, f"{run_id}-0")


async def _results(bootstrap: str, names: Names, job_ids: set[str]) -> dict[str, JobResult]:
    consumer = AIOKafkaConsumer(
        names.results_topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    found: dict[str, JobResult] = {}
    try:
        while not job_ids <= set(found):
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    if record.value is not None:
                        result = JobResult.model_validate_json(record.value)
                        found[result.job_id] = result
    finally:
        await consumer.stop()
    return found


def _seconds(moment: datetime | None) -> float:
    assert moment is not None, "a completed job's result has every timestamp"
    return moment.timestamp()


def timings_of(seen: list[FleetRequest], start: float) -> list[RequestTiming]:
    """The client's view of each request, in seconds from ``start``."""
    return [
        RequestTiming(r.sent_at - start, r.first_chunk_at - start, r.done_at - start,
                      r.completion_tokens)
        for r in seen
    ]  # fmt: skip


async def _run(
    client: "AsyncOpenAI", bootstrap: str, names: Names, model: str, requests: list[BenchRequest]
) -> FleetRun:
    start = time.time() + 0.2
    seen = await asyncio.gather(*(stream_completion(client, model, r, start) for r in requests))
    results = await _results(bootstrap, names, {r.job_id for r in seen})
    timings = timings_of(seen, start)
    legs = []
    for r in seen:
        result = results[r.job_id]
        made = _seconds(result.created_at)
        took, first = _seconds(result.started_at), _seconds(result.first_token_at)
        legs.append((made - r.sent_at, took - made, first - took, r.first_chunk_at - first))
    breakdown = Breakdown(*(statistics.median(leg) for leg in zip(*legs, strict=True)))
    return FleetRun(summarize("genfleet fleet", timings, 0, 0), breakdown)


def run_fleet(
    model: Path, flags: list[str], workloads: dict[str, list[BenchRequest]], served_name: str
) -> dict[str, FleetRun]:
    """Start a fleet with one worker, run each workload through it, stop it."""
    with (
        tempfile.TemporaryDirectory(prefix="genfleet-bench-") as logs,
        local_fleet(model, Path(logs)) as fleet,
    ):
        fleet.start_worker(*flags)
        api = fleet.start_api("--model", served_name)
        fleet.wait_until_serving()
        names = Names(fleet.prefix)
        # Concurrent, so the client's pool holds a connection for each request of a
        # burst: a real client keeps its connections, and offline there are none to open.
        concurrency = max(len(requests) for requests in workloads.values())
        warmup = [BenchRequest(0.0, [1] * 64, 4)] * concurrency

        async def all_workloads() -> dict[str, FleetRun]:
            from openai import AsyncOpenAI

            base_url = f"{api.url}/v1"
            async with AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
                await _run(client, fleet.kafka.address, names, served_name, warmup)
                return {
                    name: await _run(client, fleet.kafka.address, names, served_name, requests)
                    for name, requests in workloads.items()
                }

        return asyncio.run(asyncio.wait_for(all_workloads(), FLEET_TIMEOUT_S))
