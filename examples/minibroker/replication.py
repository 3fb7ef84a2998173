"""Replication state on the leader: follower fetch offsets, the ISR and the high watermark.

Kafka's rules, as in ``kafka.cluster.Partition`` and ``Replica``:

* A follower's log end offset is the offset of its last fetch (it asks for what it lacks).
* A follower is *caught up* at a fetch if it fetched at the leader's log end offset then, or at
  least at the log end offset the leader had at its previous fetch (``lastCaughtUpTimeMs``).
* The ISR shrinks (Kafka's periodic ``maybeShrinkIsr``) by the followers not caught up for
  ``replica.lag.time.max.ms``, unless their log end equals the leader's; a follower rejoins at a
  fetch that reaches the high watermark.
* The high watermark is the smallest log end offset over the ISR (the leader included); it only
  moves forward.

Every change that matters to a parked request is reported through two callbacks, so that this
module stays free of purgatories: ``on_append(partition)`` when the log end moves (follower
fetches wait for that) and ``on_high_watermark(partition)`` when the high watermark moves
(acks=all produces and consumer fetches wait for that).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .log import PartitionLog

__all__ = ("FollowerState", "Partition", "TopicPartition")

TopicPartition = tuple[str, int]


@dataclass(eq=False)
class FollowerState:
    """What the leader knows of one follower of one partition."""

    log_end_offset: int = 0
    last_caught_up: float = 0.0
    last_fetch_time: float = 0.0
    leader_end_at_last_fetch: int = 0


@dataclass(eq=False)
class Partition:
    """One partition on the leader: its log, its followers and its in-sync replica set."""

    key: TopicPartition
    leader_id: int
    follower_ids: tuple[int, ...]
    min_insync: int
    lag_max: float
    """``replica.lag.time.max.ms``, in seconds."""
    on_append: Callable[[Partition], None]
    on_high_watermark: Callable[[Partition], None]
    on_isr_change: Callable[[Partition, str], None]
    now: float = 0.0
    log: PartitionLog = field(default_factory=PartitionLog)
    high_watermark: int = 0
    followers: dict[int, FollowerState] = field(default_factory=dict)
    isr: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        # A new partition starts with every replica in sync (all logs are empty).
        self.followers = {
            replica: FollowerState(last_caught_up=self.now) for replica in self.follower_ids
        }
        self.isr = {self.leader_id, *self.follower_ids}

    @property
    def log_end_offset(self) -> int:
        """The leader's log end offset."""
        return self.log.log_end_offset

    def isr_list(self) -> list[int]:
        """The ISR in broker-id order (what Metadata reports)."""
        return sorted(self.isr)

    def append(self, batches: list[bytearray]) -> tuple[int, int]:
        """Append on the leader; wakes the follower fetches, and may move the high watermark."""
        first, last = self.log.append(batches)
        self.on_append(self)
        self._maybe_advance_high_watermark()
        return first, last

    def follower_fetch(self, replica: int, offset: int, now: float) -> None:
        """Record a follower's fetch at `offset`: its log end, catch-up time, ISR, HW."""
        state = self.followers[replica]
        leader_end = self.log_end_offset
        if offset >= leader_end:
            state.last_caught_up = now
        elif offset >= state.leader_end_at_last_fetch:
            state.last_caught_up = max(state.last_caught_up, state.last_fetch_time)
        state.leader_end_at_last_fetch = leader_end
        state.last_fetch_time = now
        state.log_end_offset = offset
        if replica not in self.isr and offset >= self.high_watermark:
            self.isr.add(replica)
            self.on_isr_change(self, f"replica {replica} rejoined the ISR of {self.key}")
        self._maybe_advance_high_watermark()

    def shrink_isr(self, now: float) -> None:
        """Drop the followers that have not caught up for ``lag_max`` (Kafka's maybeShrinkIsr)."""
        leader_end = self.log_end_offset
        for replica, state in self.followers.items():
            if (
                replica in self.isr
                and state.log_end_offset != leader_end
                and now - state.last_caught_up > self.lag_max
            ):
                self.isr.discard(replica)
                self.on_isr_change(self, f"replica {replica} left the ISR of {self.key}")
        # With a laggard gone, the high watermark may jump to the next-slowest replica.
        self._maybe_advance_high_watermark()

    def _maybe_advance_high_watermark(self) -> None:
        ends = [self.log_end_offset]
        ends += [self.followers[r].log_end_offset for r in self.isr if r != self.leader_id]
        candidate = min(ends)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            self.on_high_watermark(self)
