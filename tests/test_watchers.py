"""The watcher lists (`purgatory._watchers`), through the purgatory: registration is all or
nothing, a key's lists count each operation once, and what has left every list is released.

`check_watchers` checks the lists, their counts and the purge queue after a step;
`check_invariants`, at the end of a test, checks them with the timing wheel and what ties the two.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
from helpers import AsyncFlag, FlagOperation, manual_purgatory

from purgatory import (
    DelayedOperation,
    DelayedOperationPurgatory,
)
from purgatory.testing import check_invariants, check_watchers

# -- registration ---------------------------------------------------------------------------------


class Big(DelayedOperation[bytes]):
    """A long-poll whose result is large: what must not be kept alive."""

    def __init__(self, timeout: float = 30.0) -> None:
        super().__init__(timeout)
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> bytes:
        return bytes(1_000_000)

    def on_expiration(self) -> None:
        pass


@pytest.mark.parametrize(
    "keys",
    [
        ["orders", ["orders", 1]],  # a JSON-decoded tuple
        ("orders", "other", {}),
        {"orders": 5, "other": None, "bad": "five"},  # a threshold that does not compare
    ],
)
@pytest.mark.asyncio
async def test_a_bad_key_registers_nothing(keys: Any) -> None:
    for make in (FlagOperation, AsyncFlag):
        _clock, p = manual_purgatory()
        first = make(30)
        assert not p.try_complete_else_watch(first, {"bad": 1, "orders": 2})
        op = make(30)
        with pytest.raises(TypeError):
            p.try_complete_else_watch(op, keys)
        check_watchers(p)
        assert p.watched() == 2
        assert p.num_delayed() == 1
        assert not p.try_complete_else_watch(op, ["orders"])  # it can be watched again
        assert p.watched() == 3
        check_invariants(p)
        await p.shutdown()


class Canceller(FlagOperation):
    """Cancels its key from inside a trigger of that very key."""

    def __init__(self, purgatory: DelayedOperationPurgatory[Any]) -> None:
        super().__init__(30, "canceller")
        self.purgatory = purgatory

    def try_complete(self) -> bool:
        if self.ready:
            self.purgatory.cancel_for_key("k")
        return super().try_complete()


def test_cancel_for_key_inside_a_trigger_of_that_key_counts_each_list_once() -> None:
    _clock, p = manual_purgatory(purge_interval=1000)
    first = Canceller(p)
    victim = FlagOperation(30, "victim")
    p.try_complete_else_watch(first, ["k"])
    p.try_complete_else_watch(victim, ["k", "j"])
    first.ready = True
    p.check_and_complete("k")
    assert victim.is_cancelled
    check_watchers(p)
    assert (first._listed, victim._listed) == (0, 1)
    assert p.purge() == 1
    assert p.watched() == 0
    check_invariants(p)


def test_a_key_given_twice_is_watched_once_and_forgotten_with_it() -> None:
    _clock, p = manual_purgatory()
    op = Big()
    p.try_complete_else_watch(op, ["k", "k", 1, 1.0])
    assert p.watched() == 2
    op.ready = True
    assert p.check_and_complete("k") == 1
    assert p.check_and_complete(1) == 0
    ref = weakref.ref(op)
    del op
    gc.collect()
    assert ref() is None
    assert (p.watched(), len(p._lists.queue)) == (0, 0)
    check_invariants(p)


class Joiner(FlagOperation):
    """Completes on its trigger after watching a newcomer on the same key (a re-entrant watch)."""

    def __init__(self, purgatory: DelayedOperationPurgatory[FlagOperation], key: str) -> None:
        super().__init__(10, "joiner")
        self.purgatory = purgatory
        self.key = key
        self.newcomer = FlagOperation(10, "newcomer")

    def try_complete(self) -> bool:
        if self.ready:
            self.purgatory.try_complete_else_watch(self.newcomer, [self.key])
        return super().try_complete()


def test_a_lone_watcher_completing_while_a_newcomer_joins_its_key() -> None:
    """The lone operation of a key leaves it; one that joined during its attempt stays."""
    _, p = manual_purgatory()
    joiner = Joiner(p, "k")
    p.try_complete_else_watch(joiner, ["k"])
    assert (p.watched(), p.statistics().keys) == (1, 1)
    joiner.ready = True
    assert p.check_and_complete("k") == 1
    assert p.watched() == 1
    check_invariants(p)
    joiner.newcomer.ready = True
    assert p.check_and_complete("k") == 1
    assert (p.watched(), p.statistics().keys) == (0, 0)


def test_a_key_listed_twice_is_watched_once_per_listing() -> None:
    _, p = manual_purgatory()
    op = FlagOperation(1)
    p.try_complete_else_watch(op, ["a", "a", "b"])
    check_watchers(p)
    assert p.cancel_for_key("a") == [op]
    assert op.is_cancelled
    check_invariants(p)


# -- nothing that has left every list stays referenced --------------------------------------------


def test_an_operation_that_left_every_list_is_not_kept_alive() -> None:
    _clock, p = manual_purgatory()
    refs = []
    for index in range(200):
        op = Big()
        p.try_complete_else_watch(op, [f"partition-{index}"])
        op.ready = True
        assert p.check_and_complete(f"partition-{index}") == 1
        refs.append(weakref.ref(op))
        del op
    # Three keys, completed through each of them in turn: gone after the last.
    multi = Big()
    p.try_complete_else_watch(multi, ["a", "b", "c"])
    multi.ready = True
    p.check_and_complete("a")
    p.check_and_complete("b")
    p.check_and_complete("c")
    refs.append(weakref.ref(multi))
    del multi
    gc.collect()
    assert [ref for ref in refs if ref() is not None] == []
    assert (p.watched(), p.num_delayed(), len(p._lists.queue)) == (0, 0, 0)
    check_invariants(p)


def test_purge_now_releases_what_only_the_lists_still_hold() -> None:
    clock, p = manual_purgatory(purge_interval=1000)
    ops = [Big(0.01) for _ in range(5)]
    for op in ops:
        p.try_complete_else_watch(op, ["shared", object()])
    cancelled = Big()
    p.try_complete_else_watch(cancelled, ["x", "y"])
    cancelled._cancel()
    clock.advance(0.01)
    assert p.num_delayed() == 0
    assert p.watched() == 12  # expired and cancelled entries wait for the purge (Kafka's rule)
    refs = [weakref.ref(op) for op in [*ops, cancelled]]
    del ops, op, cancelled
    assert p.purge() == 12
    gc.collect()
    assert [ref for ref in refs if ref() is not None] == []
    assert (p.watched(), p.statistics().keys, p.statistics().purged) == (0, 0, 12)
    assert p.purge() == 0
    check_invariants(p)


def test_the_purge_queue_stays_bounded_with_no_purge() -> None:
    """The purge queue holds operations by identity, so one that leaves its last list is taken
    off only from the queue's end; elsewhere it stays there, dead, until the purge or a
    compaction. With no timer pass at all (a driven clock never moved: no purge), rounds that
    each leave two dead entries behind a live one keep the queue within twice the lists'
    entries, and release what it held dead."""
    _clock, p = manual_purgatory()
    pending = [Big() for _ in range(3)]  # entries the bound allows
    for index, op in enumerate(pending):
        assert not p.try_complete_else_watch(op, [f"pending-{index}"])
    refs = []
    longest = 0
    previous: str | None = None
    for index in range(500):
        first, second = Big(), Big()
        assert not p.try_complete_else_watch(first, [f"first-{index}"])
        assert not p.try_complete_else_watch(second, [f"second-{index}"])
        assert first.force_complete()
        assert second.force_complete()  # both queued, `second` last (and left listed)
        assert p.check_and_complete(f"first-{index}") == 0  # off its list: dead in the queue
        if previous is not None:  # the last round's `second`: dead too
            assert p.check_and_complete(previous) == 0
        previous = f"second-{index}"
        longest = max(longest, len(p._lists.queue))
        refs.append(weakref.ref(first))
        del first, second
        check_watchers(p)
    assert p._rule.purges == 0
    bound = 2 * (len(pending) + 2) + 16  # the most entries as one leaves: two seconds listed
    assert longest <= bound
    gc.collect()
    assert len([ref for ref in refs if ref() is not None]) <= bound
    assert (p.purge(), p.watched(), p._lists.queue) == (1, 3, [])  # the last `second`
    check_invariants(p)


def test_a_purge_slice_takes_the_newest_still_listed() -> None:
    """`purge(limit)` takes the newest `limit` operations of the queue still on a list, newest
    first, dropping the dead entries it meets (they left every list once queued); the rest wait
    for the next slice."""
    _clock, p = manual_purgatory()
    ops = [Big() for _ in range(6)]
    for index, op in enumerate(ops):
        keys = [f"k{index}"] if index >= 4 else [f"k{index}", "shared"]
        assert not p.try_complete_else_watch(op, keys)
    for op in ops:
        assert op.force_complete()
    assert p.check_and_complete("k4") == 0  # off its only list, not the queue's last: dead
    assert p._lists.queue == ops
    assert p._lists.purge(2) == 1 + 2  # ops[5] (on k5) and ops[3] (on k3 and "shared")
    assert p._lists.queue == ops[:3]
    assert [op._listed for op in ops] == [2, 2, 2, 0, 0, 0]
    assert p.check_and_complete("k2") == 0  # ops[2] off k2: still on "shared"
    assert p.purge() == 2 + 2 + 1
    assert (p.watched(), p._lists.queue) == (0, [])
    check_invariants(p)


def test_the_purge_queue_never_ends_with_a_dead_entry() -> None:
    """An operation taken off the queue's end takes the dead entries before it along: the queue
    is empty exactly when no finished operation is left on a list (what the purge rule reads)."""
    _clock, p = manual_purgatory()
    ops = [Big() for _ in range(3)]
    for index, op in enumerate(ops):
        assert not p.try_complete_else_watch(op, [f"k{index}"])
    for op in ops:
        assert op.force_complete()
    assert p.check_and_complete("k0") == 0
    assert p.check_and_complete("k1") == 0
    assert p._lists.queue == ops  # two dead, the last one live
    check_watchers(p)
    assert p.check_and_complete("k2") == 0
    assert p._lists.queue == []
    check_invariants(p)
