"""OpenAI request bodies into fleet jobs, and responses from fleet results (no services)."""

import json

import pytest
from pydantic import ValidationError

from producer_api.auth import KeyRing, Tenant
from producer_api.errors import ApiError
from producer_api.schemas.openai import ChatCompletionRequest, CompletionRequest
from producer_api.schemas.openai_format import ChatShape, TextShape, usage_body
from producer_api.schemas.reply_stream import ReplyStream
from producer_api.services.runs import build_run
from producer_api.settings import ApiSettings
from queue_schemas import JobResult, JobStatus, TokenEvent, Usage


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields)


def test_choices_get_consecutive_seeds_and_openai_names_map_to_sampling() -> None:
    request = _chat(n=3, seed=7, stop="END", max_completion_tokens=9, max_tokens=99, top_k=5)
    options = [request.sampling(choice) for choice in range(3)]
    assert [o.seed for o in options] == [7, 8, 9]
    assert options[0].stop == ["END"]
    assert options[0].max_tokens == 9  # max_completion_tokens wins over the older name
    assert options[0].top_k == 5
    assert options[0].temperature == 1.0  # OpenAI's default when left out


def test_logprobs_flags_become_the_number_of_alternatives() -> None:
    assert _chat().sampling(0).logprobs is None
    assert _chat(logprobs=True).sampling(0).logprobs == 0
    assert _chat(logprobs=True, top_logprobs=3).sampling(0).logprobs == 3
    with pytest.raises(ValidationError, match="top_logprobs needs logprobs"):
        _chat(top_logprobs=3)
    assert CompletionRequest(prompt="x", logprobs=2).sampling(0).logprobs == 2


def test_every_prompt_form_of_completions() -> None:
    assert CompletionRequest(prompt="a").prompts() == ["a"]
    assert CompletionRequest(prompt=["a", "b"]).prompts() == ["a", "b"]
    assert CompletionRequest(prompt=[1, 2]).prompts() == [[1, 2]]
    assert CompletionRequest(prompt=[[1], [2, 3]]).prompts() == [[1], [2, 3]]
    with pytest.raises(ValidationError):
        CompletionRequest(prompt=[])


def test_developer_role_and_text_parts_become_plain_chat_messages() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request = ChatCompletionRequest(
        messages=[{"role": "developer", "content": "be brief"}, {"role": "user", "content": parts}]
    )
    messages = [m.as_chat_message() for m in request.messages]
    assert [(m.role, m.content) for m in messages] == [("system", "be brief"), ("user", "ab")]


def _result(prompt: int, completion: int) -> JobResult:
    return JobResult(
        job_id="j",
        status=JobStatus.COMPLETED,
        usage=Usage(prompt_tokens=prompt, completion_tokens=completion),
    )


def test_usage_counts_each_prompt_once_and_every_completion() -> None:
    # Two prompts with two choices each: prompts of 10 and 20 tokens.
    results = [_result(10, 3), _result(10, 4), _result(20, 5), _result(20, 6)]
    usage = usage_body(results, choices_per_prompt=2)
    assert usage["prompt_tokens"] == 30
    assert usage["completion_tokens"] == 18
    assert usage["total_tokens"] == 48


def test_logprobs_shapes_rank_alternatives_and_name_tokens() -> None:
    event = TokenEvent.model_validate_json(
        json.dumps(
            {
                "job_id": "j", "token_index": 0, "text": "ab", "token_ids": [5, 6],
                "logprobs": [{"5": -0.5, "9": -0.1, "7": -2.0}, {"6": -0.2}],
                "token_texts": {"5": "a", "6": "b", "7": "c", "9": "z"},
            }
        )
    )  # fmt: skip
    shape = ChatShape(top_logprobs=2, streams=[ReplyStream("j", "none", None)])
    chunk = shape.delta(0, event)
    assert chunk is not None and chunk["delta"] == {"content": "ab"}
    content = chunk["logprobs"]["content"]
    assert [c["token"] for c in content] == ["a", "b"]
    assert content[0]["logprob"] == -0.5
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["z", "a"]
    text_chunk = TextShape(top_logprobs=1).delta(0, event)
    assert text_chunk is not None
    text = text_chunk["logprobs"]
    assert text["tokens"] == ["a", "b"]
    assert text["top_logprobs"][0] == {"z": -0.1}
    assert text["text_offset"] == [0, 1]


def test_key_ring_from_environment_and_file(tmp_path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"k2": "bob", "k3": {"tenant": "carol", "max_outstanding_jobs": 2}}))
    ring = KeyRing(ApiSettings(api_keys="k1=alice", api_keys_file=keys))
    assert ring.tenant("k1").tenant == "alice"
    assert ring.tenant("k2").tenant == "bob"
    assert ring.max_outstanding(ring.tenant("k3")) == 2
    assert ring.max_outstanding(ring.tenant("k1")) == ApiSettings().max_outstanding_jobs
    for wrong in (None, "", "k4", "k1 "):
        with pytest.raises(ApiError) as refused:
            ring.tenant(wrong)
        assert refused.value.status == 401
    with pytest.raises(ValueError, match="KEY=TENANT"):
        KeyRing(ApiSettings(api_keys="just-a-key"))


