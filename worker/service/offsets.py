"""Which Kafka offsets are safe to commit when jobs finish out of order.

Per partition we remember every offset handed to the engine until it is done.
The committable position is the lowest offset still in flight (everything
before it is done), or one past the highest offset seen when none is:

    offsets seen: 10 11 12 13 14      done: 10 12 13
    in flight:       11       14  ->  commit 11 (12 and 13 wait for 11)
"""

import heapq
from collections.abc import Hashable, Iterable


class PartitionOffsets:
    def __init__(self) -> None:
        self._in_flight: list[int] = []  # heap; done offsets are dropped lazily
        self._done: set[int] = set()
        self._next = -1  # one past the highest offset seen; -1 before any

    def add(self, offset: int) -> None:
        heapq.heappush(self._in_flight, offset)
        self._next = max(self._next, offset + 1)

    def done(self, offset: int) -> None:
        self._done.add(offset)

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight) - len(self._done)

    def committable(self) -> int | None:
        """The offset to commit (the next one to read), or None before any offset."""
        while self._in_flight and self._in_flight[0] in self._done:
            self._done.discard(heapq.heappop(self._in_flight))
        if self._in_flight:
            return self._in_flight[0]
        return self._next if self._next >= 0 else None


class OffsetTracker:
    """``PartitionOffsets`` for every assigned partition, keyed by any hashable id."""

    def __init__(self) -> None:
        self._partitions: dict[Hashable, PartitionOffsets] = {}

    def add(self, partition: Hashable, offset: int) -> None:
        self._partitions.setdefault(partition, PartitionOffsets()).add(offset)

    def done(self, partition: Hashable, offset: int) -> None:
        if partition in self._partitions:  # a revoked partition's late finish is ignored
            self._partitions[partition].done(offset)

    @property
    def num_in_flight(self) -> int:
        return sum(p.num_in_flight for p in self._partitions.values())

    def committable(self) -> dict[Hashable, int]:
        positions = {tp: p.committable() for tp, p in self._partitions.items()}
        return {tp: offset for tp, offset in positions.items() if offset is not None}

    def forget(self, partitions: Iterable[Hashable]) -> None:
        """Drop revoked partitions: their unfinished jobs belong to the next owner."""
        for partition in partitions:
            self._partitions.pop(partition, None)
