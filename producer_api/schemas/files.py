"""OpenAI's file object, as ``/v1/files`` answers and lists it."""

from typing import Literal

from pydantic import BaseModel

FilePurpose = Literal["batch", "batch_output"]


class FileObject(BaseModel):
    """OpenAI's file object."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None
