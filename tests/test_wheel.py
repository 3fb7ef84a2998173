"""The timing wheel (`purgatory._wheel`): Kafka's ``TimerTaskListTest`` and ``TimingWheelTest``,
ported, then cascades, removal and order. Its model-based test is test_wheel_model.py.

Kafka's wheel works in milliseconds with a ``tickMs``; ours works in integer ticks (the purgatory
converts seconds), so Kafka's ``startMs = 1000, tickMs = 10, wheelSize = 5`` becomes
``TimingWheel(5, start_tick=100)``. Kafka's ``TimerTaskList`` (one bucket) has no public
counterpart: a bucket is reached through ``entry._bucket``, and Kafka's shared task counter is
``len(wheel)``. Kafka's "adding a task to another list removes it from the first" is, in ours,
an explicit O(1) ``remove`` followed by ``add``.
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import weakref
from collections.abc import Callable, Iterable, Iterator

import pytest

from purgatory._wheel import Bucket, TimingWheel
from purgatory.testing._invariants import check_timing_wheel


class Entry:
    """The smallest thing the wheel can hold: the two attributes it owns, and a label."""

    __slots__ = ("_bucket", "_deadline", "name")

    def __init__(self, name: object) -> None:
        self._bucket: Bucket | None = None
        self._deadline = 0
        self.name = name

    def __repr__(self) -> str:
        return f"Entry({self.name!r}, deadline={self._deadline})"


def names(entries: Iterable[Entry]) -> list[object]:
    return [entry.name for entry in entries]


def bucket_size(bucket: Bucket | None) -> int:
    """Kafka's ``size(list)``: the entries of one bucket (0 for "no bucket")."""
    return 0 if bucket is None else len(bucket)


# -- Ported from Kafka's TimerTaskListTest --------------------------------------------------------


def test_timer_task_list_all() -> None:
    """Kafka ``TimerTaskListTest.testAll``: moving entries between buckets keeps the count."""
    wheel = TimingWheel(16, start_tick=0)
    entries = [Entry(i) for i in range(1, 11)]
    for count, entry in enumerate(entries, start=1):
        wheel.add(entry, 10)
        assert len(wheel) == count  # Kafka's shared counter goes up by one per add
    list1 = entries[0]._bucket
    assert list1 is not None
    assert all(entry._bucket is list1 for entry in entries)
    assert bucket_size(list1) == 10

    def move(moved: list[Entry], expiration: int) -> Bucket:
        """Moving entries to another bucket (Kafka: re-adding their tasks) keeps the count."""
        for entry in moved:
            before = len(wheel)
            assert wheel.remove(entry)
            wheel.add(entry, expiration)
            assert len(wheel) == before
        bucket = moved[0]._bucket
        assert bucket is not None
        return bucket

    list2 = move(entries[:4], 11)
    assert list2 is not list1
    assert (bucket_size(list1), bucket_size(list2)) == (6, 4)
    assert len(wheel) == 10

    list3 = move(entries[4:], 12)
    assert (bucket_size(list1), bucket_size(list2), bucket_size(list3)) == (0, 4, 6)
    assert len(wheel) == 10

    # Cancelling the tasks of one list empties that list only (Kafka: task.cancel()).
    for entry in list(list2):
        assert wheel.remove(entry)
    assert (bucket_size(list1), bucket_size(list2), bucket_size(list3)) == (0, 0, 6)
    assert len(wheel) == 6
    for entry in list(list3):
        assert wheel.remove(entry)
    assert (bucket_size(list1), bucket_size(list2), bucket_size(list3)) == (0, 0, 0)
    assert len(wheel) == 0
    assert all(entry._bucket is None for entry in entries)
    # Nothing cancelled ever comes back.
    assert wheel.advance(100) == []
    assert wheel.next_deadline() == math.inf


def test_bucket_delay() -> None:
    """Kafka ``TimerTaskListTest.testGetDelay``: a bucket's delay shrinks as time passes."""
    wheel = TimingWheel(16, start_tick=0)
    entry = Entry("a")
    wheel.add(entry, 10)
    assert wheel.next_deadline() - wheel.current_tick == 10
    assert wheel.advance(5) == []
    assert wheel.current_tick == 5
    assert wheel.next_deadline() - wheel.current_tick == 5


