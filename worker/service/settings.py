"""Worker settings: one name each as an environment variable (GENFLEET_*) and a flag (--*)
(see ``genfleet.settings_flags``).

Imports no torch, so ``genfleet --help`` and the API's commands stay light.
"""

import os
import socket
from typing import TYPE_CHECKING

from pydantic import Field

from queue_schemas.bounds import MAX_RECORD_BYTES
from queue_schemas.fleet_settings import FleetSettings
from worker.model_fetch import DEFAULT_MODEL
from worker.service.engine_threads import serving_engine_threads

if TYPE_CHECKING:
    from worker.config import EngineConfig


class WorkerSettings(FleetSettings):
    model: str = Field(DEFAULT_MODEL, description="model folder or known name")
    worker_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="name in results and logs",
    )
    # Engine knobs, as in EngineConfig.
    device: str = Field("auto", description="auto (CUDA if torch sees a GPU), cpu, cuda, cuda:N")
    dtype: str = Field(
        "auto", description="auto (bf16 where the hardware has it, else fp16/fp32), float32, ..."
    )
    max_num_seqs: int = Field(64, ge=1, description="sequences per engine step")
    max_num_batched_tokens: int = Field(512, ge=1, description="tokens per engine step")
    block_size: int = Field(16, ge=1, description="KV cache block size")
    num_gpu_blocks_override: int | None = Field(None, ge=1, description="KV blocks, fixed")
    kv_cache_memory_gib: float = Field(1.0, gt=0, description="CPU: KV cache budget (GiB)")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="CUDA: share of device memory for the engine, KV included"
    )
    enable_prefix_caching: bool = Field(True, description="reuse cached prefix blocks")
    enforce_eager: bool = Field(False, description="CUDA: no graphs for decode steps")
    engine_threads: int | None = Field(
        None,
        ge=1,
        description="the engine's CPU threads (default: on a CPU all usable cores, but one from "
        "four cores on, left to the service; on a GPU one)",
    )
    # Admission and backpressure.
    max_waiting: int = Field(64, ge=1, description="local waiting jobs before pausing intake")
    low_watermark: float = Field(0.05, ge=0, lt=1, description="pause below this free-block share")
    high_watermark: float = Field(0.2, gt=0, le=1, description="resume above this free-block share")
    batch_low_watermark: float = Field(
        0.2, ge=0, lt=1, description="batch lane: pause below this free-block share"
    )
    batch_high_watermark: float = Field(
        0.4, gt=0, le=1, description="batch lane: resume above this free-block share"
    )
    max_record_bytes: int = Field(
        MAX_RECORD_BYTES, ge=1024, description="larger job records are dead-lettered"
    )
    # Failover: a dead worker's partitions move after the session timeout.
    kafka_session_timeout_ms: int = Field(
        6000, ge=1000, description="a worker silent this long leaves the group"
    )
    kafka_heartbeat_interval_ms: int = Field(
        1000, ge=100, description="heartbeats to the group (a third of the session or less)"
    )
    kafka_fetch_max_wait_ms: int = Field(
        25, ge=0, description="longest a fetch waits for new records"
    )
    stuck_timeout_s: float = Field(
        60.0, gt=0, description="one engine step running this long: leave the group, exit 1"
    )
    # Output.
    stream_interval: int = Field(
        1,
        ge=1,
        description="tokens per published event of a job after its first (vLLM's "
        "--stream-interval): fewer Redis messages and SSE chunks per token",
    )
    drain_deadline_s: float = Field(30.0, ge=0, description="SIGTERM: time to finish jobs")
    result_confirm_grace_s: float = Field(
        15.0, gt=0, description="a result claimed this long ago and unconfirmed is resent"
    )
    # Observability: /metrics, /healthz and /readyz (off unless a port is given).
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="port for /metrics, /healthz and /readyz"
    )
    metrics_host: str = Field("0.0.0.0", description="listen address of the metrics port")
    # Redis.
    redis_max_connections: int = Field(16, ge=2, description="connections besides pub/sub")
    redis_timeout_s: float = Field(5.0, gt=0, description="a Redis call silent this long fails")

    def engine_config(self) -> "EngineConfig":
        from worker.config import EngineConfig  # torch: only when an engine is built

        config = EngineConfig(
            model=self.model,
            device=self.device,
            dtype=self.dtype,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            block_size=self.block_size,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_memory_gib=self.kv_cache_memory_gib,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enable_prefix_caching=self.enable_prefix_caching,
            enforce_eager=self.enforce_eager,
            cpu_threads=self.engine_threads,
        )
        if config.cpu_threads is None:
            config.cpu_threads = serving_engine_threads(config.device)
        return config
