"""``/v1/files`` through the official ``openai`` client: upload, list, read, delete, tenancy
and the caps, against a real API process (and its broker and Redis)."""

import httpx
import openai
import pytest
from openai import OpenAI

MAX_BYTES, MAX_LINES = 4096, 20
LINES = b'{"custom_id": "a"}\n{"custom_id": "b"}\n'


@pytest.fixture
def files_api(start_api, tmp_path):
    folder = tmp_path / "files"
    api = start_api(
        "--api-keys", "key-a=alice,key-b=bob", "--files-dir", str(folder),
        "--max-file-bytes", str(MAX_BYTES), "--max-file-lines", str(MAX_LINES),
    )  # fmt: skip
    return api, folder


def _client(api, key: str) -> OpenAI:
    return OpenAI(base_url=f"{api.url}/v1", api_key=key, max_retries=0, timeout=30)


def test_a_file_goes_up_is_listed_read_and_deleted(files_api) -> None:
    api, _ = files_api
    alice = _client(api, "key-a")
    created = alice.files.create(file=("input.jsonl", LINES), purpose="batch")
    assert created.id.startswith("file-") and created.object == "file"
    assert (created.bytes, created.filename) == (len(LINES), "input.jsonl")
    assert created.purpose == "batch"
    assert alice.files.retrieve(created.id) == created
    assert [item.id for item in alice.files.list()] == [created.id]
    assert alice.files.content(created.id).content == LINES

    deleted = alice.files.delete(created.id)
    assert deleted.deleted and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(created.id)
    assert list(alice.files.list()) == []


def test_another_tenants_file_does_not_exist_for_you(files_api) -> None:
    api, _ = files_api
    alice, bob = _client(api, "key-a"), _client(api, "key-b")
    mine = alice.files.create(file=("mine.jsonl", LINES), purpose="batch")
    for attempt in (bob.files.retrieve, bob.files.content, bob.files.delete):
        with pytest.raises(openai.NotFoundError):
            attempt(mine.id)
    assert list(bob.files.list()) == []
    assert alice.files.content(mine.id).content == LINES  # untouched by bob's delete


def test_the_caps_refuse_and_leave_nothing_behind(files_api) -> None:
    api, folder = files_api
    alice = _client(api, "key-a")
    with pytest.raises(openai.APIStatusError) as too_large:
        alice.files.create(file=("big.jsonl", b"x" * (MAX_BYTES + 1)), purpose="batch")
    assert too_large.value.status_code == 413
    assert "larger than 4096 bytes" in too_large.value.message
    lines = b"{}\n" * MAX_LINES + b"{}"  # one more line, without a final newline
    with pytest.raises(openai.BadRequestError) as too_long:
        alice.files.create(file=("long.jsonl", lines), purpose="batch")
    assert "more than 20 lines" in too_long.value.message
    with pytest.raises(openai.BadRequestError) as purpose:
        alice.files.create(file=("x.jsonl", LINES), purpose="fine-tune")
    assert purpose.value.body["param"] == "purpose"
    # A body far past the cap is refused on its declared length, before it is read.
    response = httpx.post(
        f"{api.url}/v1/files",
        headers={"Authorization": "Bearer key-a"},
        files={"file": ("huge.jsonl", b"x" * (MAX_BYTES + 100_000))},
        data={"purpose": "batch"},
    )
    assert response.status_code == 413
    assert list(alice.files.list()) == []
    assert [path.name for path in folder.rglob("*") if path.is_file()] == []
    exactly = b"{}\n" * MAX_LINES
    assert alice.files.create(file=("full.jsonl", exactly), purpose="batch").bytes == len(exactly)


def test_listing_pages_newest_first(files_api) -> None:
    api, _ = files_api
    alice = _client(api, "key-a")
    made = [alice.files.create(file=(f"{i}.jsonl", LINES), purpose="batch").id for i in range(3)]
    first = alice.files.list(limit=2)
    assert first.has_more and len(first.data) == 2
    rest = alice.files.list(limit=2, after=first.data[-1].id)
    assert not rest.has_more
    assert {item.id for item in first.data + rest.data} == set(made)
    assert [item.id for item in alice.files.list(limit=1)] == [
        item.id for item in alice.files.list(limit=1000)
    ]  # auto-pagination walks every page
    assert [item.id for item in alice.files.list(order="asc")] == list(
        reversed([item.id for item in alice.files.list(order="desc")])
    )
