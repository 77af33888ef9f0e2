"""``genfleet bench --serve``: the workload and client driven at a running OpenAI server."""

import asyncio

from genfleet.bench.serve import base_url, serve_workloads
from genfleet.bench.workloads import make_workload
from tests.integration.conftest import ALICE, MODEL
from worker.engine.tokenizer import load_tokenizer


def test_the_serve_benchmark_measures_a_running_server_on_its_own_requests(
    api_fleet, chat_model
) -> None:
    api, *_ = api_fleet
    tokenizer = load_tokenizer(chat_model)
    assert tokenizer is not None
    requests = make_workload("burst", tokenizer, seed=3)[:6]
    summaries = asyncio.run(serve_workloads(api.url, MODEL, {"burst": requests}, api_key=ALICE))
    summary = summaries["burst"]
    assert summary.system == api.url
    assert summary.output_tokens_per_s > 0 and 0 < summary.p50_ttft <= summary.p50_latency
    # (serve_workloads raises if any request got other than its output length.)


def test_a_server_address_is_taken_with_or_without_its_v1() -> None:
    assert base_url("http://h:8000") == base_url("http://h:8000/v1/") == "http://h:8000/v1"
