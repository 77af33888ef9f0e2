"""The worker's Prometheus metrics: one registry, every name defined here once.

The engine's metrics carry vLLM v1's names, meanings and buckets under
``genfleet:`` with a ``model_name`` label, so dashboards and alerts written for
vLLM read a genfleet worker too. They are recorded in the service process from
what each engine step reports (``StepOutput``): gauges from its load, counters
from the engine's running totals, request histograms from the timings of
finished requests. The fleet's own metrics (partitions, lag, dead letters,
redeliveries, results, steps) follow them.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from queue_schemas import JobResult, JobStatus
from worker.engine_process.protocol import EngineCounters, Ready, StepOutput
from worker.outputs import RequestDelta

# vLLM v1's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
STEP_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def token_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's ``build_1_2_5_buckets``)."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


MODEL = ["model_name"]


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int) -> None:
        self.registry = registry
        self.model_name = model_name
        self._add_engine()
        self._add_requests(token_buckets(max_model_len))
        self._add_fleet()
        self._counted = EngineCounters()
        self._last_token_at: dict[str, float] = {}  # by request id

    def _gauge(self, name: str, doc: str, labels: list[str] = MODEL) -> Gauge:
        return Gauge(f"genfleet:{name}", doc, labels, registry=self.registry)

    def _counter(self, name: str, doc: str, labels: list[str] = MODEL) -> Counter:
        return Counter(f"genfleet:{name}", doc, labels, registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets: tuple | list) -> Histogram:
        return Histogram(f"genfleet:{name}", doc, MODEL, buckets=buckets, registry=self.registry)

    def _add_engine(self) -> None:
        """vLLM's engine gauges and counters."""
        gauge, counter = self._gauge, self._counter
        self.running = gauge("num_requests_running", "Number of requests in model execution")
        self.waiting = gauge("num_requests_waiting", "Number of requests waiting to be processed")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage")
        self.prefix_queries = counter(
            "prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens"
        )
        self.prefix_hits = counter(
            "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens"
        )
        self.preemptions = counter("num_preemptions", "Cumulative number of preemptions")
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed")
        self.generation_tokens = counter(
            "generation_tokens", "Number of generation tokens processed"
        )
        self.spec_drafts = counter("spec_decode_num_drafts", "Number of spec decoding drafts")
        self.spec_draft_tokens = counter(
            "spec_decode_num_draft_tokens", "Number of draft tokens proposed"
        )
        self.spec_accepted_tokens = counter(
            "spec_decode_num_accepted_tokens", "Number of draft tokens accepted"
        )
        self.spec_accepted_per_position = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens, by their position in the draft",
            [*MODEL, "position"],
        )
        self.request_success = counter(
            "request_success",
            "Count of processed requests, by finish reason",
            ["model_name", "finished_reason"],
        )

    def _record_spec_decode(self, totals: EngineCounters, counted: EngineCounters) -> None:
        model = self.model_name
        self.spec_drafts.labels(model).inc(totals.spec_drafts - counted.spec_drafts)
        self.spec_draft_tokens.labels(model).inc(
            totals.spec_draft_tokens - counted.spec_draft_tokens
        )
        self.spec_accepted_tokens.labels(model).inc(
            totals.spec_accepted_tokens - counted.spec_accepted_tokens
        )
        before = counted.spec_accepted_per_position
        for position, total in enumerate(totals.spec_accepted_per_position):
            done = before[position] if position < len(before) else 0
            if total > done:
                self.spec_accepted_per_position.labels(model, str(position)).inc(total - done)

    def describe_engine(self, ready: Ready) -> None:
        """The loaded model's weights and KV cache, as info gauges (vLLM's
        ``cache_config_info``; the weights' formats and bytes are genfleet's)."""
        weights = self._gauge(
            "model_weight_bytes",
            "Bytes the weights take (on each tensor-parallel rank)",
            [*MODEL, "weight_formats", "tensor_parallel_size"],
        )
        layout = (ready.weight_formats, str(ready.tensor_parallel_size))
        weights.labels(self.model_name, *layout).set(ready.weight_bytes)
        active = self._gauge(
            "model_active_weight_bytes",
            "Bytes of weights one token's forward reads: a mixture of experts' unchosen "
            "experts left out (on each tensor-parallel rank)",
            MODEL,
        )
        active.labels(self.model_name).set(ready.active_weight_bytes)
        per_token = self._gauge(
            "kv_cache_bytes_per_token",
            "KV-cache bytes one token takes over every layer (on each tensor-parallel rank)",
            MODEL,
        )
        per_token.labels(self.model_name).set(ready.kv_bytes_per_token)
        cache = self._gauge(
            "cache_config_info",
            "Information of the KV cache",
            [*MODEL, "block_size", "num_gpu_blocks", "cache_dtype"],
        )
        labels = (ready.block_size, ready.load.total_blocks, ready.kv_cache_dtype)
        cache.labels(self.model_name, *map(str, labels)).set(1)

    def _add_requests(self, tokens: list[int]) -> None:
        """vLLM's per-request and per-step histograms."""
        histogram = self._histogram
        self.ttft = histogram(
            "time_to_first_token_seconds",
            "Time to first token, from when the worker took the job",
            TTFT_BUCKETS,
        )
        self.inter_token = histogram(
            "inter_token_latency_seconds", "Time between two output tokens", INTER_TOKEN_BUCKETS
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds",
            "Time from when the worker took the job to its last token",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "request_queue_time_seconds",
            "Time waiting before the first step",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "request_prefill_time_seconds",
            "Time from the first step to the first token",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "request_decode_time_seconds",
            "Time from the first token to the last",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens per finished request", tokens
        )
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Generated tokens per finished request", tokens
        )
        self.step_seconds = histogram(
            "engine_step_seconds", "Duration of one engine step", STEP_BUCKETS
        )
        self.batch_size = histogram(
            "engine_batch_size", "Sequences run in one engine step", BATCH_BUCKETS
        )

    def _add_fleet(self) -> None:
        """The fleet's own: partitions, lag, dead letters, redeliveries, results."""
        gauge, counter = self._gauge, self._counter
        self.partitions_assigned = gauge(
            "partitions_assigned", "Jobs-topic partitions this worker owns", []
        )
        self.partitions_paused = gauge(
            "partitions_paused", "Owned partitions paused by backpressure or outages", []
        )
        self.consumer_lag = gauge(
            "consumer_lag",
            "Jobs in an owned partition past its committed offset",
            ["topic", "partition"],
        )
        self.dead_lettered = counter(
            "jobs_dead_lettered", "Job records sent to the dead-letter topic", ["reason"]
        )
        self.redelivered = counter(
            "jobs_redelivered", "Jobs delivered again after an earlier attempt started", []
        )
        self.resumed_tokens = counter(
            "resumed_tokens",
            "Output tokens of earlier attempts that taken-over jobs resumed from",
            [],
        )
        self.results = counter(
            "results_produced", "Results produced to the results topic", ["status"]
        )
        self.expired = counter(
            "jobs_expired",
            "Jobs whose deadline passed: before they started (queued) or while they ran",
            ["stage"],
        )

    def count_result(self, result: JobResult) -> None:
        """A result on the results topic, by status; an expired one by when it expired."""
        self.results.labels(result.status.value).inc()
        if result.status is JobStatus.EXPIRED:
            self.expired.labels("queued" if result.started_at is None else "running").inc()

    def record_step(self, step: StepOutput) -> None:
        model = self.model_name
        load = step.load
        self.running.labels(model).set(load.running)
        self.waiting.labels(model).set(load.waiting)
        self.kv_usage.labels(model).set(1 - load.free_blocks / max(1, load.total_blocks))
        totals, counted = step.counters, self._counted
        self.preemptions.labels(model).inc(totals.preemptions - counted.preemptions)
        self.prefix_queries.labels(model).inc(
            totals.prefix_cache_queries - counted.prefix_cache_queries
        )
        self.prefix_hits.labels(model).inc(totals.prefix_cache_hits - counted.prefix_cache_hits)
        self._record_spec_decode(totals, counted)
        self._counted = totals
        if step.step is None:
            return
        if step.step.num_seqs:  # not a step that only reported aborts
            self.step_seconds.labels(model).observe(step.step.seconds)
            self.batch_size.labels(model).observe(step.step.num_seqs)
        for output in step.outputs:
            self._record_delta(output.delta, step.step.ended_at)

    def _record_delta(self, delta: RequestDelta, ended_at: float) -> None:
        model, timings, rid = self.model_name, delta.timings, delta.request_id
        if delta.new_token_ids:
            self.generation_tokens.labels(model).inc(len(delta.new_token_ids))
            last = self._last_token_at.get(rid)
            if last is not None:
                self.inter_token.labels(model).observe(ended_at - last)
            elif delta.token_index == 0 and timings.first_token_time is not None:
                self.prompt_tokens.labels(model).inc(delta.usage.prompt_tokens)
                self.ttft.labels(model).observe(timings.first_token_time - timings.arrival_time)
            self._last_token_at[rid] = ended_at
        if not delta.finished:
            return
        self._last_token_at.pop(rid, None)
        self.request_success.labels(model, delta.finish_reason or "abort").inc()
        self.request_prompt_tokens.labels(model).observe(delta.usage.prompt_tokens)
        self.request_generation_tokens.labels(model).observe(delta.usage.completion_tokens)
        finished = timings.finished_time
        if finished is None:
            return
        self.e2e.labels(model).observe(finished - timings.arrival_time)
        scheduled, first = timings.scheduled_time, timings.first_token_time
        if scheduled is not None:
            self.queue_time.labels(model).observe(scheduled - timings.arrival_time)
            if first is not None:
                self.prefill_time.labels(model).observe(first - scheduled)
                self.decode_time.labels(model).observe(finished - first)
