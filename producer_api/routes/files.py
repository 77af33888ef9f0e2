"""``/v1/files``: OpenAI's Files API for batch inputs and outputs, owned by the tenant."""

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from producer_api.dependencies import FleetDep, TenantDep
from producer_api.errors import ApiError
from producer_api.schemas.cursor_page import CursorPage
from producer_api.schemas.files import FileObject
from producer_api.stores.files import FileTooLarge, TooManyLines

router = APIRouter(prefix="/v1/files", tags=["files"])


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


def _not_found(file_id: str) -> ApiError:
    return ApiError(404, f"No such File object: {file_id}", param="file_id", code="file_not_found")


@router.post("")
async def upload_file(
    fleet: FleetDep,
    tenant: TenantDep,
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form()],
) -> FileObject:
    if purpose != "batch":
        raise ApiError(400, f"purpose must be 'batch', not {purpose!r}", param="purpose")
    try:
        return await fleet.files.save(tenant.tenant, file.file, file.filename or "upload", "batch")
    except FileTooLarge as error:
        raise ApiError(413, str(error), param="file", code="file_too_large") from error
    except TooManyLines as error:
        raise ApiError(400, str(error), param="file", code="too_many_lines") from error


@router.get("")
async def list_files(
    fleet: FleetDep,
    tenant: TenantDep,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> CursorPage[FileObject]:
    files = await fleet.files.files_of(tenant.tenant)
    if order == "asc":
        files.reverse()
    if purpose is not None:
        files = [item for item in files if item.purpose == purpose]
    if after is not None:
        ids = [item.id for item in files]
        files = files[ids.index(after) + 1 :] if after in ids else []
    return CursorPage[FileObject].of(files[:limit], has_more=len(files) > limit)


@router.get("/{file_id}")
async def retrieve_file(fleet: FleetDep, tenant: TenantDep, file_id: str) -> FileObject:
    item = await fleet.files.get(tenant.tenant, file_id)
    if item is None:
        raise _not_found(file_id)
    return item


@router.get("/{file_id}/content")
async def file_content(fleet: FleetDep, tenant: TenantDep, file_id: str) -> StreamingResponse:
    item = await fleet.files.get(tenant.tenant, file_id)
    if item is None:
        raise _not_found(file_id)
    return StreamingResponse(
        fleet.files.content(tenant.tenant, file_id),
        media_type="application/octet-stream",
        headers={"Content-Length": str(item.bytes)},
    )


@router.delete("/{file_id}")
async def delete_file(fleet: FleetDep, tenant: TenantDep, file_id: str) -> FileDeleted:
    if not await fleet.files.delete(tenant.tenant, file_id):
        raise _not_found(file_id)
    return FileDeleted(id=file_id, deleted=True)
