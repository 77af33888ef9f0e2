"""The Responses API's faces of a job: input items as messages, the request as the job's
sampling and tools, and the job's state as OpenAI's response object."""

import pytest
from pydantic import ValidationError

from producer_api.schemas.responses import ResponseCreate, as_messages, response_object
from queue_schemas import JobState, JobStatus, Usage
from queue_schemas.tools import tool_call

RECORD = {"id": "resp_1", "created_at": 1.0, "model": "m", "echo": {"store": True}}


def _state(**fields) -> JobState:
    return JobState(job_id="resp_1", **fields)


def test_input_items_become_the_conversation() -> None:
    body = ResponseCreate.model_validate(
        {"input": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "21 C"},
        ]}
    )  # fmt: skip
    messages = as_messages(body.items())
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[1].content == "Weather?"
    assert messages[2].tool_calls and messages[2].tool_calls[0].function.name == "w"
    assert messages[3].tool_call_id == "c1"


def test_the_request_as_sampling_and_tools() -> None:
    body = ResponseCreate.model_validate({
        "input": "hi", "max_output_tokens": 9, "temperature": 0,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "tools": [{"type": "function", "name": "w"}],
        "tool_choice": {"type": "function", "name": "w"},
    })  # fmt: skip
    sampling = body.sampling()
    assert sampling.max_tokens == 9 and sampling.temperature == 0
    assert sampling.structured_outputs is not None and sampling.structured_outputs.kind == "json"
    tools = body.job_tools()
    assert tools["tools"][0].function.name == "w"
    assert tools["tool_choice"].function.name == "w"
    with pytest.raises(ValidationError):
        ResponseCreate.model_validate({"input": []})


@pytest.mark.parametrize(
    ("state", "status"),
    [
        (_state(status=JobStatus.QUEUED), "queued"),
        (_state(status=JobStatus.RUNNING), "in_progress"),
        (_state(status=JobStatus.COMPLETED, text="Hi", finish_reason="stop"), "completed"),
        (_state(status=JobStatus.COMPLETED, text="Hi", finish_reason="length"), "incomplete"),
        (_state(status=JobStatus.FAILED, error="too long"), "failed"),
        (_state(status=JobStatus.CANCELLED), "cancelled"),
        (_state(status=JobStatus.EXPIRED, error="deadline"), "failed"),
    ],
)
def test_each_job_status_as_a_response_status(state, status) -> None:
    response = response_object(RECORD, state)
    assert response["status"] == status and response["object"] == "response"
    assert (response["output"] != []) == (state.status is JobStatus.COMPLETED)
    assert (response["error"] is not None) == (status == "failed")
    if status == "incomplete":
        assert response["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_finished_response_s_text_and_calls_are_its_output() -> None:
    call = tool_call("resp_1", 0, "w", {"city": "Oslo"})
    state = _state(
        status=JobStatus.COMPLETED, text="raw", content="", tool_calls=[call],
        finish_reason="tool_calls", usage=Usage(prompt_tokens=5, completion_tokens=7),
    )  # fmt: skip
    response = response_object(RECORD, state)
    (item,) = response["output"]  # no empty message beside the call
    assert item["type"] == "function_call" and item["call_id"] == call.id
    assert item["arguments"] == '{"city": "Oslo"}'
    assert response["usage"]["total_tokens"] == 12
    text = response_object(RECORD, _state(status=JobStatus.COMPLETED, text="Hello"))["output"][0]
    assert text["content"][0] == {"type": "output_text", "text": "Hello", "annotations": []}
