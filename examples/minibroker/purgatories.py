"""The broker's delayed operations: Kafka's ``DelayedProduce`` and ``DelayedFetch``.

Both watch partition keys ``(topic, partition)`` with a *threshold*: the offset the partition must
reach before re-trying the operation is worth anything. A produce with ``acks=all`` watches each
partition at its last offset + 1 and is triggered with the new high watermark; a consumer fetch
at offset ``o`` watches at ``o + 1`` against the high watermark; a follower fetch at ``o`` watches
at ``o + 1`` against the log end offset. `watch` and `trigger` below are the only two places that
talk to the purgatory. With thresholds, a trigger re-tries only the operations it can complete:
a high watermark moving from 10 to 11 wakes the produces waiting for 11, not those waiting for
500, and no fetch parked at offset 20 (Kafka re-tries every operation on the key).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from purgatory import DelayedOperation, DelayedOperationPurgatory

from .protocol import Errors
from .replication import Partition, TopicPartition

__all__ = (
    "DelayedFetch",
    "DelayedProduce",
    "FetchPartition",
    "ProducePartition",
    "trigger",
    "watch",
)

T = TypeVar("T")


async def watch(
    purgatory: DelayedOperationPurgatory[Any],
    op: DelayedOperation[T],
    thresholds: Mapping[TopicPartition, int],
) -> T:
    """Park `op` on its partitions, each at its threshold offset, and wait for the outcome."""
    outcome: T = await purgatory.watch(op, thresholds)
    return outcome


def trigger(purgatory: DelayedOperationPurgatory[Any], key: Hashable, reached: int) -> int:
    """Tell `purgatory` that partition `key` reached offset `reached`; re-try who waits for it."""
    return purgatory.check_and_complete(key, reached)


@dataclass(eq=False, slots=True)
class ProducePartition:
    """One partition of a produce request: where its batch landed and its answer so far."""

    partition: Partition | None
    """``None`` when the partition was refused before any append (its error is final)."""
    base_offset: int = -1
    required_offset: int = 0
    """The high watermark at which the batch is on every in-sync replica: last offset + 1."""
    error_code: int = Errors.NONE
    done: bool = False


class DelayedProduce(DelayedOperation[dict[TopicPartition, ProducePartition]]):
    """An ``acks=all`` produce waiting for the high watermark (Kafka ``DelayedProduce``).

    Completes when, on every partition, the high watermark reached the batch's end. If the ISR
    shrank below ``min.insync.replicas`` by then, that partition answers
    ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` (Kafka's ``checkEnoughReplicasReachOffset``); on
    timeout, the partitions still waiting answer ``REQUEST_TIMED_OUT``.
    """

    __slots__ = ("partitions",)

    def __init__(self, timeout: float, partitions: dict[TopicPartition, ProducePartition]) -> None:
        super().__init__(timeout)
        self.partitions = partitions

    def try_complete(self) -> bool:
        waiting = False
        for status in self.partitions.values():
            partition = status.partition
            if status.done or partition is None:
                continue
            if partition.high_watermark >= status.required_offset:
                status.done = True
                if len(partition.isr) < partition.min_insync:
                    status.error_code = Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            else:
                waiting = True
        return False if waiting else self.force_complete()

    def on_complete(self) -> dict[TopicPartition, ProducePartition]:
        for status in self.partitions.values():
            if not status.done and status.partition is not None:
                status.done = True
                status.error_code = Errors.REQUEST_TIMED_OUT
        return self.partitions

    def on_expiration(self) -> None:
        pass  # counted by the purgatory's statistics (Kafka: the expired-requests meter)


@dataclass(eq=False, slots=True)
class FetchPartition:
    """One partition of a fetch request: where it reads and what it may read up to."""

    key: TopicPartition
    partition: Partition | None
    offset: int
    max_bytes: int
    error_code: int = Errors.NONE


class DelayedFetch(DelayedOperation[list[FetchPartition]]):
    """A fetch waiting for ``min_bytes`` (Kafka ``DelayedFetch``), consumer's or follower's.

    A consumer may read up to the high watermark, a follower up to the log end offset: `limit`
    says which. Completes once the bytes readable over its partitions reach ``min_bytes``, or at
    ``max_wait_ms`` with whatever there is (possibly nothing, which is not an error).
    """

    __slots__ = ("limit", "min_bytes", "partitions")

    def __init__(
        self,
        timeout: float,
        partitions: list[FetchPartition],
        min_bytes: int,
        limit: Callable[[Partition], int],
    ) -> None:
        super().__init__(timeout)
        self.partitions = partitions
        self.min_bytes = min_bytes
        self.limit = limit

    def readable_bytes(self) -> int:
        """Bytes the fetch would return now, over all its partitions."""
        total = 0
        for fetch in self.partitions:
            partition = fetch.partition
            if partition is not None and fetch.error_code == Errors.NONE:
                total += partition.log.bytes_between(fetch.offset, self.limit(partition))
        return total

    def try_complete(self) -> bool:
        if self.readable_bytes() >= self.min_bytes:
            return self.force_complete()
        return False

    def on_complete(self) -> list[FetchPartition]:
        return self.partitions  # the response is read from the log by the handler
