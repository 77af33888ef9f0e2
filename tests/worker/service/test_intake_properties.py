"""Property tests: whatever a Kafka record or an OpenAI body holds, the worker's path
from bytes to engine either refuses it with a reason or serves it, and the engine
goes on serving the next request."""

import json
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from pydantic import ValidationError

from producer_api.auth import Tenant
from producer_api.schemas.openai import ChatCompletionRequest, CompletionRequest
from producer_api.services.runs import jobs_for
from queue_schemas import JobRequest
from queue_schemas.bounds import MAX_RECORD_BYTES
from tests.slow import SLOW
from tests.strategies import chat_bodies, completion_bodies, job_records, json_values
from worker import SamplingParams
from worker.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.engine_process.prompts import engine_prompt
from worker.service.records import Rejected, parse_job

SETTINGS = hypothesis.settings(
    max_examples=400 if SLOW else 150,
    deadline=None,
    database=None,
    derandomize=not SLOW,  # CI sees the same examples every run
    suppress_health_check=list(hypothesis.HealthCheck),
)
STEPS = 3  # engine steps per example: prefill and a couple of tokens


@pytest.fixture(scope="module")
def engine(chat_model: Path) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=str(chat_model), max_model_len=256, num_gpu_blocks_override=64)
    )


class Served:
    """The worker's path from a record to the engine, counting how each record ended."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.ends: dict[str, int] = {}
        self._ids = 0

    def record(self, raw: bytes | None) -> None:
        job = parse_job(raw, MAX_RECORD_BYTES)
        if isinstance(job, Rejected):
            assert job.reason, "a dead letter needs a reason"
            self._count("dead letter")
            return
        self.job(job)

    def job(self, job: JobRequest) -> None:
        request_id = f"r{self._ids}"
        self._ids += 1
        try:
            prompt = engine_prompt(job, self.engine.tokenizer)
            self.engine.add_request(request_id, prompt, job.requested_sampling(), job.priority)
        except ValueError as refusal:  # the worker's dead letter and failed result
            assert str(refusal)
            self._count("refused")
            return
        for _ in range(STEPS):
            self.engine.step()
        self.engine.abort_request(request_id)
        self.engine.step()  # the abort's final delta; the engine is idle again
        assert not self.engine.has_unfinished_requests()
        self._count("served")

    def still_serves(self) -> None:
        self.engine.add_request("canary", "The sea is", SamplingParams(max_tokens=3, temperature=0))
        finished = []
        while self.engine.has_unfinished_requests():
            finished += [d for d in self.engine.step() if d.finished]
        assert [d.finish_reason for d in finished] == ["length"]

    def _count(self, end: str) -> None:
        self.ends[end] = self.ends.get(end, 0) + 1


def test_any_job_record_is_dead_lettered_refused_or_served(engine: LLMEngine) -> None:
    served = Served(engine)

    @SETTINGS
    @hypothesis.given(document=job_records | json_values)
    def attempt(document: object) -> None:
        served.record(json.dumps(document).encode())

    attempt()
    served.still_serves()
    # The strategies reach all three ends; a bound that rejected everything would fail here.
    assert set(served.ends) == {"dead letter", "refused", "served"}, served.ends


def _openai_jobs(model: type, body: dict[str, Any]) -> list[JobRequest] | None:
    """The API's translation of a body into jobs; None when it answers 422."""
    try:
        request = model.model_validate(body)
    except ValidationError:
        return None
    if isinstance(request, ChatCompletionRequest):
        prompts = [request.chat_fields()]
    else:
        prompts = [
            {"prompt": p} if isinstance(p, str) else {"prompt_token_ids": p}
            for p in request.prompts()
        ]
    return jobs_for("run", Tenant(tenant="acme"), request, prompts)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_any_openai_body_is_a_422_or_jobs_the_worker_takes(engine: LLMEngine, kind: str) -> None:
    served = Served(engine)
    model, bodies = {
        "chat": (ChatCompletionRequest, chat_bodies),
        "completion": (CompletionRequest, completion_bodies),
    }[kind]
    outcomes = {"422": 0, "jobs": 0}

    @SETTINGS
    @hypothesis.given(body=bodies)
    def attempt(body: dict[str, Any]) -> None:
        jobs = _openai_jobs(model, body)  # a JobRequest it cannot build would be a 500
        if jobs is None:
            outcomes["422"] += 1
            return
        outcomes["jobs"] += 1
        for job in jobs[:2]:
            # As the worker reads it: through the record's bytes.
            served.record(job.model_dump_json().encode())

    attempt()
    served.still_serves()
    assert outcomes["422"] and outcomes["jobs"], outcomes
    assert served.ends.get("served"), served.ends
