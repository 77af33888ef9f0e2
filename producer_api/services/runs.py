"""An OpenAI request as fleet jobs (a ``Run``), and what the routes and the batch
runner do with one: collect its results, cancel what is unfinished.

Each choice of a request is one fleet job (``{request id}-{position}``), so the
choices run in parallel across the fleet.
"""

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from fastapi import Request

from producer_api.auth import Tenant
from producer_api.errors import ApiError
from producer_api.schemas.openai import ChatCompletionRequest, CompletionRequest, GenerationRequest
from producer_api.schemas.openai_format import ChatShape, Shape, TextShape, created, usage_body
from producer_api.schemas.reply_stream import ReplyParsers, ReplyStream
from producer_api.services.fleet import Fleet
from producer_api.services.streams import merged_events
from queue_schemas import JobRequest, JobResult, TokenEvent
from queue_schemas.jobs import lowest_version
from queue_schemas.messages import now

log = logging.getLogger("genfleet.api")
T = TypeVar("T")
# How often a request held open checks that its client is still there.
DISCONNECT_CHECK_S = 1.0
HUNG_UP = "client hung up"


@dataclass
class Run:
    """One OpenAI request as fleet jobs: ``choices_per_prompt`` consecutive jobs per prompt."""

    id: str
    model: str
    shape: Shape
    jobs: list[JobRequest]
    choices_per_prompt: int
    affinity_hint: str | None = None  # the request's prompt_cache_key or user

    @property
    def job_ids(self) -> list[str]:
        return [job.job_id for job in self.jobs]

    def body(self, object_name: str, **fields: Any) -> dict[str, Any]:
        envelope = {"id": self.id, "object": object_name, "created": created(), "model": self.model}
        return {**envelope, **fields}

    def whole(self, results: list[JobResult], events: list[list[TokenEvent]]) -> dict[str, Any]:
        """The route's response body, from every job's result (in order) and events."""
        choices = [self.shape.whole(i, result, events[i]) for i, result in enumerate(results)]
        usage = usage_body(results, self.choices_per_prompt)
        return self.body(self.shape.object, choices=choices, usage=usage)


def build_run(
    body: GenerationRequest,
    run_id: str,
    model: str,
    tenant: Tenant,
    deadline: datetime | None = None,
    parsers: ReplyParsers | None = None,
) -> Run:
    """A chat or completions request body as the fleet jobs that answer it, each with the
    request's ``deadline``; a chat's replies streamed as ``parsers`` read them (the
    model's workers' parsers; None: not known, the reply is sent once read whole)."""
    if isinstance(body, ChatCompletionRequest):
        jobs = jobs_for(run_id, tenant, body, [body.chat_fields()], deadline)
        streams = [ReplyStream(job.job_id, job.effective_tool_choice, parsers) for job in jobs]
        shape: Shape = ChatShape(body.top_logprobs_wanted(), streams)
    else:
        assert isinstance(body, CompletionRequest)
        prompts = [
            {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
            for prompt in body.prompts()
        ]
        jobs = jobs_for(run_id, tenant, body, prompts, deadline)
        shape = TextShape(body.top_logprobs_wanted())
    return Run(run_id, model, shape, jobs, body.n, body.affinity_hint)


def jobs_for(
    run_id: str,
    tenant: Tenant,
    body: GenerationRequest,
    prompts: list[dict[str, Any]],
    deadline: datetime | None = None,
) -> list[JobRequest]:
    """n jobs per prompt; ``prompts`` hold JobRequest's prompt fields."""
    samplings = [body.sampling(choice) for choice in range(body.n)]
    return [
        JobRequest(
            schema_version=lowest_version(sampling, prompt.get("tools"), prompt.get("messages")),
            job_id=f"{run_id}-{position * body.n + choice}",
            tenant=tenant.tenant,
            sampling=sampling,
            priority=body.priority,
            metadata={"request_id": run_id},
            deadline=deadline,
            created_at=now(),
            **prompt,
        )
        for position, prompt in enumerate(prompts)
        for choice, sampling in enumerate(samplings)
    ]


async def collect(
    fleet: Fleet, tenant: Tenant, job_ids: list[str]
) -> tuple[dict[int, JobResult], list[list[TokenEvent]]]:
    """Every job's result and token events, by its position in ``job_ids``."""
    results: dict[int, JobResult] = {}
    events: list[list[TokenEvent]] = [[] for _ in job_ids]
    async for position, event in merged_events(
        fleet, tenant.tenant, job_ids, resume_when_slow=True
    ):
        if isinstance(event, JobResult):
            results[position] = event
        else:
            events[position].append(event)
    return results, events


async def unless_hung_up(
    fleet: Fleet, tenant: Tenant, job_ids: list[str], request: Request, work: Awaitable[T]
) -> T | None:
    """``work``'s value, or None once the client has hung up (checked every
    ``DISCONNECT_CHECK_S``): ``work`` is dropped and the jobs are cancelled."""
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.wait({task}, timeout=DISCONNECT_CHECK_S)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            await cancel_all(fleet, tenant, job_ids, HUNG_UP)
            return None
    return task.result()


async def cancel_all(fleet: Fleet, tenant: Tenant, job_ids: list[str], why: str) -> None:
    """Cancel the unfinished ones of ``job_ids``, so their KV blocks serve others."""
    for job_id in job_ids:
        try:
            await fleet.cancel(tenant, job_id)
            log.info("%s: cancelled %s", why, job_id, extra={"job_id": job_id})
        except ApiError:
            pass  # finished already