def test_without_keys_everyone_is_the_default_tenant() -> None:
    ring = KeyRing(ApiSettings(api_keys=""))
    assert ring.open
    assert ring.tenant(None).tenant == "default"


def test_without_keys_the_api_listens_on_loopback_only() -> None:
    from producer_api.app import listen_address

    assert listen_address(ApiSettings(host="0.0.0.0", api_keys="")) == "127.0.0.1"
    assert listen_address(ApiSettings(host="0.0.0.0", api_keys="k=alice")) == "0.0.0.0"


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
NAMED_SCHEMA = {"name": "x", "schema": SCHEMA, "strict": True}


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": NAMED_SCHEMA}}, "json"),
        ({"response_format": {"type": "json_object"}}, "json_object"),
        ({"structured_outputs": {"regex": r"\d+"}}, "regex"),
        ({"structured_outputs": {"json": SCHEMA}}, "json"),
        ({"guided_json": SCHEMA}, "json"),
        ({"guided_json": json.dumps(SCHEMA)}, "json"),
        ({"guided_regex": "a+"}, "regex"),
        ({"guided_choice": ["yes", "no"]}, "choice"),
        ({"guided_grammar": 'root ::= "a"'}, "grammar"),
    ],
)  # fmt: skip
def test_every_way_to_ask_for_a_constraint_becomes_the_jobs_constraint(fields, kind) -> None:
    for request in (_chat(**fields), CompletionRequest(prompt="x", **fields)):
        constraint = request.sampling(0).structured_outputs
        assert constraint is not None and constraint.kind == kind
    if kind == "json":
        assert _chat(**fields).sampling(0).structured_outputs.json_schema == SCHEMA


def test_a_text_response_format_or_none_leaves_the_output_free() -> None:
    assert _chat(response_format={"type": "text"}).sampling(0).structured_outputs is None
    assert _chat().sampling(0).structured_outputs is None


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
         ("response_format", "json_schema", "schema")),
        ({"guided_json": {"required": "n"}}, ("guided_json",)),
        ({"structured_outputs": {"json": {"type": "nope"}}}, ("structured_outputs", "json")),
        ({"response_format": {"type": "json_schema"}}, ("response_format",)),
        ({"response_format": {"type": "yaml"}}, ("response_format", "type")),
    ],
)  # fmt: skip
def test_an_invalid_constraint_is_refused_naming_its_field(fields, where) -> None:
    with pytest.raises(ValidationError) as caught:
        _chat(**fields)
    assert tuple(caught.value.errors()[0]["loc"][: len(where)]) == where


def test_two_constraints_at_once_are_refused_naming_both() -> None:
    with pytest.raises(ValidationError, match="got response_format, guided_regex"):
        _chat(response_format={"type": "json_object"}, guided_regex="a")
    with pytest.raises(ValidationError, match="got structured_outputs, guided_choice"):
        CompletionRequest(prompt="x", structured_outputs={"regex": "a"}, guided_choice=["a"])


ALL_DEFAULTED = {
    "temperature": 0.5, "top_p": 0.9, "top_k": 4, "min_p": 0.0, "repetition_penalty": 1.0,
    "max_tokens": 8,
}  # fmt: skip


def test_a_job_submission_is_written_at_the_lowest_version_that_carries_its_meaning() -> None:
    from producer_api.schemas.jobs import JobSubmission

    constraint = {"structured_outputs": {"json": SCHEMA}}
    body = {"prompt": "x", "sampling": {**ALL_DEFAULTED, **constraint}}
    job = JobSubmission.model_validate(body).to_job("acme", "j", None)
    assert job.schema_version == 2 and job.tenant == "acme"
    assert job.sampling.structured_outputs is not None
    assert job.sampling.structured_outputs.json_schema == SCHEMA
    free = JobSubmission.model_validate({"prompt": "x", "sampling": ALL_DEFAULTED})
    assert free.to_job("acme", "j", None).schema_version == 1
    # A field left to the model's defaults needs version 3, constrained or not.
    for sampling in ({}, constraint, {**ALL_DEFAULTED, "temperature": None}):
        left = JobSubmission.model_validate({"prompt": "x", "sampling": sampling})
        assert left.to_job("acme", "j", None).schema_version == 3


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather"}}
NAMED_X = {"name": "x"}


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"tool_choice": "required"}, "tool_choice required needs tools"),
        (
            {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": NAMED_X}},
            "names 'x', which is not a tool",
        ),
        (
            {"tools": [WEATHER_TOOL], "tool_choice": "required",
             "response_format": {"type": "json_object"}},
            "constrains the output itself",
        ),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "pattern"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
            "not a valid JSON Schema",
        ),
    ],
)  # fmt: skip
def test_tools_a_job_would_refuse_are_refused_with_the_request(fields, reason) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(ValidationError, match=reason):
        ChatCompletionRequest.model_validate(body)


def test_a_chat_with_tools_or_calls_is_written_at_version_4() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    with_tools = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER_TOOL]}
    )
    history = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
    )  # fmt: skip
    plain = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    versions = [
        build_run(body, "r", "m", Tenant(tenant="t")).jobs[0].schema_version
        for body in (with_tools, history, plain)
    ]
    assert versions == [4, 4, 3]
    job = build_run(with_tools, "r", "m", Tenant(tenant="t")).jobs[0]
    assert job.tools is not None and job.effective_tool_choice == "auto"
