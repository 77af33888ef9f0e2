"""Every Kafka topic, consumer group, Redis key and channel name: defined here and nowhere else."""

import dataclasses
from dataclasses import dataclass

CONSUMER_GROUP = "genfleet-workers"


def model_slug(served_model_name: str) -> str:
    """A served model name as a part of a topic name: Kafka allows ``[A-Za-z0-9._-]``, so
    ``/`` becomes ``_s`` and ``_`` doubles (``org/my_model`` is ``org_smy__model``); no
    two names share a slug."""
    return served_model_name.replace("_", "__").replace("/", "_s")


@dataclass(frozen=True)
class Names:
    """Names under one prefix, so several fleets can share a broker and a Redis.

    ``model`` picks the job lanes and consumer group of one served model of a fleet of
    several; None is the fleet's default model, on the plain lanes (``genfleet.jobs``).
    Results, dead letters and every Redis name are the fleet's, whatever the model.
    """

    prefix: str = "genfleet."
    model: str | None = None

    def for_model(self, served_model_name: str | None) -> "Names":
        return dataclasses.replace(self, model=served_model_name)

    @property
    def _lane_prefix(self) -> str:
        if self.model is None:
            return self.prefix
        return f"{self.prefix}model.{model_slug(self.model)}."

    @property
    def jobs_topic(self) -> str:
        return f"{self._lane_prefix}jobs"

    @property
    def batch_jobs_topic(self) -> str:
        """The batch lane: jobs of batches (``/v1/batches``), which workers read behind the
        jobs topic's and stop reading first when their KV cache runs short."""
        return f"{self._lane_prefix}jobs.batch"

    @property
    def lanes(self) -> tuple[str, str]:
        """The topics workers read jobs from, the interactive one first."""
        return (self.jobs_topic, self.batch_jobs_topic)

    @property
    def results_topic(self) -> str:
        return f"{self.prefix}results"

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.prefix}dead-letter"

    @property
    def consumer_group(self) -> str:
        """One group per model: a model's workers share its lanes' partitions."""
        if self._lane_prefix == "genfleet.":
            return CONSUMER_GROUP
        return f"{self._lane_prefix}workers"

    @property
    def batch_runner_group(self) -> str:
        """Consumer group of the batch runners on the results topic."""
        return f"{self.prefix}batch-runner"

    @property
    def active_batches_key(self) -> str:
        """Set of ``tenant:batch_id`` of every batch not yet final: the runners' work list."""
        return f"{self.prefix}batches:active"

    def batch_key(self, tenant: str, batch_id: str) -> str:
        """Hash of a batch: its object (written by the runner), the cancel request (by the
        API) and the count of its lines submitted to the jobs topic."""
        return f"{self.prefix}batch:{tenant}:{batch_id}"

    def batch_results_key(self, tenant: str, batch_id: str) -> str:
        """Hash of a batch's job results by job id, each recorded once."""
        return f"{self.batch_key(tenant, batch_id)}:results"

    def tenant_batches_key(self, tenant: str) -> str:
        """Sorted set of the tenant's batches by creation, for listing."""
        return f"{self.prefix}tenant:{tenant}:batches"

    @property
    def control_channel(self) -> str:
        """Pub/sub channel every worker listens on (cancellations)."""
        return f"{self.prefix}control"

    @property
    def api_channel(self) -> str:
        """Pub/sub channel every API process keeps subscribed (its fan-out connection's home)."""
        return f"{self.prefix}api"

    def job_key(self, tenant: str, job_id: str) -> str:
        """Hash with the job's state (``JobState`` fields). Jobs live under their tenant, so
        two tenants may use the same job id; neither part may contain ``:`` (``bounds``), so
        no id names another job's key."""
        return f"{self.prefix}job:{tenant}:{job_id}"

    def events_stream(self, tenant: str, job_id: str) -> str:
        """Capped stream of the job's events, for replay (``Last-Event-ID``)."""
        return f"{self.job_key(tenant, job_id)}:events"

    def events_channel(self, tenant: str, job_id: str) -> str:
        """Pub/sub channel of the job's live events."""
        return f"{self.job_key(tenant, job_id)}:live"

    def response_key(self, tenant: str, response_id: str) -> str:
        """The Responses API's record of a response (its job's id): the request and the
        conversation it continues, as JSON."""
        return f"{self.job_key(tenant, response_id)}:response"

    def cancel_key(self, tenant: str, job_id: str) -> str:
        """Set when a job is cancelled; checked before a job is admitted."""
        return f"{self.job_key(tenant, job_id)}:cancel"

    def worker_marker(self, worker_id: str) -> str:
        """Set by a worker at start; missing after an outage, Redis lost its data."""
        return f"{self.prefix}worker:{worker_id}"

    @property
    def live_workers_key(self) -> str:
        """Sorted set of worker ids by the time (Unix seconds) their announcement expires."""
        return f"{self.prefix}workers:live"

    def announcement_key(self, worker_id: str) -> str:
        """A worker's ``WorkerAnnouncement`` (JSON), with a TTL it refreshes while alive."""
        return f"{self.worker_marker(worker_id)}:announcement"

    def tenant_jobs_key(self, tenant: str) -> str:
        """Sorted set of the tenant's unfinished jobs (the API's outstanding limit)."""
        return f"{self.prefix}tenant:{tenant}:jobs"

    def tenant_rate_key(self, tenant: str, window: int) -> str:
        """Counter of the tenant's new jobs in one rate-limit window."""
        return f"{self.prefix}tenant:{tenant}:rate:{window}"

    def affinity_counter_key(self, affinity_key: str, window: int) -> str:
        """Jobs of an affinity key in one window (a hot key spills past a bound)."""
        return f"{self.prefix}affinity:{affinity_key}:{window}"
