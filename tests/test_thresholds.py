"""Threshold watchers (`purgatory._thresholds`): a trigger that carries the value reached re-tries
only what can complete."""

from __future__ import annotations

import asyncio
import gc
import math
import random
import threading
import weakref
from collections.abc import Hashable
from typing import Any

import pytest
from helpers import FlagOperation, manual_purgatory

from purgatory import (
    DelayedOperation,
    DelayedOperationPurgatory,
)
from purgatory._thresholds import ThresholdWatchers
from purgatory.testing import ManualClock, check_invariants
from purgatory.testing._invariants import check_threshold_watchers


class Partition:
    """A replicated log: its high watermark is what acks=all produces wait for."""

    def __init__(self) -> None:
        self.high_watermark = 0


class DelayedProduce(DelayedOperation[str]):
    """acks=all: done once the high watermark has passed the batch's last offset."""

    def __init__(self, partition: Partition, last_offset: int, timeout: float = 30.0) -> None:
        super().__init__(timeout)
        self.partition = partition
        self.required = last_offset + 1
        self.attempts = 0

    def try_complete(self) -> bool:
        self.attempts += 1
        if self.partition.high_watermark >= self.required:
            return self.force_complete()
        return False

    def on_complete(self) -> str:
        return "NONE" if not self.is_expired else "REQUEST_TIMED_OUT"

    def on_expiration(self) -> None:
        pass


def test_acks_all_tries_only_the_produces_the_high_watermark_passed() -> None:
    _clock, p = manual_purgatory()
    partition = Partition()
    produces = [DelayedProduce(partition, offset) for offset in range(0, 1000, 10)]
    for op in produces:
        assert not p.try_complete_else_watch(op, {"topic-0": op.required})
    assert [op.attempts for op in produces] == [2] * 100
    partition.high_watermark = 55
    assert p.check_and_complete("topic-0", partition.high_watermark) == 6
    assert [op.attempts for op in produces[:7]] == [3] * 6 + [2]
    assert all(op.attempts == 2 for op in produces[6:]), "an operation not reached was tried"
    partition.high_watermark = 1000
    assert p.check_and_complete("topic-0", partition.high_watermark) == 94
    assert all(op.attempts == 3 for op in produces)
    assert (p.watched(), p.num_delayed()) == (0, 0)
    check_invariants(p)


class Picky(DelayedOperation[int]):
    """Needs its threshold and something more: `ready`."""

    def __init__(self, name: int, log: list[int], timeout: float = 30.0) -> None:
        super().__init__(timeout)
        self.name = name
        self.log = log
        self.ready = False

    def try_complete(self) -> bool:
        self.log.append(self.name)
        return self.force_complete() if self.ready else False

    def on_complete(self) -> int:
        return self.name

    def on_expiration(self) -> None:
        pass


def test_an_operation_reached_but_not_ready_is_never_lost() -> None:
    _clock, p = manual_purgatory()
    log: list[int] = []
    op = Picky(1, log)
    p.try_complete_else_watch(op, {"k": 10})
    log.clear()
    assert p.check_and_complete("k", 9) == 0
    assert log == []
    assert p.check_and_complete("k", 10) == 0
    assert log == [1]
    # Released: every later trigger of the key tries it, whatever value it carries.
    op.ready = True
    assert p.check_and_complete("k", 3) == 1
    assert log == [1, 1]
    assert op.is_completed
    check_invariants(p)


def test_order_plain_then_reached_in_threshold_order_then_watch_order() -> None:
    _clock, p = manual_purgatory()
    log: list[int] = []
    ops = {name: Picky(name, log) for name in range(6)}
    p.try_complete_else_watch(ops[0], ["k"])
    p.try_complete_else_watch(ops[1], {"k": 7})
    p.try_complete_else_watch(ops[2], {"k": 3})
    p.try_complete_else_watch(ops[3], {"k": 7})
    p.try_complete_else_watch(ops[4], {"k": None})
    p.try_complete_else_watch(ops[5], {"k": 9})
    log.clear()
    assert p.check_and_complete("k", 7) == 0
    assert log == [0, 4, 2, 1, 3]
    log.clear()
    assert p.check_and_complete("k") == 0  # Kafka's meaning: everything
    assert log == [0, 4, 2, 1, 3, 5]
    check_invariants(p)