# -- Ported from Kafka's TimingWheelTest (startMs = 1000, tickMs = 10, wheelSize = 5) -------------

START = 100
SIZE = 5


@pytest.fixture
def wheel() -> Iterator[TimingWheel]:
    """A fresh wheel; whatever the test did, it must be left consistent."""
    wheel = TimingWheel(SIZE, start_tick=START)
    yield wheel
    check_timing_wheel(wheel)


def test_add_valid_entry(wheel: TimingWheel) -> None:
    """Kafka ``testAddValidTask``: an entry two ticks out is held in level 0."""
    entry = Entry("a")
    wheel.add(entry, START + 2)
    assert len(wheel) == 1
    assert list(wheel) == [entry]
    assert wheel.levels == 1
    assert wheel.next_deadline() == START + 2
    assert entry._bucket is not None
    assert wheel.advance(START + 1) == []
    assert wheel.advance(START + 2) == [entry]
    assert entry._bucket is None
    assert len(wheel) == 0
    assert wheel.next_deadline() == math.inf


def test_add_expired_entry(wheel: TimingWheel) -> None:
    """Kafka ``testAddExpiredTask`` and ``testAddTaskInCurrentBucket``.

    Kafka's wheel refuses such a task and the caller runs it at once; ours holds it and returns
    it from the very next advance, even one that does not move time.
    """
    past = Entry("past")
    current = Entry("current")
    wheel.add(past, START - 1)
    wheel.add(current, START)
    assert len(wheel) == 2
    assert set(wheel) == {past, current}
    assert wheel.next_deadline() == START  # due now
    assert wheel.advance(START) == [past, current]
    assert wheel.current_tick == START
    assert len(wheel) == 0
    assert wheel.next_deadline() == math.inf


def test_already_due_entries_come_back_in_deadline_order(wheel: TimingWheel) -> None:
    """Already-due entries added latest deadline first still come back in deadline order."""
    late = Entry("late")
    early = Entry("early")
    wheel.add(late, START - 1)
    wheel.add(early, START - 5)
    assert names(wheel.advance(START)) == ["early", "late"]


def test_removed_entry_is_not_returned(wheel: TimingWheel) -> None:
    """Kafka ``testAddCancelledTask``: a cancelled task never runs (ours: remove before due)."""
    entry = Entry("a")
    wheel.add(entry, START + 2)
    assert wheel.remove(entry)
    assert not wheel.remove(entry)
    assert len(wheel) == 0
    assert wheel.advance(START + 10) == []


def test_advance_within_current_tick_keeps_the_clock(wheel: TimingWheel) -> None:
    """Kafka ``testAdvanceClockWithinTick``: time never goes back, nor moves without a tick."""
    assert wheel.advance(START) == []
    assert wheel.current_tick == START
    assert wheel.advance(START - 5) == []
    assert wheel.current_tick == START


def test_advance_to_next_tick(wheel: TimingWheel) -> None:
    """Kafka ``testAdvanceClockToNextTick``."""
    assert wheel.advance(START + 1) == []
    assert wheel.current_tick == START + 1


