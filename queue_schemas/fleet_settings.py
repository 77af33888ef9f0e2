"""Where a fleet's Kafka and Redis are, and how its keys live: settings shared by the API
and the workers, so that both read the same ``GENFLEET_*`` variables."""

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from queue_schemas.logs import LogFormat
from queue_schemas.names import Names


class FleetSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GENFLEET_")

    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL")
    topic_prefix: str = Field("genfleet.", description="prefix of every topic, key and channel")
    jobs_partitions: int = Field(8, ge=1, description="partitions of the jobs topic if created")
    kafka_idempotence: bool = Field(
        False, description="idempotent producer (Apache Kafka yes; the tansu broker no)"
    )
    event_stream_maxlen: int = Field(10_000, ge=1, description="events kept per job stream")
    result_ttl_s: int = Field(86_400, ge=1, description="lifetime of a job's Redis keys")
    log_format: LogFormat = Field(
        "auto", description="auto (JSON unless on a terminal), json, text"
    )

    @property
    def names(self) -> Names:
        return Names(self.topic_prefix)
