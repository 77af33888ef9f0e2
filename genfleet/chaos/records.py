"""Records and request bodies no fleet should choke on.

``bad_records`` are what a careless or hostile producer puts on the jobs topic;
``EXTREME_*`` are the values that break integer types and loops; the property
tests draw from the same pools.
"""

import json
from dataclasses import dataclass

from queue_schemas.bounds import MAX_RECORD_BYTES

# Integers at and around the edges of every type an engine may use.
EXTREME_INTS = (
    -(2**64), -(2**63) - 1, -(2**63), -(2**31) - 1, -(2**31), -2, -1, 0, 1, 2, 20, 21, 2**16,
    2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30,
)  # fmt: skip
EXTREME_FLOATS = (
    float("nan"), float("inf"), float("-inf"), -0.0, 1e-320, 1e-5, 2.0000001, 1e308,
)  # fmt: skip
EXTREME_STRINGS = ("", " ", ":", "x:cancel", "x:events", "\x00", "é" * 3, "\ud7ff", "a" * 5000)


@dataclass(frozen=True)
class BadRecord:
    label: str
    key: bytes | None
    value: bytes | None
    # The job id a worker can read from it (the job then also fails visibly), if any.
    job_id: str | None = None


def _job(job_id: str, **fields: object) -> bytes:
    document = {"job_id": job_id, "prompt": "hello", "sampling": {"max_tokens": 4}}
    document.update(fields)
    return json.dumps(document).encode()


def _sampling(job_id: str, **sampling: object) -> bytes:
    return _job(job_id, sampling={"max_tokens": 4, **sampling})


def bad_records(run: str, context_tokens: int) -> list[BadRecord]:
    """One of each kind of record a worker must dead-letter, every value distinct."""
    huge = MAX_RECORD_BYTES * 5
    return [
        BadRecord("tombstone", f"{run}-tomb".encode(), None),
        BadRecord("empty value", f"{run}-empty".encode(), b""),
        BadRecord("not utf-8", None, b"\xff\xfe\x00" + run.encode()),
        BadRecord("not json", None, f"{{not json {run}".encode()),
        BadRecord("json array", None, f'["{run}"]'.encode()),
        BadRecord("deep nesting", None, b"[" * 100_000 + run.encode() + b"]" * 100_000),
        BadRecord("over the size cap", None, _job(f"{run}-huge", prompt="x" * huge)),
        BadRecord(
            "prompt over the context",
            None,
            _job(f"{run}-long", prompt="word " * 160_000),
            f"{run}-long",
        ),
        BadRecord(
            "too many prompt tokens",
            None,
            _job(f"{run}-tokens", prompt=None, prompt_token_ids=[5] * (context_tokens + 10)),
            f"{run}-tokens",
        ),
        BadRecord(
            "token id past the vocabulary",
            None,
            _job(f"{run}-vocab", prompt=None, prompt_token_ids=[2**31 - 1]),
            f"{run}-vocab",
        ),
        BadRecord("top_k 2**63", None, _sampling(f"{run}-topk", top_k=2**63), f"{run}-topk"),
        BadRecord("seed 2**64", None, _sampling(f"{run}-seed", seed=2**64), f"{run}-seed"),
        BadRecord(
            "max_tokens 2**40", None, _sampling(f"{run}-max", max_tokens=2**40), f"{run}-max"
        ),
        BadRecord(
            "min over max tokens",
            None,
            _sampling(f"{run}-min", min_tokens=9, max_tokens=3),
            f"{run}-min",
        ),
        BadRecord(
            "NaN temperature",
            None,
            _sampling(f"{run}-nan", temperature=float("nan")),
            f"{run}-nan",
        ),
        BadRecord(
            "1000 stop strings",
            None,
            _sampling(f"{run}-stops", stop=[f"s{i}" for i in range(1000)]),
            f"{run}-stops",
        ),
        BadRecord("priority 2**70", None, _job(f"{run}-prio", priority=2**70), f"{run}-prio"),
        BadRecord("unknown schema version", None, _job(f"{run}-v9", schema_version=9), f"{run}-v9"),
        BadRecord("job id naming a key", None, _job(f"{run}:cancel")),
        BadRecord("tenant with a colon", None, _job(f"{run}-tenant", tenant="a:b")),
        BadRecord("no prompt", None, _job(f"{run}-none", prompt=None), f"{run}-none"),
    ]