def test_overflow_wheel_creation(wheel: TimingWheel) -> None:
    """Kafka ``testOverflowWheelCreation``: the first far deadline creates one level, once."""
    assert wheel.levels == 1
    wheel.add(Entry("near"), START + SIZE - 1)  # last tick of level 0
    assert wheel.levels == 1
    wheel.add(Entry("first"), START + SIZE + 1)
    assert wheel.levels == 2
    wheel.add(Entry("second"), START + SIZE + 2)
    assert wheel.levels == 2
    wheel.add(Entry("edge"), START + SIZE)  # just past level 0
    assert wheel.levels == 2
    # Level 1 buckets span SIZE // 2 ticks (half-span levels), so level 1 covers
    # SIZE * (SIZE // 2) ticks from START (a multiple of the span): beyond it, level 2.
    wheel.add(Entry("farther"), START + SIZE * (SIZE // 2))
    assert wheel.levels == 3
    assert wheel.span(1) == SIZE // 2
    assert len(wheel) == 5


def test_advance_with_overflow_wheel(wheel: TimingWheel) -> None:
    """Kafka ``testAdvanceClockWithOverflowWheel``: an overflow entry fires on its own tick."""
    entry = Entry("far")
    deadline = START + SIZE + 1
    wheel.add(entry, deadline)
    assert wheel.levels == 2
    # The overflow bucket is due when its span starts; that cascades, but fires nothing early.
    assert wheel.next_deadline() <= deadline
    assert wheel.advance(START + SIZE) == []
    assert wheel.current_tick == START + SIZE
    assert len(wheel) == 1
    assert wheel.next_deadline() == deadline
    assert wheel.advance(deadline) == [entry]
    assert wheel.current_tick == deadline
    assert len(wheel) == 0


# -- cascades, removal, order ------------------------------------------------------------------


@pytest.mark.parametrize("size", [2, 3, 4, 5, 20, 1024])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("budget", [None, 1, 5])
def test_tick_by_tick_every_entry_fires_on_its_deadline(
    size: int, seed: int, budget: int | None
) -> None:
    """Advancing one tick at a time returns each entry exactly on its deadline, in add order.

    A budget of 1 entry per advance cannot keep up with the 600 entries: the cascades that
    fall behind are finished when their span starts, and nothing is late either way.
    """
    rng = random.Random(seed)
    wheel = TimingWheel(size, start_tick=0)
    entries = [Entry(i) for i in range(600)]
    deadlines = {entry.name: rng.randrange(0, 1500) for entry in entries}
    for entry in entries:
        wheel.add(entry, deadlines[entry.name])
    assert len(wheel) == len(entries)
    pending = len(entries)
    for now in range(0, 1501):
        due = wheel.advance(now, budget)
        expected = [entry.name for entry in entries if deadlines[entry.name] == now]
        assert names(due) == expected, now
        pending -= len(due)
        assert len(wheel) == pending
        assert wheel.current_tick == now
    assert pending == 0
    assert wheel.next_deadline() == math.inf


@pytest.mark.parametrize("size", [2, 3, 4, 5, 20, 1024])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("budget", [None, 1, 7])
def test_random_jumps_return_exactly_what_is_due_in_order(
    size: int, seed: int, budget: int | None
) -> None:
    """Big advances return every due entry once, by (deadline, insertion); nothing early.

    With a `budget`, cascades run in slices across advances, as on the event loop.
    """
    rng = random.Random(seed)
    wheel = TimingWheel(size, start_tick=7)
    order: dict[Entry, int] = {}
    held: set[Entry] = set()
    now = 7
    for step in range(300):
        for _ in range(rng.randrange(4)):
            entry = Entry((step, len(order)))
            deadline = now + rng.choice([0, 1, rng.randrange(50), rng.randrange(5000)])
            wheel.add(entry, deadline)
            order[entry] = len(order)
            held.add(entry)
        if held and rng.random() < 0.2:
            victim = rng.choice(sorted(held, key=order.__getitem__))
            assert wheel.remove(victim)
            assert not wheel.remove(victim)
            held.discard(victim)
        now += rng.choice([0, 1, 2, rng.randrange(100), rng.randrange(3000)])
        due = wheel.advance(now, budget)
        expected = sorted(
            (entry for entry in held if entry._deadline <= now),
            key=lambda entry: (entry._deadline, order[entry]),
        )
        assert due == expected
        held.difference_update(due)
        assert all(entry._bucket is None for entry in due)
        assert all(entry._deadline > now for entry in held)
        assert set(wheel) == held
        assert len(wheel) == len(held)
        if held:
            assert wheel.next_deadline() <= min(entry._deadline for entry in held)
            if budget is None:
                assert wheel.next_deadline() > now
        else:
            assert wheel.next_deadline() == math.inf


@pytest.mark.parametrize("size", [2, 3, 8, 1024])
def test_jumping_to_next_deadline_fires_each_entry_exactly_on_time(size: int) -> None:
    """The reaper's way of driving the wheel: sleep to next_deadline(), advance, repeat."""
    rng = random.Random(size)
    wheel = TimingWheel(size, start_tick=0)
    deadlines = sorted({rng.randrange(1, 100_000) for _ in range(300)} | {1, 2**20})
    entries = [Entry(d) for d in deadlines]
    for entry, deadline in zip(reversed(entries), reversed(deadlines), strict=True):
        wheel.add(entry, deadline)
    fired: list[Entry] = []
    steps = 0
    while len(wheel):
        target = wheel.next_deadline()
        assert isinstance(target, int)
        assert target > wheel.current_tick
        due = wheel.advance(target)
        assert all(entry._deadline == target for entry in due)
        fired.extend(due)
        steps += 1
    assert fired == entries
    # One step per distinct deadline, plus the cascades of the overflow levels.
    assert steps <= len(deadlines) * (wheel.levels + 1)


def test_huge_deadline_with_a_tiny_wheel() -> None:
    wheel = TimingWheel(2, start_tick=0)
    entry = Entry("far")
    wheel.add(entry, 2**40)
    assert wheel.levels == 41
    assert wheel.advance(2**40 - 1) == []
    assert len(wheel) == 1
    assert wheel.advance(2**40) == [entry]
    assert len(wheel) == 0


def test_cascaded_entry_precedes_a_later_direct_insert_on_the_same_tick() -> None:
    """An entry inserted first, while its deadline was in an overflow level, fires first."""
    wheel = TimingWheel(4, start_tick=0)
    first = Entry("first")
    second = Entry("second")
    wheel.add(first, 9)  # level 2: bucket spanning ticks 8..11 (level 1 covers 0..7)
    assert wheel.levels == 3
    assert wheel.advance(6) == []
    wheel.add(second, 9)  # 9 < 6 + 4: straight into level 0
    assert names(wheel.advance(9)) == ["first", "second"]


def test_cascade_and_level0_due_on_the_same_tick_keep_insertion_order() -> None:
    wheel = TimingWheel(4, start_tick=0)
    first = Entry("first")
    second = Entry("second")
    wheel.add(first, 8)  # level 1, span starts at 8: the cascade itself is due on tick 8
    assert wheel.advance(5) == []
    wheel.add(second, 8)  # level 0, also due on tick 8
    assert names(wheel.advance(8)) == ["first", "second"]


def test_cascades_from_two_levels_into_one_tick_keep_insertion_order() -> None:
    """Two overflow buckets of different levels, both starting on tick 27, pour into one bucket.

    ``first`` is added while its deadline (30) is in level 3; after time moves to 23, ``second``
    with the same deadline lands in level 2. Both spans start on tick 27; the cascades must not
    put the later-added entry first.
    """
    wheel = TimingWheel(3, start_tick=0)
    first = Entry("first")
    second = Entry("second")
    wheel.add(first, 30)
    assert wheel.levels == 4
    assert wheel.advance(23) == []
    wheel.add(second, 30)
    assert names(wheel.advance(38)) == ["first", "second"]


def test_direct_inserts_after_a_cascade_go_after_it() -> None:
    wheel = TimingWheel(4, start_tick=0)
    a, b, c = Entry("a"), Entry("b"), Entry("c")
    wheel.add(a, 10)  # level 1
    wheel.add(b, 10)  # level 1
    assert wheel.advance(8) == []  # cascade: a and b move to level 0
    wheel.add(c, 10)
    assert names(wheel.advance(10)) == ["a", "b", "c"]


def test_remove_from_each_kind_of_bucket_is_immediate() -> None:
    """O(1) removal works wherever the entry is: overdue, level 0, overflow, after a cascade."""
    wheel = TimingWheel(4, start_tick=10)
    overdue, near, far, cascaded = Entry("overdue"), Entry("near"), Entry("far"), Entry("c")
    wheel.add(overdue, 10)
    wheel.add(near, 12)
    wheel.add(far, 1000)
    wheel.add(cascaded, 18)
    assert len(wheel) == 4
    assert wheel.remove(overdue)
    assert wheel.remove(far)
    assert len(wheel) == 2
    assert wheel.advance(16) == [near]  # cascades `cascaded` down to level 0
    assert cascaded._bucket is not None
    assert wheel.remove(cascaded)
    assert len(wheel) == 0
    assert wheel.next_deadline() == math.inf
    assert wheel.advance(2000) == []
    for entry in (overdue, near, far, cascaded):
        assert entry._bucket is None
        assert not wheel.remove(entry)


def test_remove_and_re_add_moves_the_entry() -> None:
    """Kafka re-adds a task to move it; ours removes it (O(1)) and adds it again."""
    wheel = TimingWheel(4, start_tick=0)
    entry = Entry("moved")
    other = Entry("other")
    wheel.add(entry, 3)
    wheel.add(other, 3)
    assert wheel.remove(entry)
    wheel.add(entry, 50)
    assert len(wheel) == 2
    assert wheel.advance(3) == [other]
    assert wheel.advance(49) == []
    assert wheel.advance(50) == [entry]
    # An entry returned by advance can be added again (a periodic task).
    wheel.add(entry, 60)
    assert wheel.advance(59) == []
    assert wheel.advance(60) == [entry]


def test_next_deadline_ignores_buckets_emptied_by_removal() -> None:
    wheel = TimingWheel(8, start_tick=0)
    early, late = Entry("early"), Entry("late")
    wheel.add(early, 2)
    wheel.add(late, 5)
    assert wheel.next_deadline() == 2
    assert wheel.remove(early)
    assert wheel.next_deadline() == 5
    assert wheel.remove(late)
    assert wheel.next_deadline() == math.inf


def test_iteration_and_len_cover_every_level() -> None:
    wheel = TimingWheel(3, start_tick=0)
    deadlines = (0, 1, 2, 3, 9, 27, 100, 5000)
    entries = [Entry(deadline) for deadline in deadlines]
    for entry, deadline in zip(entries, deadlines, strict=True):
        wheel.add(entry, deadline)
    assert wheel.levels == 8
    assert len(wheel) == len(entries)
    assert sorted(wheel, key=entries.index) == entries


@pytest.mark.parametrize(("size", "error"), [(1, ValueError), (0, ValueError), (-3, ValueError)])
def test_wheel_size_must_be_at_least_two(size: int, error: type[Exception]) -> None:
    with pytest.raises(error):
        TimingWheel(size)


@pytest.mark.parametrize("size", [2.0, True, "8"])
def test_wheel_size_must_be_an_int(size: object) -> None:
    with pytest.raises(TypeError):
        TimingWheel(size)  # type: ignore[arg-type]


def test_a_cascade_whose_entries_were_all_removed_leaves_nothing_due() -> None:
    """Removing everything mid-cascade: the wheel is empty, and says so."""
    wheel = TimingWheel(4, start_tick=0)
    entries = [Entry(i) for i in range(3)]
    for entry in entries:
        wheel.add(entry, 9)
    assert wheel.advance(6, budget=1) == []  # the cascade of ticks 8..11 is under way
    assert wheel.cascading is not None
    for entry in entries:
        assert wheel.remove(entry)
    assert len(wheel) == 0
    assert wheel.next_deadline() == math.inf
    assert wheel.cascading is None


# -- The bucket an insert remembers --------------------------------------------------------------


def test_a_burst_with_one_deadline_shares_one_bucket_and_comes_back_in_order() -> None:
    wheel = TimingWheel(8, start_tick=0)
    entries = [Entry(i) for i in range(5)]
    for entry in entries:
        assert wheel.add(entry, 3) == 3
    assert {id(entry._bucket) for entry in entries} == {id(entries[0]._bucket)}
    check_timing_wheel(wheel)
    assert names(wheel.advance(3)) == [0, 1, 2, 3, 4]


def test_the_remembered_bucket_is_not_used_once_level_zero_covers_the_deadline() -> None:
    """An overflow bucket's range shrinks as level 0 grows into it: a deadline level 0 now
    covers goes to level 0, not to the bucket the previous insert chose."""
    wheel = TimingWheel(8, start_tick=0)  # level 1: spans of 4 ticks, level 0 covers 8 ticks
    wheel.add(Entry("zeroth"), 13)  # creates level 1
    first = Entry("first")
    wheel.add(first, 13)  # level 1, bucket [12, 16), due at its cascade, tick 8
    assert first._bucket is not None
    assert first._bucket.level == 1
    wheel.advance(6)  # level 0 now covers [6, 14): 12 and 13 are level 0's, 14 and 15 still not
    second = Entry("second")
    assert wheel.add(second, 12) == 12
    assert second._bucket is not None
    assert second._bucket.level == 0
    third = Entry("third")
    wheel.add(third, 15)
    assert third._bucket is first._bucket
    check_timing_wheel(wheel)
    assert names(wheel.advance(20)) == ["second", "zeroth", "first", "third"]


def test_a_bucket_dropped_as_empty_is_not_reused_without_being_scheduled_again() -> None:
    """A bucket emptied by removals is dropped when the wheel looks for its next deadline; an
    insert for the same tick afterwards must schedule it again, not reuse it silently."""
    wheel = TimingWheel(8, start_tick=0)
    gone = Entry("gone")
    wheel.add(gone, 5)
    assert wheel.remove(gone)
    assert wheel.next_deadline() == math.inf  # the empty bucket is dropped here
    back = Entry("back")
    assert wheel.add(back, 5) == 5
    assert wheel.next_deadline() == 5
    check_timing_wheel(wheel)
    assert names(wheel.advance(5)) == ["back"]


def test_the_queue_and_the_ticks_read_as_the_reference_keeps_them() -> None:
    """The native wheel keeps its queue of buckets by due tick and each level's ticks as C data;
    what Python reads of them (`_heap`, `_current`, `_spans`, `_leads`: the invariant check and
    the gauge read them) is the reference's, the queue in heapq's order of (due tick, -level,
    push count, bucket). The figures are the pure module's own."""
    wheel = TimingWheel(4, start_tick=0)
    for name, deadline in (("a", 3), ("b", 9), ("c", 2), ("d", 40), ("e", 9), ("f", 1)):
        wheel.add(Entry(name), deadline)

    def queue() -> list[tuple[int, int, int, int]]:
        return [
            (tick, level, count, bucket.expiration) for tick, level, count, bucket in wheel._heap
        ]

    assert (wheel._spans, wheel._leads, wheel._current) == (
        [1, 2, 4, 8, 16],
        [0, 2, 4, 8, 16],
        [0] * 5,
    )
    assert queue() == [(1, 0, 5, 1), (2, 0, 3, 2), (3, 0, 1, 3), (16, -4, 4, 32), (4, -2, 2, 8)]
    assert names(wheel.advance(2)) == ["f", "c"]
    assert wheel._current == [2, 2, 0, 0, 0]
    assert queue() == [(3, 0, 1, 3), (4, -2, 2, 8), (16, -4, 4, 32)]
    assert names(wheel.advance(9, budget=None)) == ["a", "b", "e"]
    assert wheel._current == [9, 8, 8, 8, 0]
    assert queue() == [(16, -4, 4, 32)]
    check_timing_wheel(wheel)


# -- Identity: the wheel never calls an entry's __hash__ or __eq__ ------------------------------


class Unhashed(Entry):
    """An entry whose ``__hash__`` and ``__eq__`` fail the test if anything calls them: the
    wheel holds entries by identity (Kafka's ``TimerTaskList``), never by their own code."""

    __slots__ = ()

    def __hash__(self) -> int:
        raise AssertionError(f"the wheel hashed {self!r}")

    def __eq__(self, other: object) -> bool:
        raise AssertionError(f"the wheel compared {self!r}")


@pytest.mark.parametrize("budget", [None, 1])
def test_no_entry_is_hashed_or_compared_by_add_remove_cascade_or_advance(
    budget: int | None,
) -> None:
    """(The test itself compares entries by their names and ids only.)"""
    wheel = TimingWheel(4, start_tick=10)
    deadlines = [10, 9, 11, 12, 12, 13, 18, 18, 25, 40, 40, 90, 300, 1000, 1000]
    entries = [Unhashed(i) for i in range(len(deadlines))]
    for entry, deadline in zip(entries, deadlines, strict=True):
        wheel.add(entry, deadline)  # overdue, level 0, the memo's bucket, overflow levels
    assert len(wheel) == len(entries)
    assert sorted(names(wheel)) == names(entries)  # type: ignore[type-var]
    check_timing_wheel(wheel)
    removed = [entries[i] for i in (1, 4, 7, 10, 13)]  # one of each kind of bucket
    for entry in removed:
        assert wheel.remove(entry)
        assert not wheel.remove(entry)
    wheel.add(removed[0], 11)  # back again, after the entry already at 11
    check_timing_wheel(wheel)
    due: list[Entry] = []
    tick = 10
    while wheel.next_deadline() != math.inf:
        tick = max(tick, int(wheel.next_deadline()))
        due += wheel.advance(tick, budget)  # cascades, whole or a slice per call
        check_timing_wheel(wheel)
    assert len(wheel) == 0
    # deadline order, insertion order within a tick
    assert names(due) == [0, 2, 1, 3, 5, 6, 8, 9, 11, 12, 14]
    assert all(entry._bucket is None for entry in entries)


def test_a_bucket_holds_entries_by_identity_in_insertion_order() -> None:
    """The bucket protocol, the same on both builds: ``bucket[id(entry)] = entry`` adds,
    ``bucket.remove(entry)`` takes out (and clears ``_bucket``), ``len`` and iteration see the
    entries in insertion order."""
    wheel = TimingWheel(8, start_tick=0)
    first, second, third = Unhashed("first"), Unhashed("second"), Unhashed("third")
    wheel.add(first, 3)
    bucket = first._bucket
    assert bucket is not None
    for entry in (second, third):  # the memo protocol's inline add
        entry._deadline = 3
        bucket[id(entry)] = entry
        entry._bucket = bucket
    bucket[id(second)] = second  # held already: it keeps its place
    assert (len(bucket), list(bucket)) == (3, [first, second, third])
    assert id(second) in bucket
    bucket.remove(second)
    assert second._bucket is None
    assert (len(bucket), list(bucket)) == (2, [first, third])
    with pytest.raises(KeyError):
        bucket.remove(second)
    check_timing_wheel(wheel)
    assert names(wheel.advance(3)) == ["first", "third"]
    assert len(bucket) == 0
    assert not bucket


def test_a_wheel_dropped_mid_cascade_lets_go_of_every_entry() -> None:
    """Every reference a bucket holds is a strong one that the collector sees: a wheel dropped
    in the middle of a cascade (entries in its buckets, their older parts and its cascade's
    list) is collected with its entries, and nothing is freed while it is still held."""

    class Tracked(Entry):
        __slots__ = ("__weakref__",)

    wheel = TimingWheel(4, start_tick=0)
    entries = [Tracked(i) for i in range(9)]
    for entry in entries:
        wheel.add(entry, 8 + entry.name % 3 if entry.name < 6 else 1000)  # type: ignore[operator]
    assert wheel.advance(6, budget=2) == []
    assert wheel.cascading is not None  # two of its four moved to an older part, two to go
    refs = [weakref.ref(entry) for entry in entries]
    del entries, entry
    gc.collect()
    assert all(ref() is not None for ref in refs)
    check_timing_wheel(wheel)
    del wheel
    gc.collect()
    assert [ref() for ref in refs] == [None] * len(refs)


class Meddler:
    """An entry (not an operation) whose ``_bucket`` is a property: the wheel's every write of
    it runs `action` once, code of the entry's own in the middle of the wheel's step."""

    __slots__ = ("_deadline", "_held", "action", "name")

    def __init__(self, name: object) -> None:
        self._held: Bucket | None = None
        self._deadline = 0
        self.name = name
        self.action: Callable[[], object] | None = None

    @property
    def _bucket(self) -> Bucket | None:
        return self._held

    @_bucket.setter
    def _bucket(self, value: Bucket | None) -> None:
        self._held = value
        action, self.action = self.action, None
        if action is not None:
            action()

    def __repr__(self) -> str:
        return f"Meddler({self.name!r}, deadline={self._deadline})"


def test_an_entry_that_changes_the_wheel_as_it_is_given_back_or_cascaded() -> None:
    """Code run by an entry's own ``_bucket`` setter takes other entries out and adds new ones
    while `advance` hands entries back and while a cascade moves them: both builds end in the
    same place, and the wheel is consistent."""
    wheel = TimingWheel(4, start_tick=0)
    a, b, c, d, late = (Meddler(name) for name in ("a", "b", "c", "d", "late"))
    fresh = [Meddler("fresh0"), Meddler("fresh1")]
    for entry, deadline in ((a, 2), (b, 2), (c, 9), (d, 9), (late, 40)):
        wheel.add(entry, deadline)
    b.action = lambda: (wheel.remove(c), wheel.add(fresh[0], 2))  # as b is given back
    assert names(wheel.advance(2)) == ["a", "b"]
    assert (c._bucket, len(wheel)) == (None, 3)
    d.action = lambda: (wheel.remove(late), wheel.add(fresh[1], 9))  # as d is cascaded
    assert names(wheel.advance(6)) == ["fresh0"]
    check_timing_wheel(wheel)
    assert names(wheel.advance(9)) == ["d", "fresh1"]
    assert len(wheel) == 0
    assert wheel.next_deadline() == math.inf
    check_timing_wheel(wheel)


def test_an_entry_released_by_a_bucket_may_add_to_it_again() -> None:
    """A bucket dropped with its wheel releases its entries one at a time; a ``__del__`` run by
    a release that adds to the same bucket finds it whole, and what it adds is released too."""
    added: list[str] = []

    class Haunting(Entry):
        __slots__ = ("__weakref__", "target")

        def __init__(self, name: str) -> None:
            super().__init__(name)
            self.target: Bucket | None = None

        def __del__(self) -> None:
            target = self.target
            if target is not None and not added:
                added.append(self.name)  # type: ignore[arg-type]
                ghost = Entry("ghost")
                target[id(ghost)] = ghost
                ghost._bucket = target

    wheel = TimingWheel(4, start_tick=0)
    first, second = Haunting("first"), Haunting("second")
    wheel.add(first, 3)
    wheel.add(second, 3)
    bucket = first._bucket
    assert bucket is not None
    first.target = bucket
    second._bucket = first._bucket = None  # (only the bucket holds them now)
    ref = weakref.ref(second)
    del first, second
    bucket.clear()
    assert added == ["first"]
    assert ref() is None
    assert names(bucket) == ["ghost"]
    bucket.clear()
    assert len(bucket) == 0


def test_a_cascade_target_taken_out_of_the_wheel_as_its_older_part_is_made() -> None:
    """A cascade moves an entry into the older part of its bucket one level down, making the part
    if the bucket has none: ``Bucket(wheel, level)``, Python code (the bucket's ``__init__``, or
    a collection it starts). Here that code takes the target bucket out of its level and out of
    the wheel's queue, the two that held it. The reference holds the target in a local; the
    native wheel once borrowed it across the making (a use after free: run under
    ``PYTHONMALLOC=debug`` or AddressSanitizer to see it) and holds it now."""
    wheel = TimingWheel(4, start_tick=0)
    entry = Entry("moved")
    wheel.add(entry, 9)  # level 2 (8..11), cascaded into level 1's slot 0 (8..9) at tick 4
    assert wheel.levels == 3
    original_init = Bucket.__init__
    taken: list[int] = []

    def meddling_init(self: Bucket, owner: TimingWheel, level: int) -> None:
        target = wheel._levels[1][0]
        if not taken and target.expiration == 8 and target.older is None:
            taken.append(id(target))
            wheel._levels[1][0] = Bucket(wheel, 1)
            queue = [item for item in wheel._heap if item[3] is not target]
            heapq.heapify(queue)
            wheel._heap = queue
            del target
        original_init(self, owner, level)

    Bucket.__init__ = meddling_init  # type: ignore[method-assign,assignment]
    try:
        assert wheel.advance(6) == []
    finally:
        Bucket.__init__ = original_init  # type: ignore[method-assign]
    assert len(taken) == 1
    # Where the entry is now differs: the native wheel's queue is its own, the reference's
    # advance goes on with the list it read before `_heap` was assigned (which still has the
    # target, cascaded on). In both it is held by the bucket it says, and leaves it.
    part = entry._bucket
    assert part is not None
    assert [e for e in part if e is entry] == [entry]
    part.remove(entry)
    assert entry._bucket is None
    assert wheel.advance(12) == []
