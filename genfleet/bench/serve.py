"""``genfleet bench --serve URL``: any OpenAI-compatible server, this benchmark's workload
and client, so a user compares ``genfleet up`` with ``vllm serve`` on their own host.

Each workload's requests are the fleet benchmark's (chat-templated prompts sent as
token ids, greedy, ``ignore_eos``, streamed with the official ``openai`` client at
their arrival times), after a warm-up burst of short requests. The Poisson
workload's rate, unless given, is derived from the burst's throughput on the
server under test: give ``--rate`` to send both servers the same arrivals.
"""

import asyncio
import time

from rich.console import Console

from genfleet.bench.fleet import FLEET_TIMEOUT_S, stream_completion, timings_of
from genfleet.bench.metrics import RunSummary, summarize
from genfleet.bench.workloads import BenchRequest

WARMUP_PROMPT_TOKENS = 64
WARMUP_OUTPUT_TOKENS = 4


def base_url(url: str) -> str:
    """``http://host:port`` or ``http://host:port/v1``: the OpenAI base URL."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


async def serve_workloads(
    url: str, model: str, workloads: dict[str, list[BenchRequest]], api_key: str = "unused"
) -> dict[str, RunSummary]:
    """Warm the server up, then each workload in turn; one summary per workload."""
    from openai import AsyncOpenAI

    concurrency = max(len(requests) for requests in workloads.values())
    warmup = [BenchRequest(0.0, [1] * WARMUP_PROMPT_TOKENS, WARMUP_OUTPUT_TOKENS)] * concurrency
    async with AsyncOpenAI(base_url=base_url(url), api_key=api_key, max_retries=0) as client:

        async def run(name: str, requests: list[BenchRequest]) -> RunSummary:
            start = time.time() + 0.2
            seen = await asyncio.gather(
                *(stream_completion(client, model, request, start) for request in requests)
            )
            short = [
                (got.completion_tokens, asked.output_len)
                for got, asked in zip(seen, requests, strict=True)
                if got.completion_tokens != asked.output_len
            ]
            if short:  # a server that ignores ignore_eos would be measured on less work
                raise ValueError(f"completion tokens (got, asked) differ: {short[:5]}")
            return summarize(name, timings_of(seen, start), 0, 0)

        await run("warm-up", warmup)
        return {name: await run(url, requests) for name, requests in workloads.items()}


def run_serve(
    url: str, model: str, workloads: dict[str, list[BenchRequest]], console: Console
) -> dict[str, RunSummary]:
    console.print(f"[dim]{url}: warm-up, then {', '.join(workloads)}[/dim]")
    return asyncio.run(asyncio.wait_for(serve_workloads(url, model, workloads), FLEET_TIMEOUT_S))
