"""API settings: environment variables GENFLEET_* (the worker's names where they are shared)
and ``genfleet api`` flags."""

from pathlib import Path
from typing import Literal

from pydantic import Field

from queue_schemas.bounds import MAX_BODY_BYTES
from queue_schemas.fleet_settings import FleetSettings
from queue_schemas.jobs import MAX_TIMEOUT_S

LOOPBACK = "127.0.0.1"


class ApiSettings(FleetSettings):
    model: str = Field("SmolLM2-135M-Instruct", description="model name the fleet serves")
    host: str = Field("0.0.0.0", description="listen address (loopback only without API keys)")
    port: int = Field(8000, ge=0, le=65535, description="listen port")
    # Tenants and limits.
    api_keys: str = Field("", description="comma-separated KEY=TENANT pairs")
    api_keys_file: Path | None = Field(None, description="JSON file of API keys and tenants")
    rate_limit_per_minute: int = Field(600, ge=1, description="new jobs per tenant per minute")
    max_outstanding_jobs: int = Field(256, ge=1, description="unfinished jobs per tenant")
    max_body_bytes: int = Field(MAX_BODY_BYTES, ge=1, description="largest request body")
    # Files (batch inputs and outputs): a folder every API process and batch runner reach.
    files_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "genfleet" / "files",
        description="where uploaded and batch output files are kept",
    )
    max_file_bytes: int = Field(200 * 1024 * 1024, ge=1, description="largest uploaded file")
    max_file_lines: int = Field(50_000, ge=1, description="most lines in an uploaded file")
    batch_window_s: int = Field(
        24 * 3600, ge=1, description="a batch still running this long after creation expires"
    )
    batch_max_in_flight: int = Field(
        256, ge=1, description="batch runner: a batch's lines submitted and not yet finished"
    )
    batch_tick_s: float = Field(
        1.0,
        gt=0,
        description="batch runner: how often it looks at every batch (new ones, cancels, "
        "expiry); a batch job's result wakes it sooner",
    )
    # Deadlines of requests that give none (``services.deadlines``); off unless set.
    jobs_timeout_s: float | None = Field(
        None, gt=0, le=MAX_TIMEOUT_S, description="/v1/jobs: seconds a job may take to finish"
    )
    chat_completions_timeout_s: float | None = Field(
        None, gt=0, le=MAX_TIMEOUT_S, description="/v1/chat/completions: seconds to finish"
    )
    completions_timeout_s: float | None = Field(
        None, gt=0, le=MAX_TIMEOUT_S, description="/v1/completions: seconds to finish"
    )
    # Fleet admission for the OpenAI routes (``backlog``); /v1/jobs always queues.
    max_queued_jobs: int | None = Field(
        None, ge=1, description="fleet backlog past which OpenAI routes answer 429 (off: none)"
    )
    backlog_refresh_s: float = Field(
        2.0, gt=0, description="how often the fleet's backlog is read from Kafka"
    )
    # Which partition a job goes to (``services.affinity``).
    partition_key: Literal["affinity", "job_id"] = Field(
        "affinity",
        description="key jobs by conversation (affinity: prompt_cache_key, user or the "
        "prompt's opening) or by job id (spread evenly, no cache affinity)",
    )
    affinity_spill_after: int = Field(
        64, ge=1, description="jobs of one affinity key per window before it spills over"
    )
    affinity_window_s: float = Field(
        10.0, gt=0, description="the window in which an affinity key's jobs are counted"
    )
    # Delivery.
    redis_max_connections: int = Field(32, ge=2, description="Redis connections besides pub/sub")
    kafka_send_timeout_s: float = Field(
        4.0, gt=0, description="broker silent this long: 503 (the client has it within 5 s)"
    )
    retry_after_s: int = Field(5, ge=1, description="Retry-After when Kafka or Redis is down")
    sse_ping_s: float = Field(15.0, gt=0, description="keep-alive comment interval on streams")
    sse_client_buffer: int = Field(
        1024, ge=1, description="events a slow stream client may fall behind before it is dropped"
    )
