"""From a Kafka record's bytes to an engine request, or to the reason it cannot be one."""

import json
from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError
from transformers import PreTrainedTokenizerBase

from queue_schemas import JobRequest
from queue_schemas.jobs import JobId
from worker.engine import Prompt
from worker.sampling_params import SamplingParams


@dataclass
class Rejected:
    reason: str
    job_id: str | None = None


_JOB_ID = TypeAdapter(JobId)


def _readable_job_id(document: object) -> str | None:
    """The record's job id when it is a valid one, so its status can say why it failed."""
    if not isinstance(document, dict):
        return None
    try:
        return _JOB_ID.validate_python(document.get("job_id"))
    except ValidationError:
        return None


def parse_job(raw: bytes) -> JobRequest | Rejected:
    """Validate a record; every failure names what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return Rejected(f"invalid UTF-8: {error}")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        return Rejected(f"not JSON: {error}")
    try:
        return JobRequest.model_validate(document)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}" for e in error.errors()
        )
        return Rejected(f"invalid job: {problems}", _readable_job_id(document))


def engine_prompt(job: JobRequest, tokenizer: PreTrainedTokenizerBase | None) -> Prompt:
    """The job's prompt as the engine takes it; chat messages go through the chat template."""
    if job.prompt_token_ids is not None:
        return {"prompt_token_ids": list(job.prompt_token_ids)}
    if job.messages is not None:
        if tokenizer is None or tokenizer.chat_template is None:
            raise ValueError("chat messages need a model with a chat template")
        messages = [message.model_dump() for message in job.messages]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert job.prompt is not None
    return job.prompt


def sampling_params(job: JobRequest) -> SamplingParams:
    return SamplingParams(**job.sampling.model_dump())
