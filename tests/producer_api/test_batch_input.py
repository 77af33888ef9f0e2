"""A batch's input file read as its requests, or as the errors of its lines (no server)."""

import io
import json

import pytest

from producer_api.batch_runner.lines import batch_of
from producer_api.schemas.batches import read_input
from producer_api.stores.files import LocalFileStore, TooManyLines

CHAT = "/v1/chat/completions"


def _line(custom_id: str, url: str = CHAT, **body) -> bytes:
    if url == CHAT:
        body = {"messages": [{"role": "user", "content": "hi"}], **body}
    else:
        body = {"prompt": "hi", **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).encode()


def test_valid_lines_come_back_in_order_with_their_file_line_numbers() -> None:
    content = b"\n".join([_line("a"), b"", _line("b", max_tokens=3), b"  "]) + b"\n"
    requests, errors = read_input(content, CHAT, ["m"])
    assert errors == []
    assert [(r.line, r.custom_id) for r in requests] == [(1, "a"), (3, "b")]
    assert requests[1].body.max_tokens == 3


def test_the_completions_endpoint_takes_its_own_bodies() -> None:
    content = _line("a", "/v1/completions", prompt=[1, 2, 3]) + b"\n"
    requests, errors = read_input(content, "/v1/completions", ["m"])
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
    requests, errors = read_input(_line("ok") + b"\n" + raw + b"\n", CHAT, ["m"])
    assert requests == []  # no line of an invalid file runs
    assert [(e.line, e.code) for e in errors] == [(2, code)]
    if param is not None:
        assert errors[0].param == param


def test_a_line_larger_than_a_request_may_be_is_refused() -> None:
    huge = _line("big", messages=[{"role": "user", "content": "x" * 1_100_000}])
    requests, errors = read_input(_line("ok") + b"\n" + huge + b"\n", CHAT, ["m"])
    assert requests == [] and [(e.line, e.code) for e in errors] == [(2, "request_too_large")]


def test_an_empty_file_is_an_error() -> None:
    assert [e.code for e in read_input(b"\n\n", CHAT, ["m"])[1]] == ["empty_file"]


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


def test_a_batchs_lines_carry_its_expiry_and_run_behind_interactive_jobs() -> None:
    from datetime import UTC, datetime

    from producer_api.batch_runner.lines import BATCH_PRIORITY, as_lines
    from producer_api.schemas.batches import BatchObject

    content = b"\n".join([_line("a", n=2, priority=3), _line("b")]) + b"\n"
    requests, _ = read_input(content, CHAT, ["m"])
    expires = 2_000_000_000
    batch = BatchObject(
        id="batch_1", endpoint=CHAT, input_file_id="f", completion_window="24h",
        status="in_progress", created_at=0, expires_at=expires, tenant="acme",
    )  # fmt: skip
    lines = as_lines(batch, requests, "m")
    jobs = [job for line in lines for job in line.run.jobs]
    assert [job.job_id for job in jobs] == ["batch_1-1-0", "batch_1-1-1", "batch_1-2-0"]
    assert {job.deadline for job in jobs} == {datetime.fromtimestamp(expires, UTC)}
    assert [job.priority for job in jobs] == [3 + BATCH_PRIORITY] * 2 + [BATCH_PRIORITY]
    assert {job.tenant for job in jobs} == {"acme"}


def test_a_file_may_name_several_served_models_and_each_line_runs_on_its_own() -> None:
    from producer_api.batch_runner.lines import as_lines
    from producer_api.schemas.batches import BatchObject

    content = b"\n".join([_line("a", model="small"), _line("b"), _line("c", model="big")])
    requests, errors = read_input(content, CHAT, ["big", "small"])
    assert errors == []
    batch = BatchObject(
        id="batch_2", endpoint=CHAT, input_file_id="f", completion_window="24h",
        status="in_progress", created_at=0,
    )  # fmt: skip
    assert [line.run.model for line in as_lines(batch, requests, "big")] == ["small", "big", "big"]
    # A model that is not served (here: "small" gone) fails the file at validation only;
    # the runner reading a validated file again keeps every line.
    assert [e.line for e in read_input(content, CHAT, ["big"])[1]] == [1]
    assert len(read_input(content, CHAT, None)[0]) == 3
