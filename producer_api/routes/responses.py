"""``/v1/responses``: OpenAI's Responses API over fleet jobs (``schemas.responses``).

``POST`` queues the response's job and, with ``background``, answers at once
(``queued``); without, it answers once the job is done, and a client that hangs up
meanwhile cancels it. ``GET`` builds the response from its job's state, ``cancel``
cancels the job, ``DELETE`` forgets the response, ``input_items`` lists its input.
Streaming (``stream``, ``GET ?stream=true``) is not served yet, nor ``service_tier``
``flex`` (every response runs on the interactive lane, and says ``default``): a 400
says the first.
"""

import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from producer_api.auth import Tenant
from producer_api.dependencies import DeadlineDep, FleetDep, TenantDep
from producer_api.errors import ApiError
from producer_api.schemas.responses import (
    ResponseCreate,
    as_messages,
    reply_messages,
    response_object,
)
from producer_api.services.fleet import Fleet, new_id
from producer_api.services.runs import collect, unless_hung_up
from queue_schemas import ChatMessage, JobRequest
from queue_schemas.bounds import JobId
from queue_schemas.jobs import lowest_version
from queue_schemas.messages import now

router = APIRouter(prefix="/v1/responses", tags=["responses"])


def _bad_request(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_request")


@router.post("", response_model=None)
async def create_response(
    body: ResponseCreate,
    request: Request,
    fleet: FleetDep,
    tenant: TenantDep,
    deadlines: DeadlineDep,
) -> Response:
    if body.stream:
        raise _bad_request("streamed responses are not served yet; poll instead", "stream")
    if body.background and not body.store:
        raise _bad_request("a background response must be stored (store: true)", "store")
    model = await fleet.models.resolve(body.model)
    response_id = new_id("resp")
    conversation, thread = await _continued(fleet, tenant, body, response_id)
    items = body.items()
    conversation += [m.model_dump(exclude_none=True) for m in as_messages(items)]
    sampling = body.sampling()
    tools = body.job_tools()
    settings = fleet.settings
    timeout = settings.jobs_timeout_s if body.background else settings.chat_completions_timeout_s
    messages = [ChatMessage.model_validate(message) for message in conversation]
    job = JobRequest(
        schema_version=lowest_version(sampling, tools.get("tools"), messages),
        job_id=response_id, tenant=tenant.tenant, messages=messages, sampling=sampling,
        metadata=body.metadata or {}, created_at=now(),
        deadline=deadlines.deadline(None, None, timeout),
        **tools,
    )  # fmt: skip
    record: dict[str, Any] = {
        "id": response_id,
        "created_at": time.time(),
        "model": model,
        "echo": body.echo(),
        "input_items": [
            {**item.model_dump(exclude_none=True), "id": f"item_{response_id}_{i}"}
            for i, item in enumerate(items)
        ],
        "conversation": conversation,
        "thread": thread,
    }
    await fleet.submit(tenant, [job], route="/v1/responses", model=model, hint=thread)
    if body.store:
        await fleet.responses.save(tenant.tenant, record)
    if body.background:
        queued = await fleet.store.state(response_id, tenant.tenant)
        return JSONResponse(response_object(record, queued))
    waited = collect(fleet, tenant, [response_id])
    if await unless_hung_up(fleet, tenant, [response_id], request, waited) is None:
        return Response(status_code=499)  # nobody reads it: nginx's "client closed"
    done = await fleet.store.state(response_id, tenant.tenant)
    return JSONResponse(response_object(record, done))


async def _continued(
    fleet: Fleet, tenant: Tenant, body: ResponseCreate, response_id: str
) -> tuple[list[dict[str, Any]], str]:
    """The conversation before this response's input (its instructions, then the one
    ``previous_response_id`` names and that response's reply), and its thread: a
    conversation's responses share its first one's id as their affinity hint, so each
    lands on the worker whose prefix cache holds what came before."""
    conversation: list[dict[str, Any]] = []
    if body.instructions:
        conversation.append({"role": "system", "content": body.instructions})
    if body.previous_response_id is None:
        return conversation, response_id
    earlier = await fleet.responses.load(tenant.tenant, body.previous_response_id)
    state = await fleet.store.state(body.previous_response_id, tenant.tenant)
    replied = [m.model_dump(exclude_none=True) for m in reply_messages(state)]
    return conversation + earlier["conversation"] + replied, earlier["thread"]


@router.get("/{response_id}")
async def get_response(
    response_id: JobId, fleet: FleetDep, tenant: TenantDep, stream: bool = False
) -> dict[str, Any]:
    if stream:
        raise _bad_request("streamed responses are not served yet; poll instead", "stream")
    record = await fleet.responses.load(tenant.tenant, response_id)
    return response_object(record, await fleet.store.state(response_id, tenant.tenant))


@router.post("/{response_id}/cancel")
async def cancel_response(response_id: JobId, fleet: FleetDep, tenant: TenantDep) -> dict[str, Any]:
    """Cancel a response still queued or in progress (one that ended stays as it ended)."""
    record = await fleet.responses.load(tenant.tenant, response_id)
    if not (await fleet.store.state(response_id, tenant.tenant)).status.is_final:
        await fleet.cancel(tenant, response_id)
    return response_object(record, await fleet.store.state(response_id, tenant.tenant))


@router.delete("/{response_id}")
async def delete_response(response_id: JobId, fleet: FleetDep, tenant: TenantDep) -> dict[str, Any]:
    await fleet.responses.delete(tenant.tenant, response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.get("/{response_id}/input_items")
async def input_items(response_id: JobId, fleet: FleetDep, tenant: TenantDep) -> dict[str, Any]:
    items = (await fleet.responses.load(tenant.tenant, response_id))["input_items"]
    return {
        "object": "list", "data": items, "has_more": False,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
    }  # fmt: skip
