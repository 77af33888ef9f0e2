"""The partitions this worker owns: rebalances, commits, lag, and topics a broker lost.

On a rebalance the jobs of revoked partitions run on, detached, until the new
assignment says who has them: a partition that came back keeps its jobs, one that
went elsewhere has them aborted here (its new owner runs them), and a job whose
record went with a broker's lost state runs here to its end, whoever owns the
partition now. Offsets are committed every second, per partition up to the lowest
unfinished one (``Committer``).
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from worker.service.commits import Committer
from worker.service.flights import Flights, InFlight
from worker.service.kafka_out import KafkaOut
from worker.service.metrics import WorkerMetrics

log = logging.getLogger("genfleet.worker")
COMMIT_INTERVAL_S = 1.0
TOPIC_CHECK_S = 5.0
LAG_CHECK_S = 2.0
# A rebalance waits this long for claimed results to reach the topic before it
# gives the partitions up (their next owner would otherwise wait out the grace).
RELEASE_WAIT_S = 5.0


class Partitions(ConsumerRebalanceListener):
    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        committer: Committer,
        flights: Flights,
        abandon: Callable[[list[InFlight]], None],
        results_sent: Callable[[], Awaitable[None]],
        kafka: KafkaOut,
        metrics: WorkerMetrics,
    ) -> None:
        self.consumer = consumer
        self.committer = committer
        self.flights = flights
        self.abandon = abandon
        self.results_sent = results_sent
        self.kafka = kafka
        self.metrics = metrics
        self.joined = False  # the group gave us an assignment (possibly empty)
        self._lag_reported: set[TopicPartition] = set()
        self._last_lag_check = self._last_topic_check = time.monotonic()

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.release(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.adopt(assigned)
        await self.commit()  # the first commit, which later ones are checked by

    async def release(self, revoked: set[TopicPartition]) -> None:
        """Partitions taken away: send claimed results, commit what is done, and detach
        the jobs of those partitions (they run on until ``adopt`` knows who has them)."""
        try:
            await asyncio.wait_for(self.results_sent(), RELEASE_WAIT_S)
        except TimeoutError:
            log.warning("rebalance: results still unsent after %.0f s", RELEASE_WAIT_S)
        await self.commit()
        self.committer.forget(revoked)
        self.detach(revoked)

    def detach(self, partitions: set[TopicPartition], records_lost: bool = False) -> None:
        for flight in self.flights:
            if flight.record.partition in partitions:
                flight.attached = False
                flight.orphaned = flight.orphaned or records_lost

    def adopt(self, assigned: set[TopicPartition]) -> None:
        """Abort detached jobs whose partition went to another worker (it runs them now);
        keep those whose partition came back, and those whose record a broker lost
        (nobody else will be given them)."""
        log.info(
            "assigned [%s]", ", ".join(sorted(f"{tp.topic}:{tp.partition}" for tp in assigned))
        )
        self.joined = True
        gone = [
            f
            for f in self.flights
            if not f.attached and not f.orphaned and f.record.partition not in assigned
        ]
        self.abandon(gone)

    async def run_commits(self) -> None:
        while True:
            await asyncio.sleep(COMMIT_INTERVAL_S)
            await self.commit()

    async def commit(self) -> None:
        """Commit what is done; a partition whose broker lost our commits is read again
        from its start. Its jobs in flight run on, detached: their offsets name records
        of the lost log."""
        lost = await self.committer.commit()
        if lost:
            self.detach(set(lost), records_lost=True)
            await self.consumer.seek_to_beginning(*lost)
            # A broker that lost its state lost our topics too: an in-memory broker
            # takes records for a missing topic and loses them when it is created.
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                await self.kafka.ensure_topics()

    async def observe(self) -> None:
        """The partition gauges now, the lag every ``LAG_CHECK_S``; with no partition at
        all, every ``TOPIC_CHECK_S`` a look for topics a restarted broker lost."""
        owned = self.consumer.assignment()
        self.metrics.partitions_assigned.set(len(owned))
        self.metrics.partitions_paused.set(len(self.consumer.paused() & owned))
        clock = time.monotonic()
        if clock - self._last_lag_check > LAG_CHECK_S:
            self._last_lag_check = clock
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                await asyncio.wait_for(self._measure_lag(owned), LAG_CHECK_S)
        if not owned and clock - self._last_topic_check > TOPIC_CHECK_S:
            self._last_topic_check = clock
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                await self.kafka.ensure_topics()

    async def _measure_lag(self, owned: set[TopicPartition]) -> None:
        """Per owned partition, the records past its committed offset (what KEDA scales on)."""
        ends = await self.consumer.end_offsets(list(owned)) if owned else {}
        lag = self.metrics.consumer_lag
        for partition in self._lag_reported - set(ends):
            lag.remove(partition.topic, str(partition.partition))
        for partition, end in ends.items():
            committed = self.committer.committed(partition)
            if committed is not None:
                lag.labels(partition.topic, str(partition.partition)).set(max(0, end - committed))
        self._lag_reported = set(ends)
