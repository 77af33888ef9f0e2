"""Which partition a job goes to: the turns of one conversation to the same one.

A Kafka record's key picks its partition (murmur2 of the key, as every Kafka
client does), and a partition is read by one worker at a time: keying the jobs
of a conversation alike sends them to the worker whose prefix cache holds their
history, for every API process at once, with no routing table to keep.

The key (``affinity_key``) is the tenant and, in this order:
- the request's ``prompt_cache_key`` (OpenAI's field for it), else its ``user``;
- else a digest of the job's opening, the part a later turn resends unchanged:
  the messages up to and including the first user message; the first
  ``OPENING_CHARS`` characters of a text prompt; the first ``OPENING_TOKENS`` ids
  of a token-id prompt.

A hot key cannot hold one partition: ``Spill`` counts each key's jobs in Redis
per ``affinity_window_s`` window, shared by every API process, and past
``affinity_spill_after`` jobs in a window the next ones go to the key's next
lane (``key#1``, ``key#2``, ...), a partition of its own as murmur2 spreads
them. A conversation sends a turn at a time and never spills; the same prompt
sent by hundreds of clients at once spreads over the partitions.
"""

import hashlib
import time
from collections import Counter

from redis.asyncio import Redis

from queue_schemas import JobRequest, Names

# A text prompt's opening: about four KV blocks of English text.
OPENING_CHARS = 256
# A token-id prompt's opening: four KV blocks of 16.
OPENING_TOKENS = 64


def opening(job: JobRequest) -> str:
    """What a later turn of the job's conversation starts with too."""
    if job.messages is not None:
        parts = []
        for message in job.messages:
            parts.append(f"{message.role}\x00{message.content}")
            if message.role == "user":
                break
        return "\x01".join(parts)
    if job.prompt_token_ids is not None:
        return ",".join(map(str, job.prompt_token_ids[:OPENING_TOKENS]))
    return (job.prompt or "")[:OPENING_CHARS]


def affinity_key(job: JobRequest, hint: str | None = None) -> str:
    """The tenant and the hint given (``prompt_cache_key`` or ``user``), else a digest
    of the job's opening."""
    text = f"hint\x00{hint}" if hint else f"opening\x00{opening(job)}"
    digest = hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
    return f"{job.tenant}/{digest}"


class Spill:
    """Each key's jobs counted per window in Redis; past the bound, the next lane."""

    def __init__(self, redis: Redis, names: Names, spill_after: int, window_s: float) -> None:
        self.redis = redis
        self.names = names
        self.spill_after = spill_after
        self.window_s = window_s

    async def lanes(self, keys: list[str]) -> list[str]:
        """Each job's record key: its affinity key, or a later lane of it when the key
        has had ``spill_after`` jobs in this window."""
        window = int(time.time() // self.window_s)
        counts = Counter(keys)
        pipe = self.redis.pipeline(transaction=False)
        for key in counts:
            counter = self.names.affinity_counter_key(key, window)
            pipe.incrby(counter, counts[key])
            pipe.expire(counter, int(2 * self.window_s) + 1)
        replies = await pipe.execute()
        # The jobs of a key in this window numbered from the first of this call.
        next_number = {
            key: int(total) - counts[key] for key, total in zip(counts, replies[::2], strict=True)
        }
        lanes = []
        for key in keys:
            lane = next_number[key] // self.spill_after
            next_number[key] += 1
            lanes.append(key if lane == 0 else f"{key}#{lane}")
        return lanes
