"""Worker settings: the engine's (``EngineConfig``) and the service's, one name each as an
environment variable (GENFLEET_*) and a flag (--*) (see ``genfleet.settings_flags``).

Imports no torch, so ``genfleet --help`` and the API's commands stay light.
"""

import os
import socket
from pathlib import Path

from pydantic import Field

from queue_schemas.bounds import MAX_RECORD_BYTES, ServedModelName
from queue_schemas.fleet_settings import FleetSettings
from queue_schemas.names import Names
from queue_schemas.tool_parsers import ReasoningParser, ToolCallParser
from worker.config import EngineConfig
from worker.engine_process.threads import serving_engine_threads

# A CPU worker's step, as vLLM's CPU server takes it: through `genfleet up` with one
# client, the median TTFT of a 20-request burst was 1.35-1.39 s against 1.66-1.83 s
# with the offline engine's 512 tokens and 64 sequences, throughput alike
# (docs/benchmarks.md, "genfleet up against vllm serve").
CPU_SERVING_STEP = {"max_num_batched_tokens": 2048, "max_num_seqs": 128}
# How a worker reads its replies (tool calls, reasoning): `genfleet up` passes them on.
REPLY_SETTINGS = ("enable_auto_tool_choice", "tool_call_parser", "reasoning_parser")
# The partition assignors a worker may list (``worker.service.app.ASSIGNORS``).
KAFKA_ASSIGNORS = "sticky-lanes|sticky|roundrobin"


class WorkerSettings(FleetSettings, EngineConfig):
    """The service's settings, on top of the engine's (``EngineConfig``)."""

    model_config = FleetSettings.model_config  # GENFLEET_* variables

    served_model_name: ServedModelName | None = Field(
        None,
        description="the name the model is served under; a worker given one reads that "
        "model's own job lanes and consumer group, one without serves the fleet's default "
        "model on the plain lanes",
    )
    worker_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="name in results and logs",
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
    kafka_assignors: str = Field(
        "sticky-lanes",
        pattern=rf"^({KAFKA_ASSIGNORS})(,({KAFKA_ASSIGNORS}))*$",
        description="partition assignors, comma-separated, preferred first: sticky-lanes "
        "(each lane balanced, partitions kept across rebalances), Kafka's sticky or "
        "roundrobin (a rolling upgrade from another: sticky-lanes,OTHER, then sticky-lanes)",
    )
    kafka_heartbeat_interval_ms: int = Field(
        1000, ge=100, description="heartbeats to the group (a third of the session or less)"
    )
    kafka_fetch_max_wait_ms: int = Field(
        100, ge=0, description="longest a fetch waits for new records"
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
    # Tool calls and reasoning (vLLM's flags and names).
    enable_auto_tool_choice: bool = Field(
        True,
        description="serve tool_choice auto, reading the model's calls from its text "
        "(off: such jobs are refused)",
    )
    tool_call_parser: ToolCallParser | None = Field(
        None,
        description="the format the model writes tool calls in; unset: the one its chat "
        "template asks for (hermes where it takes no tools: genfleet's tool prompt)",
    )
    reasoning_parser: ReasoningParser | None = Field(
        None, description="read the model's thinking into reasoning_content (unset: none)"
    )
    # Observability: /metrics, /healthz and /readyz (off unless a port is given).
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="port for /metrics, /healthz and /readyz"
    )
    metrics_host: str = Field("0.0.0.0", description="listen address of the metrics port")
    # Redis.
    redis_max_connections: int = Field(16, ge=2, description="connections besides pub/sub")
    redis_timeout_s: float = Field(5.0, gt=0, description="a Redis call silent this long fails")

    @property
    def names(self) -> Names:
        """The fleet's names, with the job lanes and group of the served model."""
        return super().names.for_model(self.served_model_name)

    @property
    def served_name(self) -> str:
        """The model's name in announcements and metrics (vLLM's ``model_name`` label)."""
        return self.served_model_name or Path(self.model).name

    def engine_config(self) -> EngineConfig:
        """The engine's knobs; the threads, and on a CPU the step budget, a serving engine
        takes unless they are set."""
        from worker.device import resolve_device  # torch: in the engine process

        config = EngineConfig(**self.engine_fields())
        device = resolve_device(config.device)
        updates: dict[str, object] = {}
        if config.engine_threads is None:
            updates["engine_threads"] = serving_engine_threads(device)
        if device == "cpu":
            updates |= {
                name: value
                for name, value in CPU_SERVING_STEP.items()
                if name not in self.model_fields_set
            }
        return config.model_copy(update=updates)
