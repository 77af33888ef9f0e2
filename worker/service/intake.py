"""From a Kafka record to an engine request, or to the reason it cannot be one.

Nothing a producer can put in a record raises here: a null value (a
tombstone), an empty or oversized one, bytes that are not UTF-8 or not JSON,
a document that fails the schema. Each is a ``Rejected`` with its reason.
"""

import json
from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError
from transformers import PreTrainedTokenizerBase

from queue_schemas import JobRequest
from queue_schemas.bounds import JobId, TenantName
from worker.engine import Prompt
from worker.sampling_params import SamplingParams


@dataclass
class Rejected:
    reason: str
    job_id: str | None = None
    tenant: str = "default"


_JOB_ID = TypeAdapter(JobId)
_TENANT = TypeAdapter(TenantName)


def _readable_owner(document: object) -> tuple[str, str] | None:
    """The record's (job id, tenant) when both are valid, so the job can fail visibly."""
    if not isinstance(document, dict):
        return None
    try:
        return (
            _JOB_ID.validate_python(document.get("job_id")),
            _TENANT.validate_python(document.get("tenant", "default")),
        )
    except ValidationError:
        return None


def parse_job(raw: bytes | None, max_bytes: int) -> JobRequest | Rejected:
    """Validate a record's value; every failure names what is wrong with it."""
    if raw is None:
        return Rejected("null value (a tombstone): a job record must carry a JobRequest")
    if not raw:
        return Rejected("empty value: a job record must carry a JobRequest")
    if len(raw) > max_bytes:
        return Rejected(f"record of {len(raw)} bytes is larger than the limit of {max_bytes}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return Rejected(f"invalid UTF-8: {error}")
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        return Rejected(f"not JSON: {error}")
    try:
        return JobRequest.model_validate(document)
    except (ValidationError, RecursionError) as error:
        problems = (
            "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}"
                for e in error.errors()[:10]
            )
            if isinstance(error, ValidationError)
            else "nested too deeply"
        )
        owner = _readable_owner(document)
        if owner is None:
            return Rejected(f"invalid job: {problems}")
        return Rejected(f"invalid job: {problems}", *owner)


def longest_token_bytes(tokenizer: PreTrainedTokenizerBase) -> int:
    """UTF-8 length of the vocabulary's longest token string. Each token's string takes
    at least as many bytes as the text it stands for, so a text of B bytes needs at
    least B / this many tokens."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max(len(str(token).encode()) for token in tokens if token is not None)


def _check_length(text_bytes: int, max_prompt_bytes: int | None) -> None:
    if max_prompt_bytes is not None and text_bytes > max_prompt_bytes:
        raise ValueError(
            f"the prompt has {text_bytes} bytes of text, more than the model's context "
            f"can hold in tokens (at most {max_prompt_bytes} bytes)"
        )


def engine_prompt(
    job: JobRequest, tokenizer: PreTrainedTokenizerBase | None, max_prompt_bytes: int | None
) -> Prompt:
    """The job's prompt as the engine takes it; chat messages go through the chat template.
    A text too long for the context is refused before it is tokenized."""
    if job.prompt_token_ids is not None:
        return {"prompt_token_ids": list(job.prompt_token_ids)}
    if job.messages is not None:
        if tokenizer is None or tokenizer.chat_template is None:
            raise ValueError("chat messages need a model with a chat template")
        _check_length(sum(len(m.content.encode()) for m in job.messages), max_prompt_bytes)
        messages = [message.model_dump() for message in job.messages]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert job.prompt is not None
    _check_length(len(job.prompt.encode()), max_prompt_bytes)
    return job.prompt


def sampling_params(job: JobRequest) -> SamplingParams:
    return SamplingParams(**job.sampling.model_dump())
