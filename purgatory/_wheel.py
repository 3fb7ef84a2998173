"""A hierarchical timing wheel: O(1) insert and cancel, buckets that expire together.

Theory of operation
-------------------
Time is counted in integer *ticks*; the caller converts seconds to ticks (rounding deadlines up,
so nothing ever fires early) and passes the current tick to `TimingWheel.advance`. The wheel
itself never reads a clock.

Level 0 has ``wheel_size`` buckets of one tick each and covers the ticks
``[current, current + wheel_size)``. An entry whose deadline falls there goes straight into the
bucket of its tick, so every entry of a level-0 bucket has the same deadline. A later deadline
goes to an *overflow* wheel (level 1) whose buckets span ``wheel_size`` ticks each and which covers
``wheel_size ** 2`` ticks; levels are created on demand, so the structure grows with the longest
timeout, not with the number of entries (Kafka's ``TimingWheel``).

Buckets are not scanned tick by tick. A bucket enters a small heap, keyed by its expiration tick,
when it goes from unused to used; `advance` pops due buckets in order, which is why an idle wheel
costs nothing and a sparse one costs one pop per non-empty bucket (Kafka's ``DelayQueue`` of
``TimerTaskList``). A due level-0 bucket is returned whole. A due higher-level bucket is due only
in the sense that its *span* has started: its entries are *cascaded*, reinserted relative to the
new current tick, which drops each into a finer level (or returns it, if its own deadline has
come). A wide level 0 keeps cascades rare and small: with the default 1024 one-millisecond ticks,
every timeout under a second is inserted once and never moves.

Order. Due entries come back in deadline order and, within one tick, in insertion order. For
one deadline, an entry inserted later sits in the same or a lower level (its deadline was
closer), so two details keep that promise across cascades: buckets falling due on the same tick
are popped highest level first, and entries inserted directly into a bucket before the cascades
of its tick arrive are set aside and put back behind the cascaded (older) ones.

Cancel is O(1): every bucket is an insertion-ordered ``dict`` used as a set, and every entry
knows its bucket, so removing one is a single ``del`` and a cancelled entry never pins memory
until its deadline (the classic purgatory leak).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from typing import Any, Final, Protocol, final

__all__ = ("Bucket", "TimerEntry", "TimingWheel")


@final
class Bucket(dict[Any, None]):
    """The entries of one wheel slot, in insertion order; a ``dict`` for O(1) removal.

    Subclassing ``dict`` lets the hot paths add and remove entries with plain subscript syntax,
    without a Python-level method call.
    """

    __slots__ = ("cascade_mark", "displaced", "expiration", "level", "wheel")

    # A dict subclass may be hashed by identity: buckets are keys nowhere but it documents intent.
    __hash__ = object.__hash__  # type: ignore[assignment]

    def __init__(self, wheel: TimingWheel, level: int) -> None:
        super().__init__()
        self.wheel: Final = wheel
        self.level: Final = level
        self.expiration = -1
        # The tick of the last cascade into this bucket, and the entries that cascade set aside
        # until the cascades of that tick are over (see TimingWheel._cascade).
        self.cascade_mark: int | None = None
        self.displaced: list[Any] | None = None

    def __repr__(self) -> str:
        return f"<Bucket level={self.level} expiration={self.expiration} size={len(self)}>"


class TimerEntry(Protocol):
    """What the wheel needs of an entry: two writable attributes it owns."""

    _bucket: Bucket | None
    _deadline: int


@final
class TimingWheel:
    """Entries keyed by an integer deadline tick, returned in order once the tick has come.

    Args:
        wheel_size: Buckets per level (>= 2). Wider means rarer, smaller cascades for a little
            more memory (one empty bucket per slot).
        start_tick: The tick the wheel starts at; deadlines at or before it are already due.
    """

    __slots__ = (
        "_current",
        "_heap",
        "_levels",
        "_overdue",
        "_push_count",
        "_size",
        "_wheel_size",
    )

    def __init__(self, wheel_size: int, start_tick: int = 0) -> None:
        if isinstance(wheel_size, bool) or not isinstance(wheel_size, int):
            raise TypeError(f"wheel_size must be an int, got {wheel_size!r}")
        if wheel_size < 2:
            raise ValueError(f"wheel_size must be at least 2, got {wheel_size!r}")
        self._wheel_size = wheel_size
        # _current[i] is the current tick truncated to level i's bucket span.
        self._current: list[int] = [start_tick]
        self._levels: list[list[Bucket]] = [[Bucket(self, 0) for _ in range(wheel_size)]]
        self._heap: list[tuple[int, int, int, Bucket]] = []
        self._overdue = Bucket(self, -1)
        self._size = 0
        self._push_count = 0

    # -- inspection ---------------------------------------------------------------------------

    @property
    def wheel_size(self) -> int:
        """Buckets per level."""
        return self._wheel_size

    @property
    def current_tick(self) -> int:
        """The tick up to which every due entry has been returned."""
        return self._current[0]

    @property
    def levels(self) -> int:
        """How many levels exist (overflow wheels are created on demand)."""
        return len(self._levels)

    def __len__(self) -> int:
        """Entries held, overdue ones included. Runtime complexity: O(1)."""
        return self._size

    def __iter__(self) -> Iterator[Any]:
        """Every entry held, in no particular order (for shutdown and invariant checks)."""
        yield from self._overdue
        for level in self._levels:
            for bucket in level:
                yield from bucket

    def buckets(self) -> Iterator[Bucket]:
        """Every bucket, the overdue one first (for invariant checks)."""
        yield self._overdue
        for level in self._levels:
            yield from level

    def span(self, level: int) -> int:
        """Ticks covered by one bucket of `level`."""
        return int(self._wheel_size**level)

    def next_deadline(self) -> float:
        """The tick at which `advance` next has work, or ``math.inf`` if nothing is held.

        This is the earliest non-empty bucket's expiration, which for a higher level is the start
        of its span (a cascade is due then), so it is never later than the earliest deadline.
        Runtime complexity: O(1) amortised (buckets emptied by cancels are dropped here).
        """
        if self._overdue:
            return self._current[0]
        heap = self._heap
        while heap:
            bucket = heap[0][3]
            if bucket:
                return heap[0][0]
            heapq.heappop(heap)
            bucket.expiration = -1
        return math.inf

    # -- mutation -----------------------------------------------------------------------------

    def add(self, entry: TimerEntry, deadline: int) -> None:
        """Hold `entry` until `deadline` (a tick). A deadline already reached is due next advance.

        Runtime complexity: O(1) (O(levels) for deadlines beyond level 0, and a heap push of
        O(log buckets) when the bucket was unused).
        """
        entry._deadline = deadline
        self._size += 1
        current = self._current[0]
        if deadline <= current:
            bucket = self._overdue
        elif deadline < current + self._wheel_size:
            bucket = self._levels[0][deadline % self._wheel_size]
            if bucket.expiration != deadline:
                bucket.expiration = deadline
                self._push(bucket, deadline)
        else:
            bucket = self._overflow_bucket(deadline)
        bucket[entry] = None
        entry._bucket = bucket

    def remove(self, entry: TimerEntry) -> bool:
        """Stop holding `entry`; ``False`` if it was not held. Runtime complexity: O(1)."""
        bucket = entry._bucket
        if bucket is None:
            return False
        del bucket[entry]
        entry._bucket = None
        self._size -= 1
        return True

    def advance(self, now: int) -> list[Any]:
        """Move to tick `now` and return the entries due by then, no longer held.

        Entries come in deadline order, and in insertion order within a tick. Time never goes
        back: a `now` before the current tick only returns the overdue entries.
        Runtime complexity: O(due entries + due buckets * log buckets), plus O(entries cascaded).
        """
        due: list[Any] = []
        overdue = self._overdue
        if overdue:
            due.extend(sorted(overdue, key=_deadline_of))  # stable: insertion order per tick
            overdue.clear()
        heap = self._heap
        while heap and heap[0][0] <= now:
            # All buckets of one expiration tick form a group: the higher levels cascade first,
            # and the entries their cascades displaced go back only once the group is done.
            expiration = heap[0][0]
            displaced: list[Bucket] = []
            while heap and heap[0][0] == expiration:
                bucket = heapq.heappop(heap)[3]
                bucket.expiration = -1
                if bucket.displaced is not None:
                    _restore(bucket)
                if not bucket:
                    continue
                self._advance_clock(expiration)
                entries = list(bucket)
                bucket.clear()
                if bucket.level == 0:
                    due.extend(entries)
                else:
                    self._cascade(entries, due, expiration, displaced)
            for bucket in displaced:
                if bucket.displaced is not None:
                    _restore(bucket)
        self._advance_clock(now)
        for entry in due:
            entry._bucket = None
        self._size -= len(due)
        return due

    # -- internals ----------------------------------------------------------------------------

    def _push(self, bucket: Bucket, expiration: int) -> None:
        # Ties on expiration pop the higher level first: its cascade may return entries due on
        # that very tick, inserted before anything in the level-0 bucket of the same tick.
        self._push_count += 1
        heapq.heappush(self._heap, (expiration, -bucket.level, self._push_count, bucket))

    def _overflow_bucket(self, deadline: int) -> Bucket:
        size = self._wheel_size
        level = 1
        span = size
        while True:
            if level == len(self._levels):
                self._levels.append([Bucket(self, level) for _ in range(size)])
                previous = self._current[level - 1]
                self._current.append(previous - previous % span)
            if deadline < self._current[level] + span * size:
                slot = deadline // span
                bucket = self._levels[level][slot % size]
                expiration = slot * span
                if bucket.expiration != expiration:
                    bucket.expiration = expiration
                    self._push(bucket, expiration)
                return bucket
            level += 1
            span *= size

    def _advance_clock(self, now: int) -> None:
        current = self._current
        if now <= current[0]:
            return
        current[0] = now
        span = self._wheel_size
        for level in range(1, len(current)):
            current[level] = now - now % span
            span *= self._wheel_size

    def _cascade(
        self, entries: list[Any], due: list[Any], tick: int, displaced: list[Bucket]
    ) -> None:
        """Reinsert the entries of a higher-level bucket whose span starts at `tick`.

        For one deadline, an entry inserted later lands in the same or a lower level, so the
        cascades of one tick (highest level first) bring entries in insertion order. Entries
        inserted directly into a target bucket before this tick are younger than all of them:
        the first cascade of the tick into that bucket sets them aside (`Bucket.displaced`), and
        `advance` appends them again once the tick's cascades are over.
        """
        current = self._current[0]
        add = self.add
        for entry in entries:
            deadline = entry._deadline
            if deadline <= current:
                due.append(entry)
                continue
            self._size -= 1  # add() counts it again
            add(entry, deadline)
            bucket = entry._bucket
            assert bucket is not None
            if bucket.cascade_mark != tick:
                bucket.cascade_mark = tick
                if len(bucket) > 1:
                    older = list(bucket)
                    older.pop()
                    bucket.displaced = older
                    displaced.append(bucket)
                    bucket.clear()
                    bucket[entry] = None
        # Entries returned as due are no longer held; advance() subtracts them from the size.


def _deadline_of(entry: Any) -> int:
    deadline: int = entry._deadline
    return deadline


def _restore(bucket: Bucket) -> None:
    """Append the entries a cascade set aside behind the cascaded ones."""
    displaced = bucket.displaced
    assert displaced is not None
    bucket.displaced = None
    bucket.update(dict.fromkeys(displaced))
