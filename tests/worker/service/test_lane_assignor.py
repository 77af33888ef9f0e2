"""The lane assignor: each topic balanced on its own, members keeping what they hold."""

from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from hypothesis import given
from hypothesis import strategies as st

from worker.service.lane_assignor import StickyLanesAssignor, balance_sticky


class _Cluster:
    def __init__(self, partitions: dict[str, int]) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self.partitions.get(topic)
        return None if count is None else set(range(count))


def _assign(cluster: _Cluster, held: dict[str, dict[str, list[int]]]) -> dict[str, dict]:
    """A join of members holding ``held`` (their metadata as each would send it)."""
    members = {}
    for member, holding in held.items():
        StickyLanesAssignor.holding = holding
        members[member] = StickyLanesAssignor.metadata(cluster.partitions)
    answer = StickyLanesAssignor.assign(cluster, members)  # type: ignore[arg-type]
    return {member: dict(assignment.assignment) for member, assignment in answer.items()}


def test_two_lanes_are_each_split_between_two_workers() -> None:
    """Where Kafka's sticky assignor may give one worker every interactive partition."""
    cluster = _Cluster({"jobs": 4, "jobs.batch": 4})
    alone = _assign(cluster, {"a": {}})
    assert alone == {"a": {"jobs": [0, 1, 2, 3], "jobs.batch": [0, 1, 2, 3]}}
    both = _assign(cluster, {"a": alone["a"], "b": {}})
    for member in "ab":
        assert {topic: len(parts) for topic, parts in both[member].items()} == {
            "jobs": 2, "jobs.batch": 2,
        }  # fmt: skip


def test_a_member_that_leaves_moves_only_its_own_partitions() -> None:
    cluster = _Cluster({"jobs": 6})
    three = _assign(cluster, {"a": {}, "b": {}, "c": {}})
    two = _assign(cluster, {"a": three["a"], "b": three["b"]})
    for member in "ab":
        assert set(three[member]["jobs"]) <= set(two[member]["jobs"])
    back = _assign(cluster, {"a": two["a"], "b": two["b"], "c": {}})
    for member in "ab":
        assert set(back[member]["jobs"]) <= set(two[member]["jobs"])
        assert len(back[member]["jobs"]) == 2


def test_unreadable_metadata_holds_nothing_and_unknown_topics_are_skipped() -> None:
    cluster = _Cluster({"jobs": 2})
    members = {
        "a": ConsumerProtocolMemberMetadata(0, ["jobs", "gone"], b"not json"),
        "b": ConsumerProtocolMemberMetadata(0, ["jobs"], b'{"jobs": "x"}'),
    }
    answer = StickyLanesAssignor.assign(cluster, members)  # type: ignore[arg-type]
    assert sorted(p for a in answer.values() for p in a.partitions()) == [("jobs", 0), ("jobs", 1)]


@given(
    st.integers(0, 24),
    st.lists(st.text("abcdefgh", min_size=1, max_size=2), min_size=1, max_size=6, unique=True),
    st.data(),
)
def test_balanced_complete_and_as_sticky_as_the_shares_allow(count, members, data) -> None:
    partitions = list(range(count))
    # Disjoint holdings, as a group's members have them (some partitions held by nobody).
    owners = data.draw(st.lists(st.sampled_from([None, *members]), min_size=count, max_size=count))
    held = {
        m: {p for p, owner in zip(partitions, owners, strict=True) if owner == m} for m in members
    }
    assigned = balance_sticky(partitions, sorted(members), held)
    assert sorted(p for parts in assigned.values() for p in parts) == partitions  # each once
    sizes = [len(parts) for parts in assigned.values()]
    assert max(sizes) - min(sizes) <= 1
    for member, parts in assigned.items():
        assert len(held[member] & set(parts)) == min(len(held[member]), len(parts))
