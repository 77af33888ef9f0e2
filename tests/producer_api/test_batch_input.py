"""A batch's input file read as its requests, or as the errors of its lines (no server)."""

import io
import json

import pytest

from producer_api.batch_runner import batch_of
from producer_api.batch_schema import read_input
from producer_api.file_store import LocalFileStore, TooManyLines

CHAT = "/v1/chat/completions"


def _line(custom_id: str, url: str = CHAT, **body) -> bytes:
    if url == CHAT:
        body = {"messages": [{"role": "user", "content": "hi"}], **body}
    else:
        body = {"prompt": "hi", **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).encode()


def test_valid_lines_come_back_in_order_with_their_file_line_numbers() -> None:
    content = b"\n".join([_line("a"), b"", _line("b", max_tokens=3), b"  "]) + b"\n"
    requests, errors = read_input(content, CHAT, "m")
    assert errors == []
    assert [(r.line, r.custom_id) for r in requests] == [(1, "a"), (3, "b")]
    assert requests[1].body.max_tokens == 3


def test_the_completions_endpoint_takes_its_own_bodies() -> None:
    content = _line("a", "/v1/completions", prompt=[1, 2, 3]) + b"\n"
    requests, errors = read_input(content, "/v1/completions", "m")
    assert errors == [] and requests[0].body.prompts() == [[1, 2, 3]]


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (b'["a list"]', "invalid_request", None),
        (b"\xff\xfe", "invalid_json", None),
        (b'{"custom_id": "x", "method": "GET", "url": "/v1/chat/completions", "body": {}}',
         "invalid_request", "method"),
        (_line("x", stream=True), "invalid_request", "body.stream"),
        (_line("x", model="other"), "model_not_found", "body.model"),
        (_line("x", messages=[]), "invalid_request", "body.messages"),
        (_line("x", n=99), "invalid_request", "body.n"),
    ],
)  # fmt: skip
def test_an_invalid_line_fails_the_file_naming_its_line(raw, code, param) -> None:
    requests, errors = read_input(_line("ok") + b"\n" + raw + b"\n", CHAT, "m")
    assert requests == []  # no line of an invalid file runs
    assert [(e.line, e.code) for e in errors] == [(2, code)]
    if param is not None:
        assert errors[0].param == param


def test_a_line_larger_than_a_request_may_be_is_refused() -> None:
    huge = _line("big", messages=[{"role": "user", "content": "x" * 1_100_000}])
    requests, errors = read_input(_line("ok") + b"\n" + huge + b"\n", CHAT, "m")
    assert requests == [] and [(e.line, e.code) for e in errors] == [(2, "request_too_large")]


def test_an_empty_file_is_an_error() -> None:
    assert [e.code for e in read_input(b"\n\n", CHAT, "m")[1]] == ["empty_file"]


def test_batch_jobs_are_known_by_their_ids() -> None:
    assert batch_of("batch_0123abc-17-0") == "batch_0123abc"
    assert batch_of("chatcmpl-1234-0") is None
    assert batch_of("batch_x") is None


@pytest.mark.anyio
async def test_the_line_cap_counts_a_last_line_without_newline(tmp_path) -> None:
    store = LocalFileStore(tmp_path, max_bytes=1000, max_lines=2)
    saved = await store.save("t", io.BytesIO(b"a\nb\n"), "f.jsonl", "batch")
    assert saved.bytes == 4
    with pytest.raises(TooManyLines):
        await store.save("t", io.BytesIO(b"a\nb\nc"), "g.jsonl", "batch")
    # A batch's output has no caps.
    output = await store.save("t", io.BytesIO(b"x\n" * 10), "out.jsonl", "batch_output")
    assert output.purpose == "batch_output"
    assert [item.id for item in await store.files_of("t")] == [output.id, saved.id]


@pytest.mark.anyio
@pytest.mark.parametrize("file_id", ["../../etc/passwd", "file-zz", ".hidden", "file-" + "0" * 40])
async def test_ids_the_store_did_not_make_are_not_found(tmp_path, file_id) -> None:
    store = LocalFileStore(tmp_path, max_bytes=1000, max_lines=10)
    assert await store.get("t", file_id) is None
    assert await store.delete("t", file_id) is False
