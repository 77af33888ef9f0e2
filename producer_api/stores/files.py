"""Uploaded files (batch inputs, batch outputs and errors) and their OpenAI file objects.

Every API process and the batch runner must reach the same files, so they
live behind ``FileStore``; the backend here is a folder (a shared volume in
compose). A file is two entries beside each other in its tenant's folder: the
content, and its file object as JSON, written after the content, so a file
whose object can be read is whole. Both are written to a temporary name and
renamed into place: readers never see half a file. Another tenant's id is not
found, never forbidden: ids do not leak whether they exist.

An object store backend would keep the same two entries per file (content and
object) under ``<tenant>/<id>`` keys, upload the content with a multipart
upload before the object, and list a tenant's objects by that prefix.
"""

import contextlib
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

import anyio

from producer_api.schemas.files import FileObject, FilePurpose

CHUNK = 1 << 20
_FILE_ID = re.compile(r"file-[0-9a-f]{32}")


class FileTooLarge(Exception):
    pass


class TooManyLines(Exception):
    pass


class FileStore(Protocol):
    async def save(
        self, tenant: str, source: BinaryIO, filename: str, purpose: FilePurpose
    ) -> FileObject: ...

    async def get(self, tenant: str, file_id: str) -> FileObject | None: ...

    async def files_of(self, tenant: str) -> list[FileObject]: ...

    def content(self, tenant: str, file_id: str) -> AsyncIterator[bytes]: ...

    async def delete(self, tenant: str, file_id: str) -> bool: ...


def new_file_id() -> str:
    """Creation time first, so ids sort in the order files were made."""
    return f"file-{time.time_ns():016x}{uuid.uuid4().hex[:16]}"


class LocalFileStore:
    """Files in ``root/<tenant>/``: ``<id>`` (content) and ``<id>.json`` (object).

    File work runs on a worker thread: a large upload never stalls the event loop."""

    def __init__(self, root: Path, max_bytes: int, max_lines: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_lines = max_lines

    def _folder(self, tenant: str) -> Path:
        return self.root / f"tenant-{tenant}"  # never "." or "..", whatever the tenant

    def _path(self, tenant: str, file_id: str, suffix: str = "") -> Path | None:
        if not _FILE_ID.fullmatch(file_id):
            return None  # not an id this store made: nothing to look up on disk
        return self._folder(tenant) / f"{file_id}{suffix}"

    async def save(
        self, tenant: str, source: BinaryIO, filename: str, purpose: FilePurpose
    ) -> FileObject:
        """Copy ``source`` in; an upload (purpose ``batch``) counts bytes and lines against
        the caps, a batch's output has none."""
        return await anyio.to_thread.run_sync(self._save, tenant, source, filename, purpose)

    def _save(self, tenant: str, source: BinaryIO, filename: str, purpose: FilePurpose):
        folder = self._folder(tenant)
        folder.mkdir(parents=True, exist_ok=True)
        file_id = new_file_id()
        size, lines, last = 0, 0, b"\n"
        capped = purpose == "batch"
        with written_atomically(folder / file_id) as target:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                if capped and size > self.max_bytes:
                    raise FileTooLarge(f"the file is larger than {self.max_bytes} bytes")
                lines += chunk.count(b"\n")
                last = chunk[-1:]
                if capped and lines + (last != b"\n") > self.max_lines:
                    raise TooManyLines(f"the file has more than {self.max_lines} lines")
                target.write(chunk)
        item = FileObject(
            id=file_id, bytes=size, created_at=int(time.time()), filename=filename, purpose=purpose
        )
        with written_atomically(folder / f"{file_id}.json") as target:
            target.write(item.model_dump_json().encode())
        return item

    async def get(self, tenant: str, file_id: str) -> FileObject | None:
        return await anyio.to_thread.run_sync(self._get, tenant, file_id)

    def _get(self, tenant: str, file_id: str) -> FileObject | None:
        path = self._path(tenant, file_id, ".json")
        if path is None or not path.is_file():
            return None
        return FileObject.model_validate_json(path.read_text())

    async def files_of(self, tenant: str) -> list[FileObject]:
        """The tenant's files, newest first."""
        return await anyio.to_thread.run_sync(self._files_of, tenant)

    def _files_of(self, tenant: str) -> list[FileObject]:
        folder = self._folder(tenant)
        if not folder.is_dir():
            return []
        items = [self._get(tenant, path.stem) for path in folder.glob("file-*.json")]
        found = [item for item in items if item is not None]
        return sorted(found, key=lambda item: item.id, reverse=True)

    async def content(self, tenant: str, file_id: str) -> AsyncIterator[bytes]:
        """The bytes of a file ``get`` found."""
        path = self._path(tenant, file_id)
        assert path is not None
        handle = await anyio.open_file(path, "rb")
        async with handle:
            while chunk := await handle.read(CHUNK):
                yield chunk

    async def delete(self, tenant: str, file_id: str) -> bool:
        return await anyio.to_thread.run_sync(self._delete, tenant, file_id)

    def _delete(self, tenant: str, file_id: str) -> bool:
        if self._get(tenant, file_id) is None:
            return False
        for suffix in (".json", ""):  # the object first: the file is gone at once
            path = self._path(tenant, file_id, suffix)
            assert path is not None
            path.unlink(missing_ok=True)
        return True


@contextlib.contextmanager
def written_atomically(path: Path) -> Iterator[BinaryIO]:
    """A file written under a temporary name and renamed into place once whole."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        with partial.open("wb") as target:
            yield target
            target.flush()
            os.fsync(target.fileno())
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
