"""Committing up to the lowest unfinished offset, per partition."""

from worker.service.offsets import OffsetTracker, PartitionOffsets


def test_commit_waits_for_the_lowest_unfinished_offset() -> None:
    offsets = PartitionOffsets()
    assert offsets.committable() is None
    for offset in range(10, 15):
        offsets.add(offset)
    assert offsets.committable() == 10
    for offset in (10, 12, 13):
        offsets.done(offset)
    assert offsets.committable() == 11
    assert offsets.num_in_flight == 2
    offsets.done(11)
    assert offsets.committable() == 14
    offsets.done(14)
    assert offsets.committable() == 15
    assert offsets.num_in_flight == 0


def test_partitions_are_independent_and_revoked_ones_are_forgotten() -> None:
    tracker = OffsetTracker()
    tracker.add(("jobs", 0), 5)
    tracker.add(("jobs", 1), 7)
    tracker.add(("jobs", 1), 8)
    tracker.done(("jobs", 1), 7)
    assert tracker.committable() == {("jobs", 0): 5, ("jobs", 1): 8}
    tracker.forget([("jobs", 1)])
    tracker.done(("jobs", 1), 8)  # finished after revocation: ignored
    assert tracker.committable() == {("jobs", 0): 5}
    assert tracker.num_in_flight == 1
