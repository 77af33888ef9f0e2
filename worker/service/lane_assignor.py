"""Partition assignment that balances each job lane on its own and keeps what members hold.

Kafka's sticky assignor balances the count of partitions per member over all
topics together: with two lanes of four partitions and two workers, it may give
one worker every partition of the jobs topic and the other every partition of
the batch lane, so one worker serves all interactive traffic. Round-robin
balances each lane but reshuffles on every rebalance, moving conversations away
from the prefix caches that hold them.

``StickyLanesAssignor`` does both: per topic, each subscribed member gets its
quota (the partitions divided evenly, the remainder to members that already
hold the most), keeping the partitions it held up to its quota; only the rest
moves. What a member holds travels in its join metadata, as the sticky
assignor's does.
"""

import json
import logging
from collections.abc import Iterable, Mapping

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

log = logging.getLogger("genfleet.worker")


def balance_sticky(
    partitions: list[int], members: list[str], held: Mapping[str, set[int]]
) -> dict[str, list[int]]:
    """One topic's partitions over its members: counts within one of each other, each
    member keeping as many of ``held`` as its share allows; members in ``members``'
    order break ties, so every leader computes the same answer."""
    if not members:
        return {}
    base, extra = divmod(len(partitions), len(members))
    # The members holding the most get the larger shares: they give up the least.
    by_holding = sorted(members, key=lambda m: -len(held.get(m, set()) & set(partitions)))
    quota = {member: base + (rank < extra) for rank, member in enumerate(by_holding)}
    assigned: dict[str, list[int]] = {member: [] for member in members}
    free = set(partitions)
    for member in by_holding:
        for partition in sorted(held.get(member, set()) & free)[: quota[member]]:
            assigned[member].append(partition)
            free.discard(partition)
    leftover = sorted(free)
    for member in by_holding:
        while len(assigned[member]) < quota[member]:
            assigned[member].append(leftover.pop(0))
    return {member: sorted(owned) for member, owned in assigned.items()}


def _held(user_data: bytes) -> dict[str, set[int]]:
    """A member's holdings from its metadata; anything unreadable holds nothing."""
    try:
        decoded = json.loads(user_data or b"{}")
        return {str(topic): {int(p) for p in parts} for topic, parts in decoded.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


class StickyLanesAssignor(AbstractPartitionAssignor):
    name = "genfleet-sticky-lanes"
    version = 0
    # This process's consumer's holdings (one consumer per worker process), as
    # aiokafka's own sticky assignor keeps its state on the class.
    holding: dict[str, list[int]] = {}  # noqa: RUF012

    @classmethod
    def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(
            cls.version, sorted(topics), json.dumps(cls.holding).encode()
        )

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        cls.holding = {topic: list(partitions) for topic, partitions in assignment.assignment}

    @classmethod
    def assign(
        cls, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        held = {member: _held(meta.user_data) for member, meta in members.items()}
        topics = sorted({topic for meta in members.values() for topic in meta.subscription})
        assigned: dict[str, dict[str, list[int]]] = {member: {} for member in members}
        for topic in topics:
            partitions = cluster.partitions_for_topic(topic)
            if partitions is None:
                log.warning("no partition metadata for topic %s", topic)
                continue
            subscribers = sorted(m for m, meta in members.items() if topic in meta.subscription)
            holdings = {member: held[member].get(topic, set()) for member in subscribers}
            for member, owned in balance_sticky(sorted(partitions), subscribers, holdings).items():
                if owned:
                    assigned[member][topic] = owned
        return {
            member: ConsumerProtocolMemberAssignment(cls.version, sorted(owned.items()), b"")
            for member, owned in assigned.items()
        }
