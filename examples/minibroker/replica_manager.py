"""The leader's partitions and their waits: Kafka's ReplicaManager, in small.

It owns the partitions (created from the command line, or on first use), the three purgatories
and what triggers them. `append_records` is Kafka's ``appendRecords``: check and append each
partition's batches, and for ``acks=all`` park a `DelayedProduce` until the high watermark
passes them. `fetch_messages` is ``fetchMessages``: a consumer's or follower's fetch, parked in a
`DelayedFetch` until ``min_bytes`` can be read, then read from the logs. The replication state
(`replication.Partition`) reports every append and high-watermark move through callbacks, which
trigger the purgatories (`purgatories.trigger`); Kafka's periodic ISR-shrink check is the only
other timer. Nothing polls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from purgatory import DelayedOperationPurgatory, EventLog

from .log import BatchError, parse_batches
from .protocol import Errors
from .purgatories import (
    DelayedFetch,
    DelayedProduce,
    FetchPartition,
    ProducePartition,
    trigger,
    watch,
)
from .replication import Partition, TopicPartition
from .stats import BrokerStats

__all__ = ("FetchedPartition", "ReplicaManager", "ReplicaSettings")

log = logging.getLogger("minibroker.replicas")


@dataclass(frozen=True)
class ReplicaSettings:
    """What the partitions are created with (Kafka's names)."""

    broker_id: int
    follower_ids: tuple[int, ...]
    min_insync_replicas: int
    replica_lag_time_max_ms: int
    max_message_bytes: int


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a fetch answer: its error, high watermark and the bytes read."""

    key: TopicPartition
    error_code: int
    high_watermark: int
    records: bytes


class ReplicaManager:
    """The leader's partitions, the produce / fetch / follower-fetch purgatories, the ISR task."""

    def __init__(
        self, settings: ReplicaSettings, stats: BrokerStats, *, event_log: EventLog | None = None
    ) -> None:
        self.settings = settings
        self.topics: dict[str, int] = {}
        self.partitions: dict[TopicPartition, Partition] = {}
        self.isr_changes: list[str] = []
        self.followers_seen: set[int] = set()
        self.produce_purgatory = DelayedOperationPurgatory[DelayedProduce](
            "produce", event_log=event_log
        )
        self.fetch_purgatory = DelayedOperationPurgatory[DelayedFetch]("fetch", event_log=event_log)
        self.follower_purgatory = DelayedOperationPurgatory[DelayedFetch](
            "follower-fetch", event_log=event_log
        )
        stats.register(self.produce_purgatory, self.fetch_purgatory, self.follower_purgatory)
        self._counters = stats.counters
        self._isr_task: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, topics: dict[str, int]) -> None:
        """Create the given topics and start Kafka's periodic ISR check."""
        for name, count in topics.items():
            self.create_topic(name, count)
        self._isr_task = asyncio.create_task(self._shrink_isr_periodically())

    async def stop(self) -> None:
        """Stop the ISR check and cancel what still waits (awaiters get `PurgatoryClosed`)."""
        if self._isr_task is not None:
            self._isr_task.cancel()
            await asyncio.gather(self._isr_task, return_exceptions=True)
        for purgatory in (self.produce_purgatory, self.fetch_purgatory, self.follower_purgatory):
            await purgatory.shutdown()

    def create_topic(self, name: str, count: int) -> None:
        """Create topic `name` with `count` partitions, every replica in sync (all logs empty)."""
        s = self.settings
        now = asyncio.get_running_loop().time()
        self.topics[name] = count
        for index in range(count):
            key = (name, index)
            self.partitions[key] = Partition(
                key=key,
                leader_id=s.broker_id,
                follower_ids=s.follower_ids,
                min_insync=s.min_insync_replicas,
                lag_max=s.replica_lag_time_max_ms / 1000,
                on_append=self._appended,
                on_high_watermark=self._high_watermark_moved,
                on_isr_change=self._isr_changed,
                now=now,
            )

    # -- what the replication state tells us -----------------------------------------------------

    def _appended(self, partition: Partition) -> None:
        # Followers wait for the log end to pass their fetch offset.
        trigger(self.follower_purgatory, partition.key, partition.log_end_offset)

    def _high_watermark_moved(self, partition: Partition) -> None:
        # acks=all produces and consumer fetches wait for the high watermark.
        trigger(self.produce_purgatory, partition.key, partition.high_watermark)
        trigger(self.fetch_purgatory, partition.key, partition.high_watermark)

    def _isr_changed(self, partition: Partition, what: str) -> None:
        self.isr_changes.append(what)
        log.info("%s; ISR now %s", what, partition.isr_list())

    async def _shrink_isr_periodically(self) -> None:
        """Kafka's ``isr-expiration`` task: every half ``replica.lag.time.max.ms``."""
        interval = self.settings.replica_lag_time_max_ms / 2000
        while True:
            await asyncio.sleep(interval)
            now = asyncio.get_running_loop().time()
            for partition in self.partitions.values():
                partition.shrink_isr(now)

    # -- Produce -------------------------------------------------------------------------------

    async def append_records(
        self, acks: int, timeout_ms: int, entries: Iterable[tuple[TopicPartition, Any]]
    ) -> dict[TopicPartition, ProducePartition]:
        """Append each partition's batches; with ``acks=all``, wait for the high watermark.

        Returns each partition's outcome: its base offset, or its error code.
        """
        statuses = {key: self._append(key, records, acks) for key, records in entries}
        waiting = {
            key: status.required_offset
            for key, status in statuses.items()
            if status.partition is not None and not status.done
        }
        if waiting:
            timeout = max(0, timeout_ms) / 1000  # a negative timeout expires at once
            statuses = await watch(
                self.produce_purgatory, DelayedProduce(timeout, statuses), waiting
            )
        return statuses

    def _append(self, key: TopicPartition, records: Any, acks: int) -> ProducePartition:
        """Check and append one partition's batches (Kafka ``appendRecordsToLeader``)."""
        if acks not in (-1, 0, 1):
            return ProducePartition(None, error_code=Errors.INVALID_REQUIRED_ACKS)
        partition = self.partitions.get(key)
        if partition is None:
            return ProducePartition(None, error_code=Errors.UNKNOWN_TOPIC_OR_PARTITION)
        try:
            batches = parse_batches(records, self.settings.max_message_bytes)
        except BatchError as exc:
            return ProducePartition(None, error_code=exc.code)
        if acks == -1 and len(partition.isr) < partition.min_insync:
            # Refused before the append: too few replicas to promise anything.
            return ProducePartition(None, error_code=Errors.NOT_ENOUGH_REPLICAS)
        first, last = partition.append(batches)
        return ProducePartition(
            partition, base_offset=first, required_offset=last + 1, done=acks != -1
        )

    # -- Fetch ---------------------------------------------------------------------------------

    async def fetch_messages(
        self,
        replica: int,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        asked: Iterable[tuple[TopicPartition, int, int]],
    ) -> list[FetchedPartition]:
        """A consumer's (`replica` -1) or follower's fetch: wait for `min_bytes`, then read.

        `asked` gives (partition, fetch offset, partition max bytes) in request order.
        """
        follower = replica >= 0
        if follower:
            self.followers_seen.add(replica)
        now = asyncio.get_running_loop().time()
        fetches: list[FetchPartition] = []
        for key, offset, partition_max_bytes in asked:
            partition = self.partitions.get(key)
            fetch = FetchPartition(key, partition, offset, partition_max_bytes)
            fetches.append(fetch)
            if partition is None:
                fetch.error_code = Errors.UNKNOWN_TOPIC_OR_PARTITION
            elif follower and replica not in partition.followers:
                fetch.error_code = Errors.REPLICA_NOT_AVAILABLE
            elif not 0 <= offset <= partition.log_end_offset:
                fetch.error_code = Errors.OFFSET_OUT_OF_RANGE
            elif follower:
                partition.follower_fetch(replica, offset, now)
        limit = _log_end if follower else _high_watermark
        purgatory = self.follower_purgatory if follower else self.fetch_purgatory
        op = DelayedFetch(max(0, max_wait_ms) / 1000, fetches, min_bytes, limit)
        kind = "follower" if follower else "consumer"
        self._counters[f"fetch {kind}"] += 1
        immediate = (
            max_wait_ms <= 0
            or not fetches
            or any(fetch.error_code != Errors.NONE for fetch in fetches)
            or op.readable_bytes() >= min_bytes
        )
        if not immediate:
            thresholds = {fetch.key: fetch.offset + 1 for fetch in fetches}
            await watch(purgatory, op, thresholds)
            self._counters[f"fetch {kind} parked {'expired' if op.is_expired else 'data'}"] += 1
        return _read(fetches, limit, max_bytes)


def _read(
    fetches: list[FetchPartition], limit: Callable[[Partition], int], max_bytes: int
) -> list[FetchedPartition]:
    """Read each partition up to `limit`, within `max_bytes` over all (at least one batch)."""
    budget = max_bytes
    fetched = []
    for fetch in fetches:
        partition = fetch.partition
        records = b""
        high_watermark = -1
        if partition is not None:
            high_watermark = partition.high_watermark
            if fetch.error_code == Errors.NONE:
                records = partition.log.read(
                    fetch.offset,
                    limit(partition),
                    min(fetch.max_bytes, budget),
                    at_least_one=budget == max_bytes,
                )
                budget = max(0, budget - len(records))
        fetched.append(FetchedPartition(fetch.key, fetch.error_code, high_watermark, records))
    return fetched


def _log_end(partition: Partition) -> int:
    return partition.log_end_offset


def _high_watermark(partition: Partition) -> int:
    return partition.high_watermark
