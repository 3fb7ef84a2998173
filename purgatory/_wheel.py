"""A hierarchical timing wheel: O(1) insert and cancel, buckets that expire together.

Theory of operation
-------------------
Time is counted in integer *ticks*; the caller converts seconds to ticks (rounding deadlines up,
so nothing ever fires early) and passes the current tick to `TimingWheel.advance`. The wheel
itself never reads a clock.

Level 0 has ``wheel_size`` buckets of one tick each and covers the ticks
``[current, current + wheel_size)``. An entry whose deadline falls there goes straight into the
bucket of its tick, so every entry of a level-0 bucket has the same deadline. A later deadline
goes to an *overflow* level, created on demand (Kafka's ``TimingWheel``), so the structure grows
with the longest timeout, not with the number of entries.

Buckets are not scanned tick by tick. A bucket enters a small heap when it goes from unused to
used; `advance` pops due buckets in order, which is why an idle wheel costs nothing and a sparse
one costs one pop per non-empty bucket (Kafka's ``DelayQueue`` of ``TimerTaskList``). A due
level-0 bucket is returned whole.

Cascades, in slices. The entries of a higher-level bucket must be *cascaded* (reinserted one
level down) before the first of them is due. Kafka does it at the start of the bucket's span, all
at once: with a million pending operations that is a stall of a quarter of a second, and every
expiry due meanwhile is late by as much. Here the buckets of level ``k >= 1`` span ``f ** k``
ticks with ``f = wheel_size // 2`` (for sizes >= 4), half of what level ``k - 1`` covers, so the
level below can take a bucket's whole span one span *before* it starts. The cascade becomes due
then, and a driver that passes a *budget* to `advance` moves that many entries per call and gets
the rest on its next calls (`next_deadline` says "now" until it is done): the work is spread over
a whole span of ticks. A cascade still unfinished when its span starts, or when another cascade
falls due, is finished at once; without a budget every cascade runs whole. Sizes 2 and 3 cannot
spare the room and cascade the classic way, at the start of the span.

Order. Due entries come back in deadline order and, within one tick, in insertion order. For one
deadline, an entry in a higher level was inserted before every entry of a lower level (its
deadline was farther away when it came), so cascaded entries go to a bucket's *older* part,
which is returned (or cascaded) before the entries inserted into the bucket directly; cascades
run one at a time, oldest first.

Cancel is O(1): every bucket (and older part) holds its entries in insertion order, and every
entry knows which one holds it, so removing one is a single step and a cancelled entry never pins
memory until its deadline (the classic purgatory leak).

Identity. A bucket holds its entries by identity (Kafka's ``TimerTaskList``, a linked list of
entries), never by their ``__hash__`` or ``__eq__``: an entry is usually an operation of a user's
class, whose hash is user code (a class may even assign one after its first watch), and the wheel
runs in the middle of the purgatory's own steps. So neither the wheel nor its owner ever calls an
entry's code. Here a bucket is an insertion-ordered ``dict`` keyed by ``id(entry)`` (an int, whose
hash is the interpreter's), the entry its value; the native core keeps it as an intrusive doubly
linked list through the operation's C layout.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from ._impl import native, twin

__all__ = ("Bucket", "TimerEntry", "TimingWheel")


class _BucketCore(dict[Any, Any]):
    """A bucket's fields and its protocol in pure Python: a ``dict`` keyed by ``id(entry)``
    (the native class has them as a C layout and a C list: `purgatory._impl`)."""

    __slots__ = ("expiration", "level", "older", "wheel")

    def __iter__(self) -> Iterator[Any]:
        """The entries, in insertion order (not their ids: the keys are this module's)."""
        return iter(self.values())

    def remove(self, entry: TimerEntry) -> None:
        """Take `entry`, which this bucket holds, out of it and out of the wheel: the removal
        protocol's one step (Kafka's ``TimerTaskList.remove``), which also sets its ``_bucket``
        to ``None``. O(1); ``KeyError`` if the bucket does not hold it."""
        del self[id(entry)]
        entry._bucket = None


class _WheelCore:
    """A wheel's fields (the native class has them as a C layout: `purgatory._impl`)."""

    __slots__ = (
        "_active",
        "_current",
        "_heap",
        "_lead1",
        "_leads",
        "_levels",
        "_limit1",
        "_memo_until",
        "_overdue",
        "_push_count",
        "_slots1",
        "_span1",
        "_spans",
        "_todo",
        "_todo_done",
        "_wheel_size",
        "memo_bucket",
        "memo_due",
        "memo_high",
        "memo_low",
    )


@final
class Bucket(_BucketCore):
    """The entries of one wheel slot, by identity, in insertion order (Kafka's ``TimerTaskList``).

    The bucket protocol, the same on both builds: ``len(bucket)`` and iteration (the entries, in
    insertion order); ``bucket[id(entry)] = entry``, then ``entry._bucket = bucket``, adds an
    entry (the wheel's add, and the memo protocol's: see `TimingWheel`); ``bucket.remove(entry)``
    takes one out and sets its ``_bucket`` to ``None``. The pure build's bucket is a ``dict``
    keyed by ``id(entry)`` (an int: its hash and equality are the interpreter's, never the
    entry's), so that the hot paths add with plain subscript syntax; the native build's is an
    intrusive C list through the operations' own layout, which takes an entry under its own id
    only and gives entries back by `remove` only (no ``del bucket[key]``).
    """

    __slots__ = ()

    # Hashed by identity (the pure build's is a dict): buckets are keys nowhere, but it says so.
    __hash__ = object.__hash__  # type: ignore[assignment]

    def __init__(self, wheel: TimingWheel, level: int) -> None:
        super().__init__()
        self.wheel: Final = wheel
        self.level: Final = level
        # The first tick of the bucket's span while it is in use, else -1.
        self.expiration = -1
        # Entries cascaded into this slot, all older than the ones added to it directly.
        self.older: Bucket | None = None

    def __repr__(self) -> str:
        return f"<Bucket level={self.level} expiration={self.expiration} size={len(self)}>"


class TimerEntry(Protocol):
    """What the wheel needs of an entry: two writable attributes it owns.

    An entry leaves the wheel when `advance` returns it or when it is removed, by `remove` or,
    on a hot path that has the bucket at hand, by the bucket's own step:
    ``entry._bucket.remove(entry)`` (`Bucket.remove`, which sets ``_bucket`` to ``None``).
    Nothing else may write either attribute, and the wheel keeps no count that such a removal
    would leave wrong. The wheel holds an entry by identity: its ``__hash__`` and ``__eq__``, if
    it has any of its own, are never called.
    """

    _bucket: Bucket | None
    _deadline: int


@final
class TimingWheel(_WheelCore):
    """Entries keyed by an integer deadline tick, returned in order once the tick has come.

    Args:
        wheel_size: Buckets per level (>= 2). Wider means rarer, smaller cascades for a little
            more memory (one empty bucket per slot).
        start_tick: The tick the wheel starts at; deadlines at or before it are already due.
    """

    __slots__ = ()

    #: The class of the wheel's buckets (the native wheel's are the native `Bucket`).
    _Bucket: type[Bucket] = Bucket

    def __init__(self, wheel_size: int, start_tick: int = 0) -> None:
        if isinstance(wheel_size, bool) or not isinstance(wheel_size, int):
            raise TypeError(f"wheel_size must be an int, got {wheel_size!r}")
        if wheel_size < 2:
            raise ValueError(f"wheel_size must be at least 2, got {wheel_size!r}")
        self._wheel_size = wheel_size
        # Per level: ticks per bucket, and how long before its span a bucket's cascade is due.
        self._spans: list[int] = [1]
        self._leads: list[int] = [0]
        # _current[i] is the current tick truncated to level i's bucket span.
        self._current: list[int] = [start_tick]
        self._levels: list[list[Bucket]] = [[self._Bucket(self, 0) for _ in range(wheel_size)]]
        # (due tick, -level, push count, bucket): ties pop the older (higher-level) bucket first.
        self._heap: list[tuple[int, int, int, Bucket]] = []
        self._overdue = self._Bucket(self, -1)
        self._push_count = 0
        # The cascade in progress: its bucket, its entries as they were, how many are done.
        self._active: Bucket | None = None
        self._todo: list[Any] = []
        self._todo_done = 0
        # The first overflow level, for `add`'s inlined path: its span, lead and buckets, and
        # the first tick past what it covers (0 until it exists: nothing is below that).
        self._span1 = 1
        self._lead1 = 0
        self._slots1: list[Bucket] = []
        self._limit1 = 0
        #: The bucket the last `add` chose (`memo_bucket`), the deadlines [`memo_low`,
        #: `memo_high`) for which `add` would choose it again, and its due tick (`memo_due`):
        #: entries come in bursts with one deadline (or one span). The choice holds until the
        #: current tick reaches `_memo_until` (the bucket falls due, or level 0 grows into the
        #: range), or the bucket is dropped (`_forget_memo`). Empty at first. The memo protocol:
        #: these four are public, read-only, so that an owner's add on a hot path (the timer's)
        #: may take the memo's path inline, as `add` does first: for a deadline in the range,
        #: ``entry._deadline = deadline``, ``memo_bucket[id(entry)] = entry``, ``entry._bucket =
        #: memo_bucket``, due at `memo_due`.
        self.memo_low = 0
        self.memo_high = 0
        self._memo_until = 0
        self.memo_bucket = self._overdue
        self.memo_due = 0

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

    @property
    def cascading(self) -> Bucket | None:
        """The bucket whose cascade is under way, if one is."""
        return self._active

    def __len__(self) -> int:
        """Entries held, overdue ones included. Runtime complexity: O(buckets).

        The wheel keeps no count of its own, because its entries may leave it without it (see
        `TimerEntry`): a driver that needs the count on a hot path keeps it itself.
        """
        return sum(len(bucket) for bucket in self.buckets())

    def __iter__(self) -> Iterator[Any]:
        """Every entry held, in no particular order (for shutdown and invariant checks)."""
        for bucket in self.buckets():
            yield from bucket

    def buckets(self) -> Iterator[Bucket]:
        """Every bucket and older part, the overdue bucket first (for invariant checks)."""
        yield self._overdue
        for level in self._levels:
            for bucket in level:
                if bucket.older is not None:
                    yield bucket.older
                yield bucket

    def span(self, level: int) -> int:
        """Ticks covered by one bucket of `level`."""
        return self._spans[level]

    def due_tick(self, bucket: Bucket) -> int:
        """The tick at which `advance` takes `bucket` up: its own tick, or its cascade's."""
        return bucket.expiration - self._leads[bucket.level]

    def next_deadline(self) -> float:
        """The tick at which `advance` next has work, or ``math.inf`` if nothing is held.

        This is the earliest non-empty bucket's tick, which for a higher level is when its
        cascade is due, so it is never later than the earliest deadline; the current tick while
        a cascade is under way. Runtime complexity: O(1) amortised (buckets emptied by cancels
        are dropped here).
        """
        if self._overdue:
            return self._current[0]
        active = self._active
        if active is not None:
            if active or active.older:  # what is left to cascade is still in its bucket
                return self._current[0]
            self._end_cascade()  # everything it had left was removed meanwhile
        heap = self._heap
        while heap:
            bucket = heap[0][3]
            if bucket or bucket.older:
                return heap[0][0]
            heapq.heappop(heap)
            bucket.expiration = -1
            self._forget_memo()
        return math.inf

    def peek_next_deadline(self) -> float:
        """`next_deadline`, reading only (it leaves emptied buckets in the heap): for a gauge
        read from another thread. Runtime complexity: O(buckets in use)."""
        current = self._current[0]
        if self._overdue:
            return current
        active = self._active
        if active is not None and (active or active.older):
            return current
        used = (item[0] for item in list(self._heap) if item[3] or item[3].older)
        return min(used, default=math.inf)

    # -- mutation -----------------------------------------------------------------------------

    def add(self, entry: TimerEntry, deadline: int) -> int:
        """Hold `entry` until `deadline` (a tick). A deadline already reached is due next advance.

        Returns:
            The tick by which `advance` must next be called for the entry (its deadline, or when
            its bucket's cascade is due); a driver that sleeps compares it with its alarm.

        Runtime complexity: O(1) (O(levels) for deadlines beyond level 0, and a heap push of
        O(log buckets) when the bucket was unused).
        """
        entry._deadline = deadline
        if self.memo_low <= deadline < self.memo_high:  # the last add's bucket
            bucket = self.memo_bucket
            bucket[id(entry)] = entry
            entry._bucket = bucket
            return self.memo_due
        current = self._current[0]
        if deadline <= current:
            bucket = self._overdue
            due = current
        elif deadline < current + self._wheel_size:
            bucket = self._levels[0][deadline % self._wheel_size]
            if bucket.expiration != deadline:
                bucket.expiration = deadline
                self._push(bucket, deadline)
            due = deadline
            self.memo_low = deadline
            self.memo_high = deadline + 1
            self._memo_until = deadline
            self.memo_bucket = bucket
            self.memo_due = due
        elif deadline < self._limit1:
            # The first overflow level, inlined: request timeouts (seconds) all land here.
            span = self._span1
            slot = deadline // span
            bucket = self._slots1[slot % self._wheel_size]
            start = slot * span
            due = start - self._lead1
            if bucket.expiration != start:
                bucket.expiration = start
                self._push(bucket, due)
            # The deadlines this level puts in this bucket: level 0 takes those below `low`, and
            # will take `low` itself once the current tick passes `low - wheel_size`.
            size = self._wheel_size
            low = current + size
            if start > low:  # noqa: PLR1730 - cheaper than max() on the insert path
                low = start
            self.memo_low = low
            high = start + span
            self.memo_high = high if high < self._limit1 else self._limit1
            until = low - size + 1
            self._memo_until = due if due < until else until
            self.memo_bucket = bucket
            self.memo_due = due
        else:
            bucket, due = self._overflow_bucket(deadline)
        bucket[id(entry)] = entry
        entry._bucket = bucket
        return due

    def _forget_memo(self) -> None:
        """The wheel is changing: the last add's choice of bucket may no longer hold."""
        self.memo_high = self.memo_low

    def remove(self, entry: TimerEntry) -> bool:
        """Stop holding `entry`; ``False`` if it was not held. Runtime complexity: O(1)."""
        bucket = entry._bucket
        if bucket is None:
            return False
        bucket.remove(entry)
        return True

    def advance(self, now: int, budget: int | None = None) -> list[Any]:
        """Move to tick `now` and return the entries due by then, no longer held.

        Entries come in deadline order, and in insertion order within a tick. Time never goes
        back: a `now` before the current tick only returns the overdue entries.

        Args:
            now: The current tick.
            budget: At most this many entries of a cascade that is not yet urgent are moved in
                this call (the rest on later calls); ``None`` runs every cascade whole.

        Runtime complexity: O(due entries + due buckets * log buckets), plus O(entries cascaded).
        """
        if now >= self._memo_until:  # the last add's choice no longer holds
            self.memo_high = self.memo_low
        due: list[Any] = []
        overdue = self._overdue
        if overdue:  # taken out, then sorted (stable: insertion order within a tick)
            due.extend(overdue.values())
            overdue.clear()
            due.sort(key=_deadline_of)
        active = self._active
        if active is not None and (budget is None or now >= active.expiration):
            self._cascade(None, due)
        heap = self._heap
        while heap and heap[0][0] <= now:
            tick, _, _, bucket = heap[0]
            active = self._active
            if active is not None and (bucket.level or tick >= active.expiration):
                # A cascade is due, or a tick the one under way pours into: finish it first.
                self._cascade(None, due)
                continue
            heapq.heappop(heap)
            older = bucket.older
            if not bucket and not older:
                bucket.expiration = -1
                continue
            self._advance_clock(tick)
            if bucket.level:
                self._start_cascade(bucket)
                if budget is None or now >= bucket.expiration:
                    self._cascade(None, due)
                continue
            bucket.expiration = -1
            if older:
                due.extend(older.values())
                older.clear()
            due.extend(bucket.values())
            bucket.clear()
        self._advance_clock(now)
        if self._active is not None and budget is not None:
            self._cascade(budget, due)
        for entry in due:
            entry._bucket = None
        return due

    def _check(self) -> None:
        """Raise ``AssertionError`` if the wheel is inconsistent, whatever its entries are.

        Checked: every entry sits in the bucket (or older part) it points to, once, inside that
        bucket's span, and is not yet due (overdue ones excepted); the size counter matches;
        every non-empty bucket is in the heap at its due tick or is the cascade under way.
        """
        held = 0
        current = self.current_tick
        seen: set[int] = set()
        for level, slots in enumerate(self._levels):
            span = self._spans[level]
            for bucket in slots:
                parts = [bucket] if bucket.older is None else [bucket.older, bucket]
                for part in parts:
                    assert part.level == level
                    assert part.wheel is self
                    for entry in part:
                        held += 1
                        assert id(entry) not in seen, f"{entry!r} held twice"
                        seen.add(id(entry))
                        assert entry._bucket is part, f"{entry!r} is in a bucket it does not name"
                        assert bucket.expiration <= entry._deadline < bucket.expiration + span, (
                            f"{entry!r} deadline {entry._deadline} outside {bucket!r}"
                        )
                        assert entry._deadline > current, f"{entry!r} is due but still held"
                if bucket or bucket.older:
                    assert bucket.expiration > current, f"{bucket!r} is due but not flushed"
                    assert bucket is self._active or any(
                        item[3] is bucket and item[0] == self.due_tick(bucket)
                        for item in self._heap
                    ), f"{bucket!r} not in the heap"
        if self.memo_low < self.memo_high:  # the last add's choice still holds
            memo = self.memo_bucket
            assert memo.level >= 0, "the memo names the overdue bucket"
            start = memo.expiration
            assert current < self.memo_low, "the memo covers ticks already due"
            assert start <= self.memo_low, f"the memo starts before {memo!r}"
            assert self.memo_high <= start + self._spans[memo.level], f"memo beyond {memo!r}"
            assert self.memo_due == self.due_tick(memo), f"memo due tick wrong for {memo!r}"
            assert current < self._memo_until <= self.memo_low, "memo outlives its range"
            if memo.level:
                assert current + self._wheel_size <= self.memo_low, "level 0 took the memo's"
        for entry in self._overdue:
            held += 1
            assert entry._bucket is self._overdue
            assert entry._deadline <= current, f"overdue {entry!r} is not due"
        assert held == len(self), f"{len(self)} entries counted, {held} held"

    # -- internals ----------------------------------------------------------------------------

    def _push(self, bucket: Bucket, tick: int) -> None:
        self._push_count += 1
        heapq.heappush(self._heap, (tick, -bucket.level, self._push_count, bucket))

    def _add_level(self) -> None:
        size = self._wheel_size
        level = len(self._levels)
        # Half-span levels (see the module docstring) need room: sizes 2 and 3 go classic.
        factor = size // 2 if size >= 4 else size
        span = self._spans[-1] * factor
        self._spans.append(span)
        self._leads.append(span if size >= 4 else 0)
        self._levels.append([self._Bucket(self, level) for _ in range(size)])
        previous = self._current[-1]
        self._current.append(previous - previous % span)
        if level == 1:
            self._span1 = span
            self._lead1 = self._leads[1]
            self._slots1 = self._levels[1]
            self._limit1 = self._current[1] + span * size

    def _overflow_bucket(self, deadline: int) -> tuple[Bucket, int]:
        """The bucket of the lowest overflow level that covers `deadline`, and its due tick."""
        size = self._wheel_size
        level = 1
        while True:
            if level == len(self._levels):
                self._add_level()
            span = self._spans[level]
            if deadline < self._current[level] + span * size:
                slot = deadline // span
                bucket = self._levels[level][slot % size]
                start = slot * span
                due = start - self._leads[level]
                if bucket.expiration != start:
                    bucket.expiration = start
                    self._push(bucket, due)
                return bucket, due
            level += 1

    def _advance_clock(self, now: int) -> None:
        current = self._current
        if now <= current[0]:
            return
        current[0] = now
        spans = self._spans
        for level in range(1, len(current)):
            current[level] = now - now % spans[level]
        if len(current) > 1:
            self._limit1 = current[1] + self._span1 * self._wheel_size

    def _start_cascade(self, bucket: Bucket) -> None:
        """Make `bucket` the cascade under way; what it holds now is what the cascade moves."""
        older = bucket.older
        todo = list(older.values()) if older else []
        todo.extend(bucket.values())
        self._active = bucket
        self._todo = todo
        self._todo_done = 0

    def _cascade(self, limit: int | None, due: list[Any]) -> None:
        """Move up to `limit` (``None``: all) entries of the cascade under way one level down.

        Every entry goes to the older part of its bucket one level down, whose span the level
        covers while the cascade runs (see the module docstring); doing it by one rule for the
        whole cascade keeps the entries of one deadline together whenever it is interrupted.
        Entries removed since the cascade started are skipped.
        """
        bucket = self._active
        assert bucket is not None
        older = bucket.older
        todo = self._todo
        begin = self._todo_done
        end = len(todo) if limit is None else min(len(todo), begin + limit)
        level = bucket.level - 1
        slots = self._levels[level]
        span = self._spans[level]
        lead = self._leads[level]
        size = self._wheel_size
        current = self._current[0]
        for index in range(begin, end):
            entry = todo[index]
            source: Bucket | None = entry._bucket
            if source is None or (source is not bucket and source is not older):
                continue  # removed (and maybe added elsewhere) since the cascade started
            del source[id(entry)]  # (a set-up native wheel never runs this: its advance is C)
            deadline = entry._deadline
            if deadline <= current:
                due.append(entry)  # a late classic cascade (sizes 2 and 3)
                continue
            slot = deadline // span
            target = slots[slot % size]
            start = slot * span
            if target.expiration != start:
                target.expiration = start
                self._push(target, start - lead)
            part = target.older
            if part is None:
                part = target.older = self._Bucket(self, level)
            part[id(entry)] = entry
            entry._bucket = part
        self._todo_done = end
        if end == len(todo):
            self._end_cascade()

    def _end_cascade(self) -> None:
        bucket = self._active
        assert bucket is not None
        self._active = None
        self._todo = []
        bucket.expiration = -1
        self._forget_memo()


def _deadline_of(entry: Any) -> int:
    deadline: int = entry._deadline
    return deadline


_PyBucket = Bucket
_PyTimingWheel = TimingWheel
"""The reference, whole in every process: the pure wheel makes `_PyBucket`s. Where the core is
built, `Bucket` and `TimingWheel` are the native classes (a bucket an intrusive C list, the
wheel's heap and ticks C data), made from these by `purgatory._impl.twin`."""

if not TYPE_CHECKING and native is not None:
    Bucket = twin(_PyBucket, native.BucketCore)
    # The heap and the ticks are C data: every method that changes them is native.
    _OWNERS = ("_push", "_add_level", "_advance_clock")
    TimingWheel = twin(
        _PyTimingWheel,
        native.WheelCore,
        hot=("add", "remove", "advance", "next_deadline", *_OWNERS),
        _Bucket=Bucket,
    )
