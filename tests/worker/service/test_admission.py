"""What a redelivered record's job needs, from what earlier deliveries left in Redis."""

import pytest

from queue_schemas import JobStatus
from queue_schemas.redis_records import Delivery
from worker.service.admission import Action, decide

NOW, GRACE = 1000.0, 30.0


@pytest.mark.parametrize(
    ("past", "action"),
    [
        (Delivery(), Action.RUN),  # never seen
        (Delivery(status=JobStatus.QUEUED), Action.RUN),
        (Delivery(status=JobStatus.RUNNING), Action.RUN),  # its worker died mid-job
        (Delivery(status=JobStatus.RUNNING, cancelled=True), Action.CANCEL),
        (Delivery(status=JobStatus.COMPLETED, result_sent=True), Action.SKIP),
        # A final job is done whatever a late cancel says.
        (Delivery(status=JobStatus.COMPLETED, cancelled=True), Action.SKIP),
        (
            Delivery(status=JobStatus.FAILED, result_sent=False, claimed_at=NOW - 1),
            Action.WAIT,
        ),
        (
            Delivery(status=JobStatus.FAILED, result_sent=False, claimed_at=NOW - GRACE),
            Action.CONFIRM,
        ),
        # Final and unsent with no claim time: nobody is sending it.
        (Delivery(status=JobStatus.CANCELLED, result_sent=False), Action.CONFIRM),
    ],
)
def test_each_past_gets_its_action(past: Delivery, action: Action) -> None:
    assert decide(past, NOW, GRACE) is action
