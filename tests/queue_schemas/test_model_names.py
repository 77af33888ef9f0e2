"""Each served model's job lanes and consumer group, and the fleet's names they share."""

import re

from hypothesis import given
from hypothesis import strategies as st

from queue_schemas import Names
from queue_schemas.bounds import MAX_SERVED_MODEL_CHARS, SERVED_MODEL_PATTERN
from queue_schemas.names import model_slug

KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
served_names = st.from_regex(SERVED_MODEL_PATTERN, fullmatch=True).filter(
    lambda name: len(name) <= MAX_SERVED_MODEL_CHARS
)


def test_the_default_model_keeps_the_plain_lanes_and_others_get_their_own() -> None:
    fleet = Names()
    assert fleet.for_model(None) == fleet
    assert (fleet.jobs_topic, fleet.consumer_group) == ("genfleet.jobs", "genfleet-workers")
    coder = fleet.for_model("org/coder_v2")
    assert coder.jobs_topic == "genfleet.model.org_scoder__v2.jobs"
    assert coder.batch_jobs_topic == "genfleet.model.org_scoder__v2.jobs.batch"
    assert coder.consumer_group == "genfleet.model.org_scoder__v2.workers"
    # Results, dead letters and every Redis name are the fleet's.
    assert coder.results_topic == fleet.results_topic
    assert coder.dead_letter_topic == fleet.dead_letter_topic
    assert coder.job_key("t", "j") == fleet.job_key("t", "j")
    assert coder.live_workers_key == fleet.live_workers_key
    # A model named like a lane of the default model does not share it.
    assert fleet.for_model("batch").jobs_topic not in fleet.lanes


@given(served_names, served_names)
def test_every_served_name_gets_legal_lanes_of_its_own(first: str, second: str) -> None:
    a, b = Names().for_model(first), Names().for_model(second)
    for topic in (*a.lanes, a.consumer_group):
        assert KAFKA_TOPIC.match(topic), topic
    if first != second:
        assert model_slug(first) != model_slug(second)
        assert not set(a.lanes) & set(b.lanes)
        assert a.consumer_group != b.consumer_group
