"""Committing consumed offsets, and noticing a broker that lost them.

Within one assignment the worker is the only committer of its partitions, so
the offset the broker holds for one of them is the one we committed last (or
one whose commit we could not confirm). When it holds another (none at all,
typically), the broker lost its state: an in-memory broker restarted, or the
topic was deleted and made again. Committing our offsets there would skip the
new log's records below them, so the partition is reported lost instead, and
the worker reads it again from its start (the jobs it already finished are
skipped by their state in Redis). Every partition gets a first commit as soon
as it is ours (the broker's offset, or the log's start), so even one we have
taken nothing from yet is checked.
"""

import asyncio
import logging
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from worker.service.offsets import OffsetTracker

# A broker call that takes longer is tried again with the next commit.
KAFKA_CALL_TIMEOUT_S = 5.0

log = logging.getLogger("genfleet.worker")


class Committer:
    def __init__(self, consumer: AIOKafkaConsumer, offsets: OffsetTracker) -> None:
        self.consumer = consumer
        self.offsets = offsets
        self._confirmed: dict[TopicPartition, int] = {}
        # Offsets whose commit failed or timed out: the broker may hold them.
        self._unconfirmed: dict[TopicPartition, set[int]] = {}

    def committed(self, partition: TopicPartition) -> int | None:
        """The offset the broker confirmed holding for us, if any."""
        return self._confirmed.get(partition)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions no longer ours (or lost): their next owner starts afresh."""
        partitions = list(partitions)
        self.offsets.forget(partitions)
        for partition in partitions:
            self._confirmed.pop(partition, None)
            self._unconfirmed.pop(partition, None)

    async def commit(self) -> list[TopicPartition]:
        """Commit the done offsets of the partitions we own, and return those whose
        broker no longer holds our commits (forgotten here already). A failed call is
        logged and tried again with the next commit."""
        owned = self.consumer.assignment()
        if not owned:
            return []
        try:
            held = await asyncio.wait_for(self._held(owned), KAFKA_CALL_TIMEOUT_S)
        except (KafkaError, TimeoutError) as error:
            log.warning("reading committed offsets failed (%r); trying again", error)
            return []
        lost = [tp for tp in owned if tp in self._confirmed and not self._ours(tp, held[tp])]
        self.forget(lost)
        for tp in owned:
            if tp not in lost and tp not in self._confirmed and held[tp] is not None:
                self._confirmed[tp] = held[tp]  # type: ignore[assignment]
        done = self.offsets.committable()
        wanted = {
            tp: offset
            for tp in owned
            if tp not in lost
            and (offset := done.get(tp, self._confirmed.get(tp))) is not None
            and offset != self._confirmed.get(tp)
        }
        unbased = [tp for tp in owned if tp not in lost and tp not in self._confirmed]
        try:
            await asyncio.wait_for(self._commit(wanted, unbased), KAFKA_CALL_TIMEOUT_S)
        except (KafkaError, TimeoutError) as error:
            log.warning("commit failed (%r); retrying with the next commit", error)
        for tp in lost:
            log.warning(
                "partition %d: the broker holds none of our commits (it lost its state); "
                "reading the partition from its start",
                tp.partition,
            )
        return lost

    def _ours(self, tp: TopicPartition, held: int | None) -> bool:
        return held == self._confirmed[tp] or held in self._unconfirmed.get(tp, set())

    async def _held(self, partitions: set[TopicPartition]) -> dict[TopicPartition, int | None]:
        ordered = sorted(partitions)
        offsets = await asyncio.gather(*(self.consumer.committed(tp) for tp in ordered))
        return dict(zip(ordered, offsets, strict=True))

    async def _commit(self, wanted: dict[TopicPartition, int], unbased: list[TopicPartition]):
        """Commit ``wanted``, and the log's start for partitions without any commit."""
        if unbased:
            starts = await self.consumer.beginning_offsets(unbased)
            wanted = {**{tp: starts[tp] for tp in unbased}, **wanted}
        if not wanted:
            return
        for tp, offset in wanted.items():
            self._unconfirmed.setdefault(tp, set()).add(offset)
        await self.consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in wanted.items()})
        for tp, offset in wanted.items():
            self._confirmed[tp] = offset
            self._unconfirmed.pop(tp, None)