def test_a_lone_watcher_keeps_its_threshold_or_its_release_when_others_join() -> None:
    # A key's only watcher is stored as itself, its threshold in its own marks: when a second
    # watcher comes, the key's heap must take over that threshold, or its release.
    _clock, p = manual_purgatory()
    log: list[int] = []
    waiting, released = Picky(1, log), Picky(2, log)
    p.try_complete_else_watch(waiting, {"w": 8})
    p.try_complete_else_watch(released, {"r": 8})
    assert p.check_and_complete("r", 8) == 0  # reached, not ready: released
    for key in ("w", "r"):
        p.try_complete_else_watch(Picky(3, log), {key: 100})
    log.clear()
    assert p.check_and_complete("w", 7) == 0
    assert p.check_and_complete("r", 7) == 0
    assert log == [2]  # the released one is tried by every trigger; the other not yet
    assert p.check_and_complete("w", 8) == 0
    assert log == [2, 1]
    check_invariants(p)


def test_a_key_can_mix_plain_and_threshold_watchers_of_many_keys() -> None:
    _clock, p = manual_purgatory()
    log: list[int] = []
    op = Picky(1, log)
    p.try_complete_else_watch(op, {"a": 5, "b": None, "c": 2})
    other = Picky(2, log)
    p.try_complete_else_watch(other, ["a", "b"])
    assert p.watched() == 5
    log.clear()
    op.ready = True
    assert p.check_and_complete("a", 4) == 0  # `other` is plain on "a": tried; `op` is not
    assert log == [2]
    assert p.check_and_complete("c", 2) == 1
    assert op.is_completed
    check_invariants(p)
    assert p.purge() == 2  # op's entries on "a" and "b"
    assert p.watched() == 2
    check_invariants(p)


def test_finished_watchers_leave_the_heap_without_a_scan_and_are_not_kept_alive() -> None:
    _clock, p = manual_purgatory()
    ops = [Picky(index, []) for index in range(1000)]
    for op in ops:
        p.try_complete_else_watch(op, {"k": op.name, "j": op.name})
    refs = [weakref.ref(op) for op in ops]
    for op in ops[:900]:
        op.force_complete()
    assert p.purge() == 1800
    del ops, op
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 100
    check_invariants(p)


def test_a_value_that_does_not_compare_raises_and_leaves_everything_consistent() -> None:
    _clock, p = manual_purgatory()
    log: list[int] = []
    p.try_complete_else_watch(Picky(1, log), {"k": 5})
    with pytest.raises(TypeError):
        p.check_and_complete("k", "five")
    check_invariants(p)
    assert p.watched() == 1


def test_expiry_and_cancellation_of_threshold_watchers() -> None:
    clock, p = manual_purgatory()
    log: list[int] = []
    early = Picky(1, log, timeout=0.01)
    late = Picky(2, log, timeout=10)
    p.try_complete_else_watch(early, {"k": 1})
    p.try_complete_else_watch(late, {"k": 2, "j": 3})
    clock.advance(0.01)
    assert early.is_expired
    assert p.cancel_for_key("j") == [late]
    assert p.purge() == 2
    assert (p.watched(), p.num_delayed(), p.statistics().keys) == (0, 0, 0)
    check_invariants(p)


@pytest.mark.asyncio
@pytest.mark.virtualclock
async def test_watch_and_the_threadsafe_trigger_carry_thresholds() -> None:
    async with DelayedOperationPurgatory[DelayedProduce]("acks") as p:
        partition = Partition()
        waiting = [
            asyncio.create_task(p.watch(op, {"t-0": op.required}))
            for op in (DelayedProduce(partition, 4), DelayedProduce(partition, 9))
        ]
        await asyncio.sleep(0)
        partition.high_watermark = 5
        thread = threading.Thread(target=p.check_and_complete_threadsafe, args=("t-0", 5))
        thread.start()
        thread.join()
        assert await asyncio.wait_for(waiting[0], 5.0) == "NONE"
        assert not waiting[1].done()
        partition.high_watermark = 10
        p.check_and_complete("t-0", 10)
        assert await asyncio.wait_for(waiting[1], 5.0) == "NONE"


