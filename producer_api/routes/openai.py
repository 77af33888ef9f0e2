"""OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

A request becomes a ``Run`` of fleet jobs (``services.runs``). A non-streaming
request is held open until every job has its result; a streaming one relays the
jobs' token events as chunks, and a client that hangs up cancels its jobs.
"""

import functools
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from sse_starlette import ServerSentEvent

from producer_api.auth import Tenant
from producer_api.dependencies import DeadlineDep, FleetDep, TenantDep
from producer_api.errors import ApiError
from producer_api.schemas.openai import ChatCompletionRequest, CompletionRequest, GenerationRequest
from producer_api.schemas.openai_format import usage_body
from producer_api.services.fleet import Fleet, new_id
from producer_api.services.runs import (
    HUNG_UP,
    Run,
    build_run,
    cancel_all,
    collect,
    unless_hung_up,
)
from producer_api.services.streams import event_stream, merged_events
from queue_schemas import JobResult, JobStatus, TokenEvent

log = logging.getLogger("genfleet.api")
router = APIRouter(prefix="/v1", tags=["openai"])


async def _whole(fleet: Fleet, tenant: Tenant, run: Run, request: Request) -> Response:
    """Wait for every choice; a client that hangs up meanwhile gets its jobs cancelled."""
    job_ids = run.job_ids
    collected = await unless_hung_up(
        fleet, tenant, job_ids, request, collect(fleet, tenant, job_ids)
    )
    if collected is None:
        return Response(status_code=499)  # nobody reads it: nginx's "client closed"
    results, events = collected
    ordered = [results[position] for position in range(len(run.jobs))]
    for result in ordered:
        failure = _failure(result)
        if failure is not None:
            raise failure
    return JSONResponse(run.whole(ordered, events))


def _failure(result: JobResult) -> ApiError | None:
    """The error a job's result ends its request with: a failed job's reason (400), or an
    expired job's deadline (504, as a gateway whose upstream ran out of time; not worth
    a retry: the openai client retries a 504 unless told ``x-should-retry: false``)."""
    if result.status is JobStatus.FAILED:
        return ApiError(400, result.error or "the job failed", code="job_failed")
    if result.status is JobStatus.EXPIRED:
        return ApiError(
            504,
            result.error or "the request's deadline passed",
            kind="timeout_error",
            code="deadline_exceeded",
            headers={"x-should-retry": "false"},
        )
    return None


async def _chunks(
    fleet: Fleet, tenant: Tenant, run: Run, include_usage: bool
) -> AsyncIterator[ServerSentEvent]:
    """The SSE chunks of a streamed run, then ``[DONE]``; a failed or expired job ends
    the stream with an error object, as OpenAI's API does."""
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
            delta = shape.delta(position, event)
            if delta is not None:
                yield chunk(delta)
        elif (failure := _failure(event)) is not None:
            # The other choices are of no use now: free their blocks too.
            await cancel_all(fleet, tenant, run.job_ids, f"a sibling choice {event.status.value}")
            yield ServerSentEvent(json.dumps(failure.body()))
            break
        else:
            results[position] = event
            for closing in shape.closing(position, event):
                yield chunk(closing)
    else:
        if include_usage:
            ordered = [results[position] for position in range(len(run.jobs))]
            usage = usage_body(ordered, run.choices_per_prompt)
            yield ServerSentEvent(json.dumps(run.body(shape.chunk_object, choices=[], usage=usage)))
    yield ServerSentEvent("[DONE]")


async def _respond(
    fleet: Fleet, tenant: Tenant, body: GenerationRequest, run: Run, request: Request
) -> Response:
    fleet.backlog.admit_interactive(run.model)
    await fleet.submit(
        tenant, run.jobs, route=request.url.path, model=run.model, hint=run.affinity_hint
    )
    if body.stream:
        chunks = _chunks(fleet, tenant, run, body.include_usage)
        hang_up = functools.partial(cancel_all, fleet, tenant, run.job_ids, HUNG_UP)
        return event_stream(fleet, chunks, on_hang_up=hang_up)
    return await _whole(fleet, tenant, run, request)


@router.get("/models")
async def list_models(fleet: FleetDep, _: TenantDep) -> dict[str, Any]:
    """The fleet's default model and every model a live worker serves, with its context
    length where a live worker announces it (vLLM's ``max_model_len``)."""
    served = await fleet.models.served_models()
    lengths = await fleet.models.context_lengths(served)
    return {"object": "list", "data": [_model_card(model, lengths) for model in served]}


@router.get("/models/{model:path}")
async def retrieve_model(model: str, fleet: FleetDep, _: TenantDep) -> dict[str, Any]:
    """One served model, or 404 ``model_not_found``."""
    served = await fleet.models.resolve(model)
    return _model_card(served, await fleet.models.context_lengths([served]))


def _model_card(model: str, lengths: dict[str, int]) -> dict[str, Any]:
    card = {"id": model, "object": "model", "created": 0, "owned_by": "genfleet", "root": model}
    return card | ({"max_model_len": lengths[model]} if model in lengths else {})


@router.post("/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    fleet: FleetDep,
    tenant: TenantDep,
    deadlines: DeadlineDep,
) -> Response:
    deadline = deadlines.deadline(None, body.timeout_s, fleet.settings.chat_completions_timeout_s)
    model = await fleet.models.resolve(body.model)
    parsers = await fleet.models.reply_parsers(model)
    run = build_run(body, new_id("chatcmpl"), model, tenant, deadline, parsers)
    return await _respond(fleet, tenant, body, run, request)


@router.post("/completions", response_model=None)
async def completions(
    body: CompletionRequest,
    request: Request,
    fleet: FleetDep,
    tenant: TenantDep,
    deadlines: DeadlineDep,
) -> Response:
    deadline = deadlines.deadline(None, body.timeout_s, fleet.settings.completions_timeout_s)
    model = await fleet.models.resolve(body.model)
    run = build_run(body, new_id("cmpl"), model, tenant, deadline)
    return await _respond(fleet, tenant, body, run, request)
