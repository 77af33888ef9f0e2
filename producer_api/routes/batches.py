"""``/v1/batches``: OpenAI's Batch API. The API records a batch; the batch runner
(``genfleet batch-runner``) validates it, runs its lines through the fleet and writes
its output and error files."""

import time
import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from producer_api.dependencies import FleetDep, TenantDep
from producer_api.errors import ApiError
from producer_api.schemas.batches import BatchCreate, BatchObject
from producer_api.schemas.cursor_page import CursorPage

router = APIRouter(prefix="/v1/batches", tags=["batches"])


def new_batch_id() -> str:
    """Creation time first, so ids sort in the order batches were made; no '-', which
    separates a batch's job ids into batch, line and choice."""
    return f"batch_{time.time_ns():016x}{uuid.uuid4().hex[:16]}"


def _not_found(batch_id: str) -> ApiError:
    return ApiError(404, f"No batch found with id '{batch_id}'", param="batch_id")


@router.post("")
async def create_batch(fleet: FleetDep, tenant: TenantDep, body: BatchCreate) -> BatchObject:
    source = await fleet.files.get(tenant.tenant, body.input_file_id)
    if source is None or source.purpose != "batch":
        raise ApiError(
            404, f"No batch input file with id '{body.input_file_id}'", param="input_file_id"
        )
    created = int(time.time())
    batch = BatchObject(
        id=new_batch_id(),
        endpoint=body.endpoint,
        input_file_id=body.input_file_id,
        completion_window=body.completion_window,
        status="validating",
        created_at=created,
        # "24h", OpenAI's one window, unless the operator set another.
        expires_at=created + fleet.settings.batch_window_s,
        metadata=body.metadata,
        model=fleet.settings.model,
        tenant=tenant.tenant,
    )
    await fleet.batches.create(batch)
    return batch


@router.get("/{batch_id}")
async def retrieve_batch(fleet: FleetDep, tenant: TenantDep, batch_id: str) -> BatchObject:
    batch = await fleet.batches.get(tenant.tenant, batch_id)
    if batch is None:
        raise _not_found(batch_id)
    return batch


@router.get("")
async def list_batches(
    fleet: FleetDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
) -> CursorPage[BatchObject]:
    ids, has_more = await fleet.batches.page(tenant.tenant, limit, after)
    found = [await fleet.batches.get(tenant.tenant, batch_id) for batch_id in ids]
    data = [batch for batch in found if batch is not None]
    return CursorPage[BatchObject].of(data, has_more)


@router.post("/{batch_id}/cancel")
async def cancel_batch(fleet: FleetDep, tenant: TenantDep, batch_id: str) -> BatchObject:
    batch = await fleet.batches.get(tenant.tenant, batch_id)
    if batch is None:
        raise _not_found(batch_id)
    if batch.is_final:
        raise ApiError(409, f"the batch is already {batch.status}", code="batch_finished")
    await fleet.batches.request_cancel(tenant.tenant, batch_id)
    cancelling = await fleet.batches.get(tenant.tenant, batch_id)
    assert cancelling is not None
    return cancelling
