"""The worker's metrics from engine step reports, without an engine: what each name counts."""

from prometheus_client import CollectorRegistry
from pytest import approx

from worker.engine_process.protocol import (
    EngineCounters,
    EngineLoad,
    Output,
    StepOutput,
    StepStats,
)
from worker.outputs import FinishReason, RequestDelta, Timings, Usage
from worker.service.metrics import WorkerMetrics, token_buckets

MODEL = {"model_name": "tiny"}


def _delta(
    index: int, ids: list[int], timings: Timings, finish: FinishReason | None = None
) -> Output:
    return Output(
        RequestDelta(
            request_id="r1",
            token_index=index,
            new_token_ids=ids,
            new_text="",
            new_logprobs=[],
            finished=finish is not None,
            finish_reason=finish,
            stop_reason=None,
            usage=Usage(prompt_tokens=7, completion_tokens=index + len(ids)),
            timings=timings,
        )
    )


def _step(
    outputs: list[Output], ended_at: float, counters: EngineCounters, seqs: int = 1
) -> StepOutput:
    load = EngineLoad(free_blocks=30, total_blocks=40, waiting=2, running=seqs)
    return StepOutput(outputs, load, counters, StepStats(0.05, seqs, 9, ended_at), 1, True)


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(f"genfleet:{name}", {**MODEL, **labels})


def test_a_request_is_counted_as_vllm_counts_it() -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, "tiny", max_model_len=2048)
    arrived = 100.0
    first = Timings(arrived, first_token_time=100.4, scheduled_time=100.1)
    metrics.record_step(_step([_delta(0, [5], first)], 100.4, EngineCounters(0, 7, 0)))
    metrics.record_step(_step([_delta(1, [6], first)], 100.5, EngineCounters(1, 7, 0)))
    last = Timings(arrived, 100.4, finished_time=100.75, scheduled_time=100.1)
    metrics.record_step(_step([_delta(2, [7], last, "stop")], 100.75, EngineCounters(1, 23, 16)))

    assert _value(registry, "generation_tokens_total") == 3
    assert _value(registry, "prompt_tokens_total") == 7  # once, at the first token
    assert _value(registry, "request_success_total", finished_reason="stop") == 1
    assert _value(registry, "num_preemptions_total") == 1
    assert _value(registry, "prefix_cache_queries_total") == 23
    assert _value(registry, "prefix_cache_hits_total") == 16
    assert _value(registry, "num_requests_waiting") == 2
    assert _value(registry, "kv_cache_usage_perc") == 0.25
    assert _value(registry, "time_to_first_token_seconds_sum") == approx(0.4)
    # Two gaps between three tokens: 0.1 s and 0.25 s.
    assert _value(registry, "inter_token_latency_seconds_count") == 2
    assert _value(registry, "inter_token_latency_seconds_sum") == approx(0.35)
    assert _value(registry, "e2e_request_latency_seconds_sum") == approx(0.75)
    assert _value(registry, "request_queue_time_seconds_sum") == approx(0.1)
    assert _value(registry, "request_prefill_time_seconds_sum") == approx(0.3)
    assert _value(registry, "request_decode_time_seconds_sum") == approx(0.35)
    assert _value(registry, "request_generation_tokens_sum") == 3
    assert _value(registry, "request_prompt_tokens_bucket", le="10.0") == 1
    assert _value(registry, "engine_step_seconds_count") == 3
    assert _value(registry, "engine_batch_size_count") == 3


def test_an_abort_before_its_first_step_counts_no_phases() -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, "tiny", max_model_len=64)
    aborted = _delta(0, [], Timings(100.0, finished_time=100.2), "abort")
    # A step that only reported an abort ran no sequences: no step time observed.
    metrics.record_step(_step([aborted], 100.2, EngineCounters(), seqs=0))
    assert _value(registry, "request_success_total", finished_reason="abort") == 1
    assert _value(registry, "e2e_request_latency_seconds_count") == 1
    assert not _value(registry, "request_queue_time_seconds_count")
    assert not _value(registry, "generation_tokens_total")
    assert not _value(registry, "engine_step_seconds_count")


def test_token_buckets_go_1_2_5_up_to_the_context() -> None:
    assert token_buckets(2048) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert token_buckets(1) == [1]


def test_the_loaded_model_is_described_by_info_gauges() -> None:
    from worker.engine_process.protocol import Ready

    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, "tiny", max_model_len=2048)
    load = EngineLoad(free_blocks=30, total_blocks=40, waiting=0)
    ready = Ready(load, 2048, 16, "bfloat16", "Q4_1+Q8_0+bfloat16", 123456, 40000, 1536, 2)
    metrics.describe_engine(ready)

    formats = {"weight_formats": "Q4_1+Q8_0+bfloat16", "tensor_parallel_size": "2"}
    assert _value(registry, "model_weight_bytes", **formats) == 123456
    assert _value(registry, "model_active_weight_bytes") == 40000
    assert _value(registry, "kv_cache_bytes_per_token") == 1536
    cache = {"block_size": "16", "num_gpu_blocks": "40", "cache_dtype": "bfloat16"}
    assert _value(registry, "cache_config_info", **cache) == 1


def test_speculative_decoding_is_counted_as_vllm_counts_it() -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, "tiny", max_model_len=2048)
    timings = Timings(100.0, first_token_time=100.1, scheduled_time=100.0)
    first = EngineCounters(spec_drafts=2, spec_draft_tokens=7, spec_accepted_tokens=5,
                           spec_accepted_per_position=(2, 1, 1, 1))  # fmt: skip
    later = EngineCounters(spec_drafts=3, spec_draft_tokens=12, spec_accepted_tokens=6,
                           spec_accepted_per_position=(3, 1, 1, 1, 0))  # fmt: skip
    metrics.record_step(_step([_delta(0, [5], timings)], 100.1, first))
    metrics.record_step(_step([_delta(1, [6], timings)], 100.2, later))

    assert _value(registry, "spec_decode_num_drafts_total") == 3
    assert _value(registry, "spec_decode_num_draft_tokens_total") == 12
    assert _value(registry, "spec_decode_num_accepted_tokens_total") == 6
    assert _value(registry, "spec_decode_num_accepted_tokens_per_pos_total", position="0") == 3
    assert _value(registry, "spec_decode_num_accepted_tokens_per_pos_total", position="3") == 1
