"""Seeded request sets: chat-templated English prompts, fixed output lengths, arrival times."""

import random
from dataclasses import dataclass
from pydoc_data.topics import topics

from transformers import PreTrainedTokenizerBase

PROMPT_TOKENS = (100, 300)
OUTPUT_TOKENS = (20, 200)
WORKLOAD_SIZES = {"burst": 20, "poisson": 64}


@dataclass(frozen=True)
class BenchRequest:
    arrival: float  # seconds after the start of the run
    prompt_token_ids: list[int]
    output_len: int


def english_passages() -> list[str]:
    """Real English prose that ships with Python: the language reference's help topics."""
    return [text for _, text in sorted(topics.items()) if len(text) > 2000]


def chat_prompt(tokenizer: PreTrainedTokenizerBase, content: str) -> list[int]:
    """One user message, chat-templated, as the model's prompt."""
    messages = [{"role": "user", "content": content}]
    ids = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    return list(ids)


def _prompt(
    tokenizer: PreTrainedTokenizerBase, rng: random.Random, passages: list[str]
) -> list[int]:
    target = rng.randint(*PROMPT_TOKENS)
    words = rng.choice(passages).split()
    start = rng.randrange(max(1, len(words) - 400))
    # Grow the excerpt until the templated prompt reaches its target length.
    for n in range(40, 400, 5):
        excerpt = " ".join(words[start : start + n])
        ids = chat_prompt(tokenizer, f"Summarize this passage:\n\n{excerpt}")
        if len(ids) >= target:
            return ids[:target]
    return ids


def make_workload(
    name: str, tokenizer: PreTrainedTokenizerBase, seed: int, rate: float | None = None
) -> list[BenchRequest]:
    """``burst``: all at t=0. ``poisson``: exponential gaps at ``rate`` requests per second."""
    if name not in WORKLOAD_SIZES:
        raise ValueError(f"unknown workload {name!r}; known: {sorted(WORKLOAD_SIZES)}")
    if name == "poisson" and not rate:
        raise ValueError("the poisson workload needs an arrival rate")
    rng = random.Random(f"{name}-{seed}")
    passages = english_passages()
    arrival = 0.0
    requests = []
    for _ in range(WORKLOAD_SIZES[name]):
        requests.append(
            BenchRequest(arrival, _prompt(tokenizer, rng, passages), rng.randint(*OUTPUT_TOKENS))
        )
        if name == "poisson":
            arrival += rng.expovariate(rate)
    return requests
