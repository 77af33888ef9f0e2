"""Worker settings: one name each as an environment variable (GENFLEET_*) and a flag (--*).

Imports no torch, so ``genfleet --help`` and the API's commands stay light.
"""

import argparse
import os
import socket
from typing import TYPE_CHECKING

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.model_fetch import DEFAULT_MODEL

if TYPE_CHECKING:
    from worker.config import EngineConfig


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GENFLEET_")

    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL")
    model: str = Field(DEFAULT_MODEL, description="model folder or known name")
    topic_prefix: str = Field("genfleet.", description="prefix of every topic, key and channel")
    worker_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="name in results and logs",
    )
    jobs_partitions: int = Field(8, ge=1, description="partitions of the jobs topic if created")
    kafka_idempotence: bool = Field(
        False, description="idempotent producer (Apache Kafka yes; the tansu broker no)"
    )
    # Engine knobs, as in EngineConfig.
    dtype: str = Field("float32", description="float32 or bfloat16")
    max_num_seqs: int = Field(64, ge=1, description="sequences per engine step")
    max_num_batched_tokens: int = Field(512, ge=1, description="tokens per engine step")
    block_size: int = Field(16, ge=1, description="KV cache block size")
    num_gpu_blocks_override: int | None = Field(None, ge=1, description="KV blocks, fixed")
    kv_cache_memory_gib: float = Field(1.0, gt=0, description="KV cache budget when not fixed")
    enable_prefix_caching: bool = Field(True, description="reuse cached prefix blocks")
    # Admission and backpressure.
    max_waiting: int = Field(64, ge=1, description="local waiting jobs before pausing intake")
    low_watermark: float = Field(0.05, ge=0, lt=1, description="pause below this free-block share")
    high_watermark: float = Field(0.2, gt=0, le=1, description="resume above this free-block share")
    # Output.
    event_stream_maxlen: int = Field(10_000, ge=1, description="events kept per job stream")
    result_ttl_s: int = Field(86_400, ge=1, description="lifetime of a job's Redis keys")
    drain_deadline_s: float = Field(30.0, ge=0, description="SIGTERM: time to finish jobs")

    def engine_config(self) -> "EngineConfig":
        from worker.config import EngineConfig  # torch: only when an engine is built

        return EngineConfig(
            model=self.model,
            dtype=self.dtype,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            block_size=self.block_size,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_memory_gib=self.kv_cache_memory_gib,
            enable_prefix_caching=self.enable_prefix_caching,
        )


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; a flag left out falls back to GENFLEET_* or the default."""
    for name, field in WorkerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} (env GENFLEET_{name.upper()})"
        if field.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(flag, help=help_text)


def settings_from_args(args: argparse.Namespace) -> WorkerSettings:
    given = {
        name: getattr(args, name)
        for name in WorkerSettings.model_fields
        if getattr(args, name, None) is not None
    }
    return WorkerSettings(**given)
