"""The wire contract: every message on Kafka and Redis, and every topic, key and channel name.

Imported by both the producer API and the workers; imports neither. See
``docs/wire-contract.md`` for how to produce jobs and read results from any
Kafka client, and how versions evolve.
"""

from queue_schemas.jobs import ChatMessage, JobRequest, StructuredOutputs
from queue_schemas.messages import (
    CancelJob,
    DeadLetter,
    FinishReason,
    JobResult,
    JobState,
    JobStatus,
    TokenEvent,
    Usage,
)
from queue_schemas.names import Names
from queue_schemas.sampling import SamplingOptions
from queue_schemas.versioning import SCHEMA_VERSION, UnsupportedVersion, check_version

__all__ = [
    "SCHEMA_VERSION",
    "CancelJob",
    "ChatMessage",
    "DeadLetter",
    "FinishReason",
    "JobRequest",
    "JobResult",
    "JobState",
    "JobStatus",
    "Names",
    "SamplingOptions",
    "StructuredOutputs",
    "TokenEvent",
    "UnsupportedVersion",
    "Usage",
    "check_version",
]