class Member:
    """What a `ThresholdWatchers` needs of a watcher on its own: the marks the lists set."""

    __slots__ = ("_marks",)

    def __init__(self, threshold: Any) -> None:
        self._marks = threshold


@pytest.mark.parametrize("order", ["increasing", "shuffled"])
def test_dead_entries_are_compacted_away_as_they_pile_up(order: str) -> None:
    watchers: ThresholdWatchers[Member] = ThresholdWatchers({})
    thresholds = list(range(1000))
    if order == "shuffled":
        random.Random(7).shuffle(thresholds)
    members = [Member(threshold) for threshold in thresholds]
    for member in members:
        watchers.add(member, member._marks)
    for member in members[:900]:
        assert watchers.pop(member, "missing", "k") is None
    assert len(watchers.run) + len(watchers.heap) < 400
    assert watchers.pop(members[0], "missing", "k") == "missing"
    check_threshold_watchers(watchers)


def test_thresholds_shared_by_several_watchers_are_queued_once() -> None:
    watchers: ThresholdWatchers[Member] = ThresholdWatchers({})
    members = [Member(5) for _ in range(3)]
    for member in members:
        watchers.add(member, 5)
    assert (list(watchers.run), watchers.at[5]) == ([5], members)
    watchers.pop(members[1], None, "k")
    assert watchers.at[5] == [members[0], members[2]]
    watchers.pop(members[0], None, "k")
    watchers.pop(members[2], None, "k")
    assert (watchers.at, watchers.dead) == ({}, 0)  # compacted: nothing queued is left
    check_threshold_watchers(watchers)


def test_pop_takes_its_arguments_by_position_or_by_name() -> None:
    """The native `pop` parses its own arguments (vectorcall, PEP 573): as the reference's
    signature does, each by position or by name, and a missing, repeated or unknown one is a
    TypeError with nothing popped."""
    watchers: ThresholdWatchers[Member] = ThresholdWatchers({})
    members = [Member(threshold) for threshold in (1, 2, 3)]
    for member in members:
        watchers.add(member, member._marks)
    bad: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((members[0], None), {}),
        ((members[0], None, "k"), {"key": "k"}),
        ((members[0], None, "k"), {"other": 1}),
        ((members[0], None, "k", "extra"), {}),
    ]
    for args, kwargs in bad:
        with pytest.raises(TypeError):
            watchers.pop(*args, **kwargs)
    assert watchers.at == {1: members[0], 2: members[1], 3: members[2]}
    assert watchers.pop(members[0], default="missing", key="k") is None
    assert watchers.pop(key="k", default="missing", op=members[1]) is None
    assert watchers.pop(members[1], "missing", key="k") == "missing"
    assert watchers.at == {3: members[2]}
    check_threshold_watchers(watchers)


class Watcher(Member):
    """A released watcher: its state (not finished) read by `release`."""

    __slots__ = ("_state",)

    def __init__(self, threshold: Any) -> None:
        super().__init__(threshold)
        self._state = 0


class NoneLeft:
    """The lists `release` reports a finished watcher to (none finishes here)."""

    def left(self, op: Any) -> None:
        raise AssertionError("no watcher finished")


def test_release_takes_its_arguments_by_position_or_by_name() -> None:
    """Both implementations take `release(reached, lists)` with either argument by name (the
    native one once took them by position only), and refuse a missing, repeated or unknown one
    with a TypeError, releasing nothing."""
    watchers: ThresholdWatchers[Watcher] = ThresholdWatchers({})
    members = [Watcher(threshold) for threshold in (1, 2, 3)]
    for member in members:
        watchers.add(member, member._marks)
    lists = NoneLeft()
    bad: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((3,), {}),
        ((3, lists), {"lists": lists}),
        ((3,), {"lists": lists, "other": 1}),
        ((3, lists, "extra"), {}),
    ]
    for args, kwargs in bad:
        with pytest.raises(TypeError):
            watchers.release(*args, **kwargs)
    assert watchers.at == {1: members[0], 2: members[1], 3: members[2]}
    watchers.release(1, lists=lists)
    assert list(watchers.plain) == [members[0]]
    watchers.release(lists=lists, reached=2)
    assert list(watchers.plain) == members[:2]
    watchers.release(3, lists)
    assert list(watchers.plain) == members
    assert watchers.at == {}
    check_threshold_watchers(watchers)


