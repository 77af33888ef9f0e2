"""The batch runner's results reader against a real Redis: a result counts once, and a
result recorded before an outage cut the reply off still reaches the runner."""

import asyncio
import time

from redis.asyncio import Redis

from producer_api.batch_runner.results import ResultsReader
from producer_api.schemas.batches import BatchObject
from producer_api.settings import ApiSettings
from producer_api.stores.batches import BatchStore
from queue_schemas import JobResult, JobStatus


def test_a_result_recorded_before_an_outage_still_reaches_the_runner(services, prefix) -> None:
    kafka, redis_service = services
    settings = ApiSettings(
        kafka_bootstrap=kafka.address, redis_url=redis_service.address, topic_prefix=prefix
    )
    batch = BatchObject(
        id="batch_outage", endpoint="/v1/chat/completions", input_file_id="file-x",
        completion_window="24h", status="in_progress", created_at=int(time.time()),
    )  # fmt: skip
    first = JobResult(job_id="batch_outage-0-0", status=JobStatus.COMPLETED, text="first")
    again = first.model_copy(update={"status": JobStatus.FAILED, "text": "", "error": "late"})
    heard: list[tuple[str, JobResult]] = []

    async def scenario() -> None:
        redis = Redis.from_url(redis_service.address)
        store = BatchStore(redis, settings.names)
        await store.create(batch)
        reader = ResultsReader(settings, store, lambda b, r: heard.append((b, r)))
        # The recording went through; its reply did not (the reader's retry finds it).
        await store.record_result(batch.tenant, batch.id, first)
        await reader.take(first.model_dump_json().encode())
        # A second result for the job (a duplicate): the batch keeps counting the first.
        await reader.take(again.model_dump_json().encode())
        await reader.take(b"not a result")
        await redis.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert heard == [(batch.id, first), (batch.id, first)]
