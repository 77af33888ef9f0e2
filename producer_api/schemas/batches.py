"""OpenAI's Batch API objects, and an input file read as its requests or the errors of
its lines.

An input file is JSON lines of ``{custom_id, method, url, body}``; every body is
validated as the route it names validates its own (the same pydantic models),
so a line the route would refuse fails the batch at validation, with its line
number, as OpenAI fails a batch whose file is invalid. No line of an invalid
file runs.
"""

import json
from collections.abc import Collection
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError
from pydantic_core import ErrorDetails

from producer_api.schemas.openai import ChatCompletionRequest, CompletionRequest, GenerationRequest
from queue_schemas.bounds import MAX_BODY_BYTES

Endpoint = Literal["/v1/chat/completions", "/v1/completions"]
BODIES: dict[str, type[GenerationRequest]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
}
BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
    "cancelled",
]  # fmt: skip
FINAL_STATUSES = frozenset({"failed", "completed", "expired", "cancelled"})
MAX_ERRORS = 100  # errors listed on a failed batch; OpenAI lists a sample too


class BatchCreate(BaseModel):
    input_file_id: str
    endpoint: Endpoint
    completion_window: Literal["24h"]
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] = (
        Field(default_factory=dict)
    )


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsage(BaseModel):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int = 0


class BatchObject(BaseModel):
    """OpenAI's batch object; ``tenant`` is ours and never shown (``public``)."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: Endpoint
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = RequestCounts()
    usage: BatchUsage = BatchUsage()
    metadata: dict[str, str] = Field(default_factory=dict)
    model: str | None = None
    tenant: str = Field(default="default", exclude=True)

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES


class InputLine(BaseModel):
    custom_id: Annotated[str, Field(min_length=1, max_length=512)]
    method: Literal["POST"]
    url: Endpoint
    body: dict[str, Any]


class BatchRequest(BaseModel):
    """One valid line: its place in the file and the route's parsed body."""

    line: int  # 1-based, as OpenAI numbers them
    custom_id: str
    body: GenerationRequest


def _error(line: int, code: str, message: str, param: str | None = None) -> BatchError:
    return BatchError(code=code, message=message, param=param, line=line)


def _field(error: ErrorDetails, prefix: str = "") -> str:
    return prefix + ".".join(str(part) for part in error["loc"])


def _read_line(
    number: int, raw: bytes, endpoint: str, served_models: Collection[str] | None, seen: set[str]
) -> BatchRequest | BatchError:
    if len(raw) > MAX_BODY_BYTES:  # what the route itself would refuse (413)
        message = f"the line is larger than a request may be ({MAX_BODY_BYTES} bytes)"
        return _error(number, "request_too_large", message)
    try:
        line = InputLine.model_validate(json.loads(raw))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return _error(number, "invalid_json", "the line is not a JSON object")
    except ValidationError as error:
        first = error.errors()[0]
        return _error(number, "invalid_request", first["msg"], _field(first))
    if line.url != endpoint:
        message = f"the line's url {line.url} is not the batch's endpoint {endpoint}"
        return _error(number, "mismatched_url", message, "url")
    if line.custom_id in seen:
        message = f"custom_id {line.custom_id!r} appears more than once"
        return _error(number, "duplicate_custom_id", message, "custom_id")
    seen.add(line.custom_id)
    try:
        body = BODIES[endpoint].model_validate(line.body)
    except ValidationError as error:
        first = error.errors()[0]
        return _error(number, "invalid_request", first["msg"], _field(first, "body."))
    if body.stream:
        return _error(number, "invalid_request", "a batch request cannot stream", "body.stream")
    if served_models is not None and body.model is not None and body.model not in served_models:
        message = f"the model `{body.model}` does not exist"
        return _error(number, "model_not_found", message, "body.model")
    return BatchRequest(line=number, custom_id=line.custom_id, body=body)


def read_input(
    content: bytes, endpoint: str, served_models: Collection[str] | None
) -> tuple[list[BatchRequest], list[BatchError]]:
    """The file's requests in order, or (when any line is invalid) the errors found. A
    line may name any of ``served_models`` (None: any model, for a file validated before)."""
    requests: list[BatchRequest] = []
    errors: list[BatchError] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        read = _read_line(number, raw, endpoint, served_models, seen)
        if isinstance(read, BatchError):
            errors.append(read)
        else:
            requests.append(read)
    if not requests and not errors:
        errors.append(_error(1, "empty_file", "the input file has no requests"))
    return ([] if errors else requests), errors