# -- thresholds in increasing order ---------------------------------------------------------------


def test_in_order_thresholds_take_the_run_and_out_of_order_ones_the_heap() -> None:
    watchers: ThresholdWatchers[Member] = ThresholdWatchers({})
    for threshold in [1, 3, 3, 7, 2, 9]:
        watchers.add(Member(threshold), threshold)
    # 9 arrives in order, but after 2: while the heap holds anything, it takes every threshold.
    assert list(watchers.run) == [1, 3, 7]
    assert watchers.heap == [2, 9]
    check_threshold_watchers(watchers)


def test_released_watchers_are_retried_in_threshold_order_then_watch_order() -> None:
    _clock, p = manual_purgatory()
    log: list[int] = []
    for name, threshold in [(1, 1), (2, 3), (3, 3), (4, 7), (5, 2), (6, 9)]:
        p.try_complete_else_watch(Picky(name, log), {"k": threshold})
    log.clear()
    p.check_and_complete("k", 3)
    assert log == [1, 5, 2, 3]
    log.clear()
    p.check_and_complete("k", 8)
    assert log == [1, 5, 2, 3, 4]  # the released ones are plain watchers now, in that order
    check_invariants(p)


def test_a_finished_operation_released_on_another_key_is_dropped_not_retried() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[Any]("both", clock=clock)
    tries: list[str] = []

    class Counted(FlagOperation):
        def try_complete(self) -> bool:
            tries.append(self.name)
            return super().try_complete()

    first, other = Counted(30.0, "first"), Counted(30.0, "other")
    p.try_complete_else_watch(first, {"x": 5, "y": 5})
    p.try_complete_else_watch(other, {"y": 6})
    first.ready = True
    assert p.check_and_complete("x", 5) == 1
    tries.clear()
    assert p.check_and_complete("y", 10) == 0
    assert tries == ["other"]
    assert p.watched() == 1
    check_invariants(p)


# -- NaN is refused -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, float("nan")])
def test_a_nan_threshold_or_value_is_refused(bad: float) -> None:
    _clock, p = manual_purgatory()
    good = FlagOperation(30)
    p.try_complete_else_watch(good, {"hw": 5})
    with pytest.raises(ValueError, match="does not order against itself"):
        p.try_complete_else_watch(FlagOperation(30), {"hw": bad})
    check_invariants(p)
    p.try_complete_else_watch(FlagOperation(30), {"hw": 3})
    with pytest.raises(ValueError, match="does not order against itself"):
        p.check_and_complete("hw", bad)
    good.ready = True
    assert p.check_and_complete("hw", 100) == 1
    check_invariants(p)


@pytest.mark.parametrize("watchers", ["none", "lone plain", "plain", "threshold"])
def test_a_nan_reached_is_always_refused(watchers: str) -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("nan", clock=clock)
    keys: dict[Hashable, Any] = {}
    if watchers == "lone plain":
        p.try_complete_else_watch(FlagOperation(1.0, "a"), ["k"])
    elif watchers == "plain":
        p.try_complete_else_watch(FlagOperation(1.0, "a"), ["k"])
        p.try_complete_else_watch(FlagOperation(1.0, "b"), ["k"])
    elif watchers == "threshold":
        keys["k"] = 5
        p.try_complete_else_watch(FlagOperation(1.0, "a"), keys)
    with pytest.raises(ValueError, match="does not order against itself"):
        p.check_and_complete("k", math.nan)
    check_invariants(p)


# -- thresholds that compare only in part --------------------------------------------------


