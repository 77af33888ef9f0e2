"""What to do with a job record, given what earlier deliveries of the job left in Redis.

Pure, so every case is a unit test (``tests/worker/service/test_admission.py``).
"""

import enum

from queue_schemas.redis_records import Delivery


class Action(enum.Enum):
    RUN = "run"
    # Final and its result on the results topic: nothing to do.
    SKIP = "skip"
    # Final, the result claimed but not confirmed sent, and the claim is recent: its
    # claimant may still be sending it. Look again once the grace has passed.
    WAIT = "wait"
    # Final, claimed long ago and never confirmed: the claimant died. Send the stored
    # result unless the results topic already has it.
    CONFIRM = "confirm"
    # Cancelled before it finished (its worker died before writing the result):
    # finish it as cancelled here.
    CANCEL = "cancel"


def decide(past: Delivery, now: float, grace_s: float) -> Action:
    if past.status is not None and past.status.is_final:
        if past.result_sent:
            return Action.SKIP
        if past.claimed_at is not None and now - past.claimed_at < grace_s:
            return Action.WAIT
        return Action.CONFIRM
    if past.cancelled:
        return Action.CANCEL
    return Action.RUN
