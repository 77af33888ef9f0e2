"""``genfleet bench --batch-mix``: interactive requests while a batch keeps the fleet busy.

A local broker, Redis, one worker, the API and the batch runner are started.
Interactive chat-sized requests (streamed completions, token-id prompts, short
outputs) arrive at a steady rate twice: on the idle fleet, then while a
200-line batch (``/v1/batches``) runs. The table compares their time to first
token, and gives the batch's own throughput. The batch's lines go to the batch
lane, which the worker stops reading first when its KV cache runs short, and
run behind interactive priority in the engine.
"""

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from transformers import PreTrainedTokenizerBase

from genfleet.bench.fleet import FleetRequest, stream_completion
from genfleet.bench.workloads import BenchRequest, make_workload
from genfleet.local_fleet import local_fleet

INTERACTIVE = 20
INTERACTIVE_RATE = 0.5  # requests per second
INTERACTIVE_TOKENS = 32
BATCH_LINES = 200
TIMEOUT_S = 1200.0


def _interactive(tokenizer: PreTrainedTokenizerBase, seed: int) -> list[BenchRequest]:
    prompts = make_workload("burst", tokenizer, seed)
    return [
        BenchRequest(i / INTERACTIVE_RATE, request.prompt_token_ids, INTERACTIVE_TOKENS)
        for i, request in enumerate(prompts[:INTERACTIVE])
    ]


def _batch_file(tokenizer: PreTrainedTokenizerBase, seed: int, model: str) -> bytes:
    requests: list[BenchRequest] = []
    for round_ in range(4):  # distinct prompts: no line rides on another's cached prefix
        requests += make_workload("poisson", tokenizer, seed + 100 + round_, rate=1.0)
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": model, "prompt": r.prompt_token_ids, "max_tokens": r.output_len,
                  "temperature": 0, "ignore_eos": True}}
        for i, r in enumerate(requests[:BATCH_LINES])
    ]  # fmt: skip
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def _wave(client, model: str, requests: list[BenchRequest]) -> list[FleetRequest]:
    start = time.time()
    return list(await asyncio.gather(*(stream_completion(client, model, r, start)
                                       for r in requests)))  # fmt: skip


def _completed(batch) -> int:
    return batch.request_counts.completed if batch.request_counts else 0


def _ttfts(wave: list[FleetRequest]) -> list[float]:
    return [r.first_chunk_at - r.sent_at for r in wave]


async def _measure(api_url: str, model: str, interactive: list[BenchRequest], batch: bytes):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0, timeout=600)
    await _wave(client, model, interactive[:2])  # warm-up
    idle = await _wave(client, model, interactive)
    uploaded = await client.files.create(file=("mix.jsonl", batch), purpose="batch")
    created = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    # Timed here: the batch's own *_at stamps are whole seconds.
    began = time.monotonic()
    # The batch has the engine busy before the wave starts.
    while not _completed(await client.batches.retrieve(created.id)):
        await asyncio.sleep(0.2)
    busy = await _wave(client, model, interactive)
    running = await client.batches.retrieve(created.id)
    while running.status not in ("completed", "failed", "cancelled", "expired"):
        await asyncio.sleep(0.1)
        running = await client.batches.retrieve(created.id)
    return idle, busy, running, time.monotonic() - began


def run_batch_mix(
    model: Path,
    flags: list[str],
    served_name: str,
    tokenizer: PreTrainedTokenizerBase,
    seed: int,
    window: int,
    console: Console,
) -> int:
    interactive = _interactive(tokenizer, seed)
    batch = _batch_file(tokenizer, seed, served_name)
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-") as logs:
        files = ["--files-dir", str(Path(logs) / "files"), "--model", served_name]
        with local_fleet(model, Path(logs)) as fleet:
            fleet.start_worker(*flags)
            fleet.start_batch_runner(*files, "--batch-max-in-flight", str(window))
            api = fleet.start_api(*files)
            fleet.wait_until_serving()
            console.print(f"[dim]{INTERACTIVE} interactive requests idle, then with a "
                          f"{BATCH_LINES}-line batch running ({window} lines at a time)"
                          "[/dim]")  # fmt: skip
            measure = _measure(api.url, served_name, interactive, batch)
            idle, busy, done, seconds = asyncio.run(asyncio.wait_for(measure, TIMEOUT_S))
    table = Table(title=f"interactive at {INTERACTIVE_RATE} req/s, {INTERACTIVE_TOKENS} tokens")
    for column in ("fleet", "TTFT p50 s", "TTFT mean s", "TTFT max s"):
        table.add_column(column, justify="left" if column == "fleet" else "right")
    for label, wave in (("idle", idle), (f"{BATCH_LINES}-line batch running", busy)):
        ttft = _ttfts(wave)
        table.add_row(label, f"{statistics.median(ttft):.3f}", f"{statistics.fmean(ttft):.3f}",
                      f"{max(ttft):.3f}")  # fmt: skip
    console.print(table)
    ratio = statistics.median(_ttfts(busy)) / statistics.median(_ttfts(idle))
    tokens = done.usage.output_tokens if done.usage else 0
    console.print(
        f"median TTFT with the batch running: x{ratio:.2f} the idle fleet's; batch {done.status}: "
        f"{_completed(done)}/{BATCH_LINES} lines, {tokens} output "
        f"tokens in {seconds:.1f} s from its creation ({tokens / seconds:.1f} tok/s)"
    )
    return 0
