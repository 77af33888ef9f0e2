"""``genfleet batch-runner``: the fleet's batches from ``validating`` to a final status."""

from producer_api.batch_runner.runner import run_batch_runner

__all__ = ["run_batch_runner"]
