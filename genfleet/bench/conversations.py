"""``genfleet bench --conversations``: multi-turn chats on a two-worker fleet, jobs keyed
by conversation (``--partition-key affinity``, the default) against keyed by job id,
and on one worker (which holds every conversation's cache: the rate to keep).

Each run starts a fresh fleet (broker, Redis, the workers of one engine thread
each, the API). Forty conversations start half a second apart; each has four
turns, and every turn resends the whole history (the first question, a long
passage, then the model's answers and short follow-ups), streamed through the
official ``openai`` client, greedy, a fixed number of output tokens. A turn's
``usage.prompt_tokens_details.cached_tokens`` says how much of its prompt the
worker that ran it found in its prefix cache: the fleet-wide hit rate of turns
2-4 is cached over prompt tokens, and their median time to first token shows
what a hit saves. The two key choices run alternately, each ``rounds`` times.
"""

import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from genfleet.bench.workloads import english_passages
from genfleet.local_fleet import local_fleet

CONVERSATIONS = 40
TURNS = 4
START_GAP_S = 0.5
THINK_S = 0.5
OPENING_WORDS = 180  # the first question's passage: about 250 tokens
OUTPUT_TOKENS = 16
FOLLOW_UPS = ["Say more about that.", "Why does it matter?", "Give an example.", "And then?"]
TIMEOUT_S = 900.0


@dataclass
class Turn:
    number: int  # 1-based
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int


def _openings(seed: int) -> list[str]:
    rng = random.Random(f"conversations-{seed}")
    passages = english_passages()
    openings = []
    for i in range(CONVERSATIONS):
        words = rng.choice(passages).split()
        start = rng.randrange(max(1, len(words) - OPENING_WORDS))
        excerpt = " ".join(words[start : start + OPENING_WORDS])
        openings.append(f"Conversation {i}. Read this passage:\n\n{excerpt}\n\nWhat is it about?")
    return openings


async def _conversation(client, model: str, opening: str, delay_s: float) -> list[Turn]:
    await asyncio.sleep(delay_s)
    messages = [{"role": "user", "content": opening}]
    turns = []
    for number in range(1, TURNS + 1):
        sent = time.monotonic()
        first, answer, usage = None, [], None
        stream = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=OUTPUT_TOKENS, temperature=0,
            stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.monotonic()
                answer.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        assert usage is not None, "the stream ends with its usage"
        details = usage.prompt_tokens_details
        cached = details.cached_tokens if details and details.cached_tokens else 0
        turns.append(Turn(number, (first or time.monotonic()) - sent, usage.prompt_tokens, cached))
        messages.append({"role": "assistant", "content": "".join(answer)})
        messages.append({"role": "user", "content": FOLLOW_UPS[(number - 1) % len(FOLLOW_UPS)]})
        await asyncio.sleep(THINK_S)
    return turns


@dataclass
class KeyRun:
    setup: str
    hit_rate: float  # turns 2-4: cached prompt tokens over prompt tokens
    first_turn_hit_rate: float
    ttft_p50_s: float  # turns 2-4
    seconds: float


def _run(
    model_path: Path, served: str, setup: tuple[str, int], flags: list[str], seed: int
) -> KeyRun:
    partition_key, workers = setup
    with (
        tempfile.TemporaryDirectory(prefix="genfleet-bench-") as logs,
        local_fleet(model_path, Path(logs)) as fleet,
    ):
        for _ in range(workers):
            fleet.start_worker("--engine-threads", "1", *flags)
        api = fleet.start_api("--model", served, "--partition-key", partition_key)
        fleet.wait_until_serving()

        async def everything() -> tuple[list[Turn], float]:
            from openai import AsyncOpenAI

            async with AsyncOpenAI(
                base_url=f"{api.url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S
            ) as client:
                await _conversation(client, served, "Warm up.", 0.0)
                began = time.monotonic()
                chats = await asyncio.gather(
                    *(
                        _conversation(client, served, opening, i * START_GAP_S)
                        for i, opening in enumerate(_openings(seed))
                    )
                )
                return [turn for chat in chats for turn in chat], time.monotonic() - began

        turns, seconds = asyncio.run(asyncio.wait_for(everything(), TIMEOUT_S))
    later = [t for t in turns if t.number > 1]
    firsts = [t for t in turns if t.number == 1]
    return KeyRun(
        f"{partition_key}, {workers} worker{'s' if workers > 1 else ''}",
        sum(t.cached_tokens for t in later) / sum(t.prompt_tokens for t in later),
        sum(t.cached_tokens for t in firsts) / sum(t.prompt_tokens for t in firsts),
        statistics.median(t.ttft_s for t in later),
        seconds,
    )


def run_conversations(
    model_path: Path, served: str, flags: list[str], seed: int, rounds: int, console: Console
) -> int:
    # The single worker holds every conversation: the hit rate affinity should keep.
    order = [("affinity", 2), ("job_id", 2), ("job_id", 1)]
    runs = []
    for round_ in range(rounds):
        for setup in order if round_ % 2 == 0 else order[::-1]:
            console.print(
                f"[dim]round {round_ + 1}: --partition-key {setup[0]}, {setup[1]} workers[/dim]"
            )
            runs.append(_run(model_path, served, setup, flags, seed))
    table = Table(
        title=f"{CONVERSATIONS} conversations x {TURNS} turns on two workers "
        f"({OUTPUT_TOKENS} output tokens a turn)"
    )
    for column in (
        "fleet", "prefix-cache hit rate, turns 2-4", "turn 1 hit rate",
        "TTFT p50, turns 2-4", "all turns done in",
    ):  # fmt: skip
        table.add_column(column)
    for run in runs:
        table.add_row(
            run.setup, f"{100 * run.hit_rate:.1f} %", f"{100 * run.first_turn_hit_rate:.1f} %",
            f"{run.ttft_p50_s:.3f} s", f"{run.seconds:.1f} s",
        )  # fmt: skip
    console.print(table)
    return 0
