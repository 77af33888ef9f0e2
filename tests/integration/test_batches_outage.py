"""A batch through an outage, on a fleet of its own: Redis stops mid-batch."""

import time

from genfleet.local_fleet import local_fleet
from tests.integration.batch_helpers import (
    batch_client,
    chat_line,
    create_batch,
    read_jsonl,
    wait_for_status,
)


def test_a_batch_goes_on_through_a_redis_restart(chat_model, tmp_path) -> None:
    """Its own fleet: Redis (with AOF) stops for a second mid-batch; the runner, the API
    and the worker wait it out, and every line comes back once. (It found an idle
    worker that kept its intake paused for ever after the outage: nothing of its own
    was left to call Redis and see it back.)"""
    files = ["--files-dir", str(tmp_path / "files"), "--model", "tiny-chat"]
    with local_fleet(chat_model, tmp_path, redis_data_dir=tmp_path / "redis") as fleet:
        fleet.start_worker()
        fleet.start_batch_runner(*files, "--batch-max-in-flight", "8")
        # Retries as the official client makes them by default: the API answers 503
        # while Redis is away.
        client = batch_client(fleet.start_api(*files), retries=5)
        fleet.wait_until_serving()
        batch = create_batch(
            client, [chat_line(i, max_tokens=32, ignore_eos=True) for i in range(60)]
        )
        deadline = time.monotonic() + 120
        while client.batches.retrieve(batch.id).request_counts.completed < 10:
            assert time.monotonic() < deadline, "the batch did not get going"
            time.sleep(0.2)
        fleet.restart_redis(down_s=1.0)
        done = wait_for_status(
            client, batch.id, {"completed", "failed"}, timeout_s=60, log_dir=tmp_path
        )
        assert done.status == "completed"
        output = read_jsonl(client, done.output_file_id)
        assert [line["custom_id"] for line in output] == [f"q-{i}" for i in range(60)]
        assert all(runner.alive for runner in fleet.batch_runners)
