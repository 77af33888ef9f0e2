"""The one rule for identifiers and the range of every number a job may carry.

Identifiers (job ids, tenant names) become parts of Redis keys and Kafka keys.
They never contain ``:``, the separator of the Redis key layout, so no id can
name another key (``{job}:cancel`` is not an id). Numbers are bounded where
they enter, so nothing out of range ever reaches the engine: the bounds are
OpenAI's and vLLM's where they have one, and the 64-bit or 32-bit range of the
engine's integers otherwise. The API's bodies and the engine's
``SamplingParams`` use these same definitions.
"""

from typing import Annotated

from pydantic import Field

IDENTIFIER_PATTERN = r"^[A-Za-z0-9._-]+$"
MAX_JOB_ID_CHARS = 128
MAX_TENANT_CHARS = 64
# Served model names may be Hugging Face ids (``org/name``); they become part of topic
# names (``names.model_slug``), which Kafka caps at 249 characters.
SERVED_MODEL_PATTERN = r"^[A-Za-z0-9._/-]+$"
MAX_SERVED_MODEL_CHARS = 96

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_TOKEN_ID = INT32_MAX
MAX_OUTPUT_TOKENS = 2**20
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 20
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_MESSAGES = 4096
# A `choice` constraint: how many strings, and how long each.
MAX_CHOICE_OPTIONS = 1024
MAX_CHOICE_OPTION_CHARS = 4096
# Largest HTTP body, and so largest job record a producer of ours writes; a worker
# accepts records this size plus room for the fields the API adds.
MAX_BODY_BYTES = 1_048_576
MAX_RECORD_BYTES = MAX_BODY_BYTES + 65_536

JobId = Annotated[str, Field(min_length=1, max_length=MAX_JOB_ID_CHARS, pattern=IDENTIFIER_PATTERN)]
TenantName = Annotated[
    str, Field(min_length=1, max_length=MAX_TENANT_CHARS, pattern=IDENTIFIER_PATTERN)
]
ServedModelName = Annotated[
    str, Field(min_length=1, max_length=MAX_SERVED_MODEL_CHARS, pattern=SERVED_MODEL_PATTERN)
]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
TopK = Annotated[int, Field(ge=-1, le=INT32_MAX)]
Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(gt=0, le=1)]
MinP = Annotated[float, Field(ge=0, le=1)]
RepetitionPenalty = Annotated[float, Field(gt=0, le=2)]
Penalty = Annotated[float, Field(ge=-2, le=2)]  # presence and frequency
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
OutputTokens = Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS)]
MinTokens = Annotated[int, Field(ge=0, le=MAX_OUTPUT_TOKENS)]
StopText = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
StopList = Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)]
StopTokenIds = Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)]
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_LOGPROBS)]
Priority = Annotated[int, Field(ge=-INT32_MAX, le=INT32_MAX)]
Metadata = Annotated[
    dict[
        Annotated[str, Field(max_length=MAX_METADATA_KEY_CHARS)],
        Annotated[str, Field(max_length=MAX_METADATA_VALUE_CHARS)],
    ],
    Field(max_length=MAX_METADATA_PAIRS),
]
