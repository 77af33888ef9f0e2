"""OpenAI's list envelope for objects paged by id (files, batches)."""

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel

from producer_api.schemas.batches import BatchObject
from producer_api.schemas.files import FileObject

Item = TypeVar("Item", FileObject, BatchObject)


class CursorPage(BaseModel, Generic[Item]):
    object: Literal["list"] = "list"
    data: list[Item]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def of(cls, data: list[Item], has_more: bool) -> "CursorPage[Item]":
        first, last = (data[0].id, data[-1].id) if data else (None, None)
        return cls(data=data, first_id=first, last_id=last, has_more=has_more)
