"""OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

Each choice of a request is one fleet job (``{request id}-{position}``), so the
choices run in parallel across the fleet. A non-streaming request is held open
until every job has its result; a streaming one relays the jobs' token events
as chunks, and a client that hangs up cancels its jobs.
"""

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from sse_starlette import ServerSentEvent

from producer_api.auth import Tenant
from producer_api.dependencies import FleetDep, TenantDep
from producer_api.errors import ApiError
from producer_api.fleet import Fleet, new_id
from producer_api.openai_format import ChatShape, Shape, TextShape, created, error_body, usage_body
from producer_api.openai_schema import ChatCompletionRequest, CompletionRequest, GenerationRequest
from producer_api.streams import event_stream, merged_events
from queue_schemas import JobRequest, JobResult, JobStatus, TokenEvent
from queue_schemas.messages import now

log = logging.getLogger("genfleet.api")
router = APIRouter(prefix="/v1", tags=["openai"])
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


def build_run(body: GenerationRequest, run_id: str, model: str, tenant: Tenant) -> Run:
    """A chat or completions request body as the fleet jobs that answer it."""
    if isinstance(body, ChatCompletionRequest):
        messages = [message.as_chat_message() for message in body.messages]
        prompts: list[dict[str, Any]] = [{"messages": messages}]
        shape: Shape = ChatShape(body.top_logprobs_wanted())
    else:
        assert isinstance(body, CompletionRequest)
        prompts = [
            {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
            for prompt in body.prompts()
        ]
        shape = TextShape(body.top_logprobs_wanted())
    jobs = jobs_for(run_id, tenant, body, prompts)
    return Run(id=run_id, model=model, shape=shape, jobs=jobs, choices_per_prompt=body.n)


def _served_model(fleet: Fleet, requested: str | None) -> str:
    served = fleet.settings.model
    if requested and requested != served:
        raise ApiError(
            404, f"The model `{requested}` does not exist.", param="model", code="model_not_found"
        )
    return served


def jobs_for(
    run_id: str, tenant: Tenant, body: GenerationRequest, prompts: list[dict[str, Any]]
) -> list[JobRequest]:
    """n jobs per prompt; ``prompts`` hold JobRequest's prompt fields."""
    return [
        JobRequest(
            job_id=f"{run_id}-{position * body.n + choice}",
            tenant=tenant.tenant,
            sampling=body.sampling(choice),
            priority=body.priority,
            metadata={"request_id": run_id},
            created_at=now(),
            **prompt,
        )
        for position, prompt in enumerate(prompts)
        for choice in range(body.n)
    ]


async def _collect(
    fleet: Fleet, tenant: Tenant, run: Run
) -> tuple[dict[int, JobResult], list[list[TokenEvent]]]:
    results: dict[int, JobResult] = {}
    events: list[list[TokenEvent]] = [[] for _ in run.jobs]
    async for position, event in merged_events(
        fleet, tenant.tenant, run.job_ids, resume_when_slow=True
    ):
        if isinstance(event, JobResult):
            results[position] = event
        else:
            events[position].append(event)
    return results, events


async def _whole(fleet: Fleet, tenant: Tenant, run: Run, request: Request) -> Response:
    """Wait for every choice; a client that hangs up meanwhile gets its jobs cancelled."""
    collecting = asyncio.create_task(_collect(fleet, tenant, run))
    while not collecting.done():
        await asyncio.wait({collecting}, timeout=DISCONNECT_CHECK_S)
        if not collecting.done() and await request.is_disconnected():
            collecting.cancel()
            await _cancel_all(fleet, tenant, run, HUNG_UP)
            return Response(status_code=499)  # nobody reads it: nginx's "client closed"
    results, events = collecting.result()
    ordered = [results[position] for position in range(len(run.jobs))]
    for result in ordered:
        if result.status is JobStatus.FAILED:
            raise ApiError(400, result.error or "the job failed", code="job_failed")
    return JSONResponse(run.whole(ordered, events))


async def _chunks(
    fleet: Fleet, tenant: Tenant, run: Run, include_usage: bool
) -> AsyncIterator[ServerSentEvent]:
    """The SSE chunks of a streamed run, then ``[DONE]``; a failed job ends the stream
    with an error object, as OpenAI's API does."""
    shape = run.shape
    extra = {"usage": None} if include_usage else {}

    def chunk(choice: dict[str, Any]) -> ServerSentEvent:
        return ServerSentEvent(json.dumps(run.body(shape.chunk_object, choices=[choice], **extra)))

    for position in range(len(run.jobs)):
        opening = shape.opening(position)
        if opening is not None:
            yield chunk(opening)
    results: dict[int, JobResult] = {}
    async for position, event in merged_events(
        fleet, tenant.tenant, run.job_ids, resume_when_slow=True
    ):
        if isinstance(event, TokenEvent):
            yield chunk(shape.delta(position, event))
        elif event.status is JobStatus.FAILED:
            # The other choices are of no use now: free their blocks too.
            await _cancel_all(fleet, tenant, run, "a sibling choice failed")
            yield ServerSentEvent(json.dumps(error_body(event.error or "failed", "job_failed")))
            break
        else:
            results[position] = event
            yield chunk(shape.closing(position, event))
    else:
        if include_usage:
            ordered = [results[position] for position in range(len(run.jobs))]
            usage = usage_body(ordered, run.choices_per_prompt)
            yield ServerSentEvent(json.dumps(run.body(shape.chunk_object, choices=[], usage=usage)))
    yield ServerSentEvent("[DONE]")


async def _cancel_all(fleet: Fleet, tenant: Tenant, run: Run, why: str) -> None:
    """Cancel the run's unfinished jobs, so their KV blocks serve others."""
    for job_id in run.job_ids:
        try:
            await fleet.cancel(tenant, job_id)
            log.info("%s: cancelled %s", why, job_id, extra={"job_id": job_id})
        except ApiError:
            pass  # finished already


async def _respond(
    fleet: Fleet, tenant: Tenant, body: GenerationRequest, run: Run, request: Request
) -> Response:
    fleet.backlog.admit_interactive()
    await fleet.submit(tenant, run.jobs, route=request.url.path)
    if body.stream:
        chunks = _chunks(fleet, tenant, run, body.include_usage)
        hang_up = functools.partial(_cancel_all, fleet, tenant, run, HUNG_UP)
        return event_stream(fleet, chunks, on_hang_up=hang_up)
    return await _whole(fleet, tenant, run, request)


@router.get("/models")
async def list_models(fleet: FleetDep, _: TenantDep) -> dict[str, Any]:
    model = {"id": fleet.settings.model, "object": "model", "created": 0, "owned_by": "genfleet"}
    return {"object": "list", "data": [model]}


@router.post("/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, fleet: FleetDep, tenant: TenantDep
) -> Response:
    run = build_run(body, new_id("chatcmpl"), _served_model(fleet, body.model), tenant)
    return await _respond(fleet, tenant, body, run, request)


@router.post("/completions", response_model=None)
async def completions(
    body: CompletionRequest, request: Request, fleet: FleetDep, tenant: TenantDep
) -> Response:
    run = build_run(body, new_id("cmpl"), _served_model(fleet, body.model), tenant)
    return await _respond(fleet, tenant, body, run, request)