@pytest.mark.parametrize("how", ["mapping", "threshold="])
@pytest.mark.parametrize("others", [1, 2, 40], ids=["lone", "two", "many"])
def test_a_tuple_threshold_that_does_not_order_against_the_keys_others_is_refused(
    how: str, others: int
) -> None:
    """``(1, 5)`` and ``(1, "y")`` do not compare: such a watch is refused before anything is
    tried or registered, wherever the other thresholds sit (a lone watcher, the run, the heap),
    and every trigger and the shutdown still work."""
    _clock, p = manual_purgatory()
    log: list[int] = []
    ops = [Picky(i, log) for i in range(others)]
    for i, op in enumerate(ops):  # (1, 5), then (2, "a"), (2, "b") ... in and out of order
        threshold = (1, 5) if i == 0 else (2 + i % 3, str(i))
        p.try_complete_else_watch(op, {"k": threshold})
    bad = Picky(99, log)
    before = p.statistics()
    keys: Any = {"k": (1, "y")} if how == "mapping" else ["k"]
    given: Any = None if how == "mapping" else (1, "y")
    with pytest.raises(TypeError, match=r"threshold \(1, 'y'\) for 'k' does not order against"):
        p.try_complete_else_watch(bad, keys, given)
    assert 99 not in log  # refused before its first try
    assert p.statistics() == before
    check_invariants(p)
    assert p.check_and_complete("k", (9, "z")) == 0  # every threshold released, none ready
    check_invariants(p)
    asyncio.run(p.shutdown())
    assert all(op.is_cancelled for op in ops)


def test_thresholds_of_one_shape_are_accepted_and_released_in_order() -> None:
    """(epoch, offset) pairs: the same types at the same places always compare."""
    _clock, p = manual_purgatory()
    log: list[int] = []
    thresholds = [(epoch, offset) for epoch in (2, 1, 3) for offset in (7, 3, 5)]
    ops = [Picky(i, log) for i in range(len(thresholds))]
    for op, threshold in zip(ops, thresholds, strict=True):
        p.try_complete_else_watch(op, {"k": threshold})
    for op in ops:
        op.ready = True
    log.clear()
    assert p.check_and_complete("k", (2, 5)) == 5
    assert [thresholds[i] for i in log] == [(1, 3), (1, 5), (1, 7), (2, 3), (2, 5)]
    check_invariants(p)


def test_a_threshold_is_checked_against_dead_thresholds_a_release_still_compares() -> None:
    """A threshold whose watcher left stays queued (dead) until a release or a compaction
    drops it, and a release compares it: a new threshold must order against it too."""
    _clock, p = manual_purgatory()
    log: list[int] = []
    gone, stays = Picky(0, log), Picky(1, log)
    p.try_complete_else_watch(gone, {"k": (1, 5)})
    p.try_complete_else_watch(stays, {"k": (3, 0)})
    gone.force_complete()
    p.check_and_complete("k", (0, 0))  # releases nothing; (1, 5) stays queued, dead
    with pytest.raises(TypeError, match="does not order against"):
        p.try_complete_else_watch(Picky(2, log), {"k": (1, "y")})
    check_invariants(p)


class Unsortable:
    """A threshold of a user's class whose comparisons may start failing after the watch (its
    order is the user's business: the purgatory can check it only as it is watched)."""

    broken = False

    def __init__(self, value: int) -> None:
        self.value = value

    def __hash__(self) -> int:
        return self.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unsortable) and self.value == other.value

    def __lt__(self, other: Unsortable) -> bool:
        if Unsortable.broken:
            raise TypeError("no order today")
        return self.value < other.value

    def __le__(self, other: Unsortable) -> bool:
        return self == other or self < other


def test_shutdown_and_cancel_for_key_finish_whatever_the_thresholds_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Thresholds that no longer sort still leave a cancel and a shutdown complete."""
    _clock, p = manual_purgatory()
    log: list[int] = []
    ops = [Picky(i, log) for i in range(4)]
    for op, key, value in zip(ops, "kkkm", (1, 3, 2, 1), strict=True):
        p.try_complete_else_watch(op, {key: Unsortable(value)})
    monkeypatch.setattr(Unsortable, "broken", True)
    assert sorted(op.name for op in p.cancel_for_key("k")) == [0, 1, 2]
    asyncio.run(p.shutdown())
    assert all(op.is_cancelled for op in ops)
