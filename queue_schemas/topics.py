"""The topics of a fleet, created by whichever side (API or worker) meets the broker first."""

import contextlib

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from queue_schemas.names import Names


async def ensure_topics(bootstrap: str, names: Names, jobs_partitions: int) -> None:
    """Create the job lanes, results and dead-letter topics that do not exist yet.

    The job lanes get several partitions per expected worker: a partition is
    read by one worker of the group at a time.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = {lane: jobs_partitions for lane in names.lanes}
        wanted[names.results_topic] = 1
        wanted[names.dead_letter_topic] = 1
        missing = [
            NewTopic(name, num_partitions=count, replication_factor=1)
            for name, count in wanted.items()
            if name not in existing
        ]
        if missing:
            # Another process may have created them in the meantime.
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(missing)
    finally:
        await admin.close()
