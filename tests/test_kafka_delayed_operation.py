"""Kafka's ``DelayedOperationTest``, ported to our API.

Time is a `ManualClock`, so nothing here sleeps. Kafka's per-operation lock has no counterpart:
a synchronous ``try_complete`` runs to the end on the loop thread, and an ``async def``
``try_complete`` gets the guarantees Kafka's lock and ``tryCompletePending`` flag gave it: at most
one attempt in flight per operation, and a trigger that arrives during an attempt causes exactly
one more attempt after it. The lock tests are translated to that model.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from helpers import DelayedFuture, FlagOperation

from purgatory import (
    DelayedOperation,
    DelayedOperationPurgatory,
    OperationCancelled,
    PurgatoryClosed,
)
from purgatory.testing import ManualClock, check_invariants

AnyPurgatory = DelayedOperationPurgatory[Any]


class MockOp(FlagOperation):
    """Kafka's ``MockDelayedOperation``: completes once `ready` is set (Kafka: ``completable``)."""

    def __init__(self, timeout: float = 100.0, name: str = "op") -> None:
        super().__init__(timeout, name)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def purgatory(clock: ManualClock) -> AnyPurgatory:
    return DelayedOperationPurgatory[Any]("mock", clock=clock)


async def settle(done: Callable[[], bool], max_yields: int = 1000) -> None:
    """Let the loop run other tasks until `done()` holds or `max_yields` steps have passed.

    Deterministic (no sleeping): the caller asserts `done()` afterwards, so a lost wake-up
    fails with a clear message instead of a timeout.
    """
    for _ in range(max_yields):
        if done():
            return
        await asyncio.sleep(0)


def record_loop_errors() -> list[dict[str, Any]]:
    """Route the running loop's exception handler to a list the test can assert empty."""
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    return errors


# -- satisfaction, expiry, purge -------------------------------------------------------------


def test_request_satisfaction(purgatory: AnyPurgatory) -> None:
    """Kafka ``testRequestSatisfaction``."""
    r1 = MockOp(name="r1")
    r2 = MockOp(name="r2")
    assert purgatory.check_and_complete("test1") == 0, "no waiting requests, nothing satisfied"
    assert not purgatory.try_complete_else_watch(r1, ["test1"]), "r1 not satisfied, watched"
    assert purgatory.check_and_complete("test1") == 0
    assert not purgatory.try_complete_else_watch(r2, ["test2"]), "r2 not satisfied, watched"
    assert purgatory.check_and_complete("test2") == 0
    check_invariants(purgatory)
    r1.ready = True
    assert purgatory.check_and_complete("test1") == 1, "r1 satisfied"
    assert purgatory.check_and_complete("test1") == 0
    check_invariants(purgatory)
    r2.ready = True
    assert purgatory.check_and_complete("test2") == 1, "r2 satisfied"
    assert purgatory.check_and_complete("test2") == 0
    check_invariants(purgatory)
    assert r1.calls == r2.calls == ["complete"]
    assert r1.is_completed
    assert not r1.is_expired
    stats = purgatory.statistics()
    assert (stats.completed, stats.expired, stats.delayed, stats.watched) == (2, 0, 0, 0)


def test_request_expiry(clock: ManualClock, purgatory: AnyPurgatory) -> None:
    """Kafka ``testRequestExpiry`` in virtual time (the real-time version is in test_kafka_reaper).

    r1 (20 ms) expires exactly at its deadline, not a tick earlier; r2 (200 s) stays pending.
    """
    r1 = MockOp(0.020, "r1")
    r2 = MockOp(200.0, "r2")
    assert not purgatory.try_complete_else_watch(r1, ["test1"])
    assert not purgatory.try_complete_else_watch(r2, ["test2"])
    assert clock.advance(0.019) == 0
    assert not r1.is_completed
    assert clock.advance(0.001) == 1
    assert r1.is_completed
    assert r1.is_expired
    assert r1.calls == ["complete", "expire"]
    assert not r2.is_completed
    assert purgatory.num_delayed() == 1
    check_invariants(purgatory)


def test_request_purge(purgatory: AnyPurgatory) -> None:
    """Kafka ``testRequestPurge``: completion leaves the timer at once, the lists lazily."""
    r1, r2, r3 = MockOp(name="r1"), MockOp(name="r2"), MockOp(name="r3")
    purgatory.try_complete_else_watch(r1, ["test1"])
    purgatory.try_complete_else_watch(r2, ["test1", "test2"])
    purgatory.try_complete_else_watch(r3, ["test1", "test2", "test3"])
    assert purgatory.num_delayed() == 3
    assert purgatory.watched() == 6

    # Completing an operation takes it out of the timer immediately.
    r2.ready = True
    assert r2.try_complete()
    assert purgatory.num_delayed() == 2
    r3.ready = True
    assert r3.try_complete()
    assert purgatory.num_delayed() == 1
    assert purgatory.watched() == 6  # the watcher lists are cleaned lazily
    check_invariants(purgatory)

    # Checking a key drops the completed operations from that key's list, uncounted.
    assert purgatory.check_and_complete("test1") == 0
    assert purgatory.watched() == 4
    assert purgatory.check_and_complete("test2") == 0
    assert purgatory.watched() == 2
    assert purgatory.check_and_complete("test3") == 0
    assert purgatory.watched() == 1
    assert purgatory.statistics().keys == 1
    check_invariants(purgatory)


@pytest.mark.parametrize(("purge_interval", "watched_after_pass"), [(0, 1), (1000, 6)])
def test_request_purge_on_a_timer_pass(purge_interval: int, watched_after_pass: int) -> None:
    """Ours purges on a timer pass once ``estimated - num_delayed() > purge_interval``."""
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[MockOp](
        "mock", clock=clock, purge_interval=purge_interval
    )
    r1, r2, r3 = MockOp(name="r1"), MockOp(name="r2"), MockOp(name="r3")
    purgatory.try_complete_else_watch(r1, ["test1"])
    purgatory.try_complete_else_watch(r2, ["test1", "test2"])
    purgatory.try_complete_else_watch(r3, ["test1", "test2", "test3"])
    assert r2.force_complete()
    assert r3.force_complete()
    assert purgatory.watched() == 6  # nothing purges before a timer pass
    clock.advance(0)
    assert purgatory.watched() == watched_after_pass
    stats = purgatory.statistics()
    assert stats.purged == 6 - watched_after_pass
    assert stats.keys == (1 if purge_interval == 0 else 3)
    check_invariants(purgatory)


def test_purge_waits_for_more_than_purge_interval_finished_operations() -> None:
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[MockOp]("mock", clock=clock, purge_interval=2)
    ops = [MockOp(name=str(i)) for i in range(4)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, ["all", f"own{i}"])
    assert (purgatory.watched(), purgatory.statistics().keys) == (8, 5)
    assert ops[0].force_complete()
    assert ops[1].force_complete()
    clock.advance(0)  # 4 watched - 2 delayed = 2, not more than 2: no purge
    assert purgatory.watched() == 8
    assert purgatory.statistics().purged == 0
    assert ops[2].force_complete()
    clock.advance(0)  # 4 - 1 = 3 > 2: purge
    assert purgatory.watched() == 2
    assert purgatory.statistics().keys == 2
    assert purgatory.statistics().purged == 6
    check_invariants(purgatory)
    # The count restarted from the one still delayed: one more finished op is not enough.
    extra = MockOp(name="extra")
    purgatory.try_complete_else_watch(extra, ["all"])
    assert extra.force_complete()
    clock.advance(0)  # estimated 2 - delayed 1 = 1
    assert purgatory.watched() == 3
    check_invariants(purgatory)


def test_expired_operations_are_purged_in_the_same_pass() -> None:
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[MockOp]("mock", clock=clock, purge_interval=0)
    op = MockOp(1.0)
    purgatory.try_complete_else_watch(op, ["a", "b"])
    assert clock.advance(1.0) == 1
    assert op.is_expired
    assert (purgatory.watched(), purgatory.statistics().keys) == (0, 0)
    assert purgatory.statistics().purged == 2
    check_invariants(purgatory)


# -- cancel_for_key ------------------------------------------------------------------------


def test_cancel_for_key_returns_the_cancelled_operations(
    clock: ManualClock, purgatory: AnyPurgatory
) -> None:
    """Kafka ``shouldCancelForKeyReturningCancelledOperations``."""
    first, second, other = MockOp(10.0, "first"), MockOp(10.0, "second"), MockOp(10.0, "other")
    purgatory.try_complete_else_watch(first, ["key"])
    purgatory.try_complete_else_watch(second, ["key"])
    purgatory.try_complete_else_watch(other, ["key2"])

    assert purgatory.cancel_for_key("key") == [first, second]
    assert purgatory.num_delayed() == 1
    assert purgatory.watched() == 1
    assert purgatory.statistics().cancelled == 2
    check_invariants(purgatory)
    for op in (first, second):
        assert op.is_cancelled
        assert not op.is_completed
        assert not op.force_complete()  # a cancelled operation cannot complete
    first.ready = True
    assert purgatory.check_and_complete("key") == 0
    assert clock.advance(10.0) == 1
    assert other.is_expired
    assert first.calls == second.calls == []
    assert not first.is_expired
    check_invariants(purgatory)


def test_cancel_for_key_skips_completed_and_already_cancelled_operations(
    purgatory: AnyPurgatory,
) -> None:
    done = MockOp(name="done")
    pending = MockOp(name="pending")
    purgatory.try_complete_else_watch(done, ["key"])
    purgatory.try_complete_else_watch(pending, ["key", "other"])
    assert done.force_complete()  # still on "key"'s list until something drops it
    assert purgatory.cancel_for_key("key") == [pending]
    assert done.calls == ["complete"]
    assert not done.is_cancelled
    # `pending` is still on "other"'s list (lazily); it is cancelled once, not twice.
    assert purgatory.watched() == 1
    assert purgatory.cancel_for_key("other") == []
    assert purgatory.watched() == 0
    assert purgatory.cancel_for_key("key") == []
    assert purgatory.statistics().cancelled == 1
    check_invariants(purgatory)


def test_cancelled_operations_on_other_keys_are_dropped_uncounted(
    purgatory: AnyPurgatory,
) -> None:
    op = MockOp()
    purgatory.try_complete_else_watch(op, ["a", "b"])
    assert purgatory.cancel_for_key("a") == [op]
    op.ready = True
    assert purgatory.check_and_complete("b") == 0
    assert op.attempts == 2  # the two tries of the watch call, none from the check
    assert (purgatory.watched(), purgatory.statistics().keys) == (0, 0)
    check_invariants(purgatory)


def test_cancel_for_unknown_key_returns_nothing(purgatory: AnyPurgatory) -> None:
    """Kafka ``shouldReturnNilOperationsOnCancelForKeyWhenKeyDoesntExist``."""
    assert purgatory.cancel_for_key("key") == []
    assert purgatory.statistics().keys == 0
    assert purgatory.check_and_complete("key") == 0
    assert purgatory.statistics().keys == 0


@pytest.mark.asyncio
async def test_awaiters_of_an_operation_cancelled_for_its_key() -> None:
    purgatory = DelayedOperationPurgatory[MockOp]("mock", clock=ManualClock())
    op = MockOp()
    waiter = asyncio.create_task(purgatory.watch(op, ["key"]))
    await asyncio.sleep(0)
    assert purgatory.cancel_for_key("key") == [op]
    with pytest.raises(OperationCancelled) as raised:
        await waiter
    assert not isinstance(raised.value, PurgatoryClosed)
    assert op.calls == []
    await purgatory.shutdown()


# -- try_complete_else_watch: the first try, the second try, in between ----------------------


class ProbeOp(MockOp):
    """Records what the purgatory looked like at each try; completes on a chosen try."""

    def __init__(self, purgatory: AnyPurgatory, complete_on: int | None) -> None:
        super().__init__()
        self.purgatory = purgatory
        self.complete_on = complete_on
        self.seen: list[tuple[int, int]] = []  # (watched, num_delayed) at each try

    def try_complete(self) -> bool:
        self.seen.append((self.purgatory.watched(), self.purgatory.num_delayed()))
        self.ready = self.complete_on is not None and len(self.seen) >= self.complete_on
        return super().try_complete()


def test_complete_on_the_first_try_registers_nothing(
    clock: ManualClock, purgatory: AnyPurgatory
) -> None:
    """Kafka ``testSafeTryCompleteOrElse`` (true branch): no watch, no timer."""
    op = ProbeOp(purgatory, complete_on=1)
    assert purgatory.try_complete_else_watch(op, ["a", "b"])
    assert op.seen == [(0, 0)]
    assert (purgatory.watched(), purgatory.num_delayed(), purgatory.statistics().keys) == (0, 0, 0)
    assert op.calls == ["complete"]
    clock.advance(1000.0)
    assert op.calls == ["complete"]
    check_invariants(purgatory)


def test_not_complete_on_either_try_is_watched_then_timed(purgatory: AnyPurgatory) -> None:
    """Kafka ``testLockInTryCompleteElseWatch``: two plain tries, registration in between."""
    op = ProbeOp(purgatory, complete_on=None)
    assert not purgatory.try_complete_else_watch(op, ["a", "b"])
    # First try: nothing registered. Second try: on both lists, not yet in the timer.
    assert op.seen == [(0, 0), (2, 0)]
    assert (purgatory.watched(), purgatory.num_delayed()) == (2, 1)
    check_invariants(purgatory)


def test_completed_in_between_the_tries(clock: ManualClock, purgatory: AnyPurgatory) -> None:
    """The condition became true after the first try: the second try completes it.

    It never enters the timer; as in Kafka, it was added to the watcher lists and stays there
    until a check or a purge drops it.
    """
    op = ProbeOp(purgatory, complete_on=2)
    assert purgatory.try_complete_else_watch(op, ["a", "b"])
    assert op.seen == [(0, 0), (2, 0)]
    assert purgatory.num_delayed() == 0
    assert purgatory.watched() == 2
    assert purgatory.check_and_complete("a") == 0
    assert purgatory.watched() == 1
    check_invariants(purgatory)
    clock.advance(1000.0)
    assert op.calls == ["complete"]
    assert not op.is_expired


class TriggerDuringSecondTryOp(MockOp):
    """On its second try, makes itself completable and fires a trigger on its own key."""

    def __init__(self, purgatory: AnyPurgatory, key: Hashable) -> None:
        super().__init__()
        self.purgatory = purgatory
        self.key = key
        self.nested: list[int] = []

    def try_complete(self) -> bool:
        if self.attempts == 1 and not self.nested:
            self.attempts += 1
            self.ready = True
            self.nested.append(self.purgatory.check_and_complete(self.key))
            return self.force_complete()  # somebody else won: False
        return super().try_complete()


def test_completed_by_a_trigger_during_the_second_try(purgatory: AnyPurgatory) -> None:
    """Kafka: "the operation is completed (by another thread) between the two tryComplete()"."""
    op = TriggerDuringSecondTryOp(purgatory, "key")
    assert purgatory.try_complete_else_watch(op, ["key"])
    assert op.nested == [1]  # the nested trigger completed it
    assert op.calls == ["complete"]
    assert (purgatory.watched(), purgatory.num_delayed()) == (0, 0)
    check_invariants(purgatory)


class SilentCompleteOp(MockOp):
    """Completes itself but returns False: the purgatory must look at the state, not the value."""

    def try_complete(self) -> bool:
        self.attempts += 1
        self.force_complete()
        return False


def test_completion_is_read_from_the_operation_not_the_return_value(
    purgatory: AnyPurgatory,
) -> None:
    op = SilentCompleteOp()
    assert purgatory.try_complete_else_watch(op, ["key"])
    assert op.attempts == 1
    assert (purgatory.watched(), purgatory.num_delayed()) == (0, 0)
    assert op.calls == ["complete"]


class FailingOp(MockOp):
    def __init__(self, fail_on: int) -> None:
        super().__init__()
        self.fail_on = fail_on

    def try_complete(self) -> bool:
        if self.attempts + 1 == self.fail_on:
            self.attempts += 1
            raise RuntimeError(f"try {self.fail_on} failed")
        return super().try_complete()


@pytest.mark.parametrize("fail_on", [1, 2])
def test_a_raising_try_propagates_and_leaves_nothing_registered(
    purgatory: AnyPurgatory, fail_on: int
) -> None:
    op = FailingOp(fail_on)
    with pytest.raises(RuntimeError, match=f"try {fail_on} failed"):
        purgatory.try_complete_else_watch(op, ["a", "b"])
    assert op.attempts == fail_on
    assert (purgatory.watched(), purgatory.num_delayed(), purgatory.statistics().keys) == (0, 0, 0)
    check_invariants(purgatory)


# -- the operation lock, translated ----------------------------------------------------------


def test_completable_operations_on_one_key_all_complete(purgatory: AnyPurgatory) -> None:
    """Kafka ``verifyDelayedOperationLock``: "if locks are free all completable ops complete"."""
    ops = [MockOp(name=str(i)) for i in range(2)]
    for op in ops:
        assert not purgatory.try_complete_else_watch(op, ["key"])
    for op in ops:
        op.ready = True
    assert purgatory.check_and_complete("key") == 2
    assert all(op.calls == ["complete"] for op in ops)
    # "Immediately completable operations should complete without locking."
    for op in (MockOp(name="now1"), MockOp(name="now2")):
        op.ready = True
        assert purgatory.try_complete_else_watch(op, ["key"])
        assert op.is_completed
    check_invariants(purgatory)


class ReentrantOp(MockOp):
    """Its ``on_complete`` triggers its own key again (Kafka: the lock held by this thread)."""

    def __init__(self, purgatory: AnyPurgatory, key: Hashable) -> None:
        super().__init__(name="reentrant")
        self.purgatory = purgatory
        self.key = key
        self.nested: list[int] = []

    def on_complete(self) -> str:
        result = super().on_complete()
        self.nested.append(self.purgatory.check_and_complete(self.key))
        return result


def test_check_and_complete_reentered_from_on_complete(purgatory: AnyPurgatory) -> None:
    """Kafka: "lock held by current thread, completable operations should complete"."""
    first = ReentrantOp(purgatory, "key")
    second = MockOp(name="second")
    purgatory.try_complete_else_watch(first, ["key"])
    purgatory.try_complete_else_watch(second, ["key"])
    first.ready = second.ready = True
    # `first` completes in the outer call; its on_complete re-enters and completes `second`,
    # which the outer call then finds completed and does not count again.
    assert purgatory.check_and_complete("key") == 1
    assert first.nested == [1]
    assert first.calls == second.calls == ["complete"]
    assert purgatory.statistics().completed == 2
    assert (purgatory.watched(), purgatory.statistics().keys) == (0, 0)
    check_invariants(purgatory)


class AsyncFlagOp(DelayedOperation[str]):
    """An ``async def try_complete`` that reads `ready`, then waits on `gate`."""

    def __init__(self, gate: asyncio.Event, timeout: float = 100.0) -> None:
        super().__init__(timeout)
        self.gate = gate
        self.ready = False
        self.attempts = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls: list[str] = []

    async def try_complete(self) -> bool:
        self.attempts += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        should_complete = self.ready
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        if should_complete:
            return self.force_complete()
        return False

    def on_complete(self) -> str:
        self.calls.append("complete")
        return "async done"

    def on_expiration(self) -> None:
        self.calls.append("expire")


@pytest.mark.asyncio
async def test_try_complete_lock_contention() -> None:
    """Kafka ``testTryCompleteLockContention``, with an async attempt in place of the lock.

    A trigger arriving while an attempt is suspended neither blocks nor starts a second attempt;
    when the attempt ends, exactly one more runs, and completes the operation.
    """
    errors = record_loop_errors()
    purgatory = DelayedOperationPurgatory[AsyncFlagOp]("mock", clock=ManualClock())
    gate = asyncio.Event()
    gate.set()
    op = AsyncFlagOp(gate)
    assert not purgatory.try_complete_else_watch(op, ["key"])
    assert op.attempts == 0  # the attempt is a task of its own, not run in the caller's
    await settle(lambda: op.attempts == 1 and not op.in_flight)
    assert op.attempts == 1

    gate.clear()
    assert purgatory.check_and_complete("key") == 0  # attempt 2 starts, sees "not yet", waits
    await settle(lambda: op.attempts == 2)
    assert op.attempts == 2
    op.ready = True
    for _ in range(3):  # these must not block, and must not pile up
        assert purgatory.check_and_complete("key") == 0
    assert op.attempts == 2
    assert not op.is_completed
    await asyncio.sleep(0)
    assert op.attempts == 2

    gate.set()
    await settle(lambda: op.is_completed)
    assert op.is_completed, "the trigger that arrived during the attempt was lost"
    assert await op == "async done"
    assert op.attempts == 3
    assert op.max_in_flight == 1
    assert op.calls == ["complete"]
    assert purgatory.num_delayed() == 0
    check_invariants(purgatory)
    assert errors == []
    await purgatory.shutdown()


@pytest.mark.asyncio
async def test_an_attempt_in_flight_does_not_hold_up_the_other_operations() -> None:
    """Kafka: "lock held by another thread, should not block, only operations that can be locked
    without blocking complete" - and the held-up one completes once its attempt ends."""
    errors = record_loop_errors()
    purgatory = DelayedOperationPurgatory[Any]("mock", clock=ManualClock())
    gate = asyncio.Event()
    busy = AsyncFlagOp(gate)
    free = MockOp(name="free")
    assert not purgatory.try_complete_else_watch(busy, ["key"])
    assert not purgatory.try_complete_else_watch(free, ["key"])
    await settle(lambda: busy.attempts == 1)  # its attempt's task is suspended on the gate
    assert busy.attempts == 1
    busy.ready = free.ready = True
    assert purgatory.check_and_complete("key") == 1
    assert free.calls == ["complete"]
    assert not busy.is_completed
    gate.set()
    await settle(lambda: busy.is_completed)
    assert busy.is_completed, "the trigger that arrived during the attempt was lost"
    assert busy.attempts == 2  # the pending re-run, with no further trigger
    assert busy.calls == ["complete"]
    check_invariants(purgatory)
    assert errors == []
    await purgatory.shutdown()


# -- testTryCompleteWithMultipleThreads ------------------------------------------------------

OPERATIONS = 100
TRIGGERS = 20  # Kafka's completionAttempts: 100 x 20 = 2000 triggers


class StressOp(DelayedOperation[int]):
    """Kafka's ``TestDelayOperation`` as an async attempt, instrumented against the contract.

    Each attempt reads `ready`, then yields a random number of times (Kafka sleeps a random
    0-10 ms), then completes if it had read True. `note_trigger` is called right before each
    trigger and keeps the count of attempts the contract calls for: one for the watch, one per
    trigger that finds no attempt in flight, and one per attempt that saw a trigger arrive while
    it ran and ended without completing.
    """

    def __init__(self, index: int, rng: random.Random, max_yields: int) -> None:
        super().__init__(100.0)
        self.index = index
        self.key = f"key{index}"
        self.rng = rng
        self.max_yields = max_yields
        self.remaining = TRIGGERS
        self.ready = False
        self.in_flight = False
        # An attempt is queued (its task started by the watch or a trigger, or a re-run owed by
        # an attempt that saw a trigger) and has not begun: a trigger now is folded into it.
        self.owed = True
        self.triggered_during = False
        self.attempts = 0
        self.expected_attempts = 1
        self.coalesced = 0
        self.overlaps = 0
        self.unexpected = 0
        self.completions = 0
        self.expirations = 0

    async def try_complete(self) -> bool:
        if self.in_flight:
            self.overlaps += 1
        self.in_flight = True
        self.owed = False
        self.triggered_during = False
        self.attempts += 1
        if self.attempts > self.expected_attempts:
            self.unexpected += 1
        should_complete = self.ready
        for _ in range(self.rng.randrange(self.max_yields + 1)):
            await asyncio.sleep(0)
        self.in_flight = False
        if should_complete:
            return self.force_complete()
        if self.triggered_during:
            self.owed = True
            self.expected_attempts += 1
        return False

    def note_trigger(self) -> None:
        if self.is_completed:
            return
        if self.in_flight:
            self.triggered_during = True
            self.coalesced += 1
        elif not self.owed:
            self.expected_attempts += 1
            self.owed = True

    def on_complete(self) -> int:
        self.completions += 1
        return self.index

    def on_expiration(self) -> None:
        self.expirations += 1


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_try_complete_with_many_concurrent_triggers(seed: int) -> None:
    """Kafka ``testTryCompleteWithMultipleThreads``: 100 operations, 2000 triggers as tasks.

    Every operation completes exactly once; no two attempts of one operation overlap; the number
    of attempts is exactly what the contract calls for (no lost wake-up, no pile-up).
    """
    errors = record_loop_errors()
    rng = random.Random(seed)
    purgatory = DelayedOperationPurgatory[StressOp]("mock", clock=ManualClock())
    ops = [StressOp(i, rng, max_yields=10) for i in range(OPERATIONS)]
    for op in ops:
        assert not purgatory.try_complete_else_watch(op, [op.key])
    check_invariants(purgatory)

    async def trigger(op: StressOp, delay: int) -> None:
        for _ in range(delay):
            await asyncio.sleep(0)
        op.remaining -= 1
        if op.remaining == 0:
            op.ready = True
        op.note_trigger()
        purgatory.check_and_complete(op.key)

    await asyncio.gather(*(trigger(op, rng.randrange(20)) for _ in range(TRIGGERS) for op in ops))
    # Every trigger has run; at most an attempt and its re-run are left per operation.
    await settle(lambda: all(op.is_completed for op in ops))
    for op in ops:
        assert op.is_completed, f"{op.key}: a wake-up was lost"
    assert [await op for op in ops] == list(range(OPERATIONS))
    for op in ops:
        assert (op.completions, op.expirations) == (1, 0), op.key
        assert op.overlaps == 0, op.key
        assert op.unexpected == 0, op.key
        assert op.attempts == op.expected_attempts, op.key
        assert op.remaining == 0
    # The schedule did exercise the interesting path: triggers during attempts.
    assert sum(op.coalesced for op in ops) > 0
    assert sum(op.attempts for op in ops) < OPERATIONS * (TRIGGERS + 1)
    assert purgatory.statistics().completed == OPERATIONS
    assert purgatory.num_delayed() == 0
    for op in ops:
        purgatory.check_and_complete(op.key)
    assert (purgatory.watched(), purgatory.statistics().keys) == (0, 0)
    check_invariants(purgatory)
    assert errors == []
    await purgatory.shutdown()


class ThreadedOp(DelayedOperation[int]):
    """Kafka's ``TestDelayOperation`` for triggers that come from other threads."""

    def __init__(self, index: int, rng: random.Random) -> None:
        super().__init__(100.0)
        self.index = index
        self.key = f"key{index}"
        self.rng = rng  # used on the loop thread only
        self.remaining = TRIGGERS
        self.lock = threading.Lock()
        self.ready = False
        self.in_flight = False
        self.overlaps = 0
        self.attempts = 0
        self.completions = 0

    async def try_complete(self) -> bool:
        if self.in_flight:
            self.overlaps += 1
        self.in_flight = True
        self.attempts += 1
        should_complete = self.ready
        for _ in range(self.rng.randrange(6)):
            await asyncio.sleep(0)
        self.in_flight = False
        if should_complete:
            return self.force_complete()
        return False

    def on_complete(self) -> int:
        self.completions += 1
        return self.index

    def on_expiration(self) -> None:
        raise AssertionError("must not expire")


@pytest.mark.asyncio
async def test_try_complete_with_triggers_from_other_threads() -> None:
    """The closest port of Kafka's threaded test: triggers via `check_and_complete_threadsafe`."""
    errors = record_loop_errors()
    rng = random.Random(42)
    purgatory = DelayedOperationPurgatory[ThreadedOp]("mock", clock=ManualClock())
    ops = [ThreadedOp(i, rng) for i in range(OPERATIONS)]
    for op in ops:
        assert not purgatory.try_complete_else_watch(op, [op.key])

    def trigger(op: ThreadedOp, delay: float) -> None:
        time.sleep(delay)
        with op.lock:
            op.remaining -= 1
            last = op.remaining == 0
        if last:
            op.ready = True
        purgatory.check_and_complete_threadsafe(op.key)

    delays = [0.0, 0.0, 0.0005, 0.001]
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [
            pool.submit(trigger, op, rng.choice(delays)) for _ in range(TRIGGERS) for op in ops
        ]
        async with asyncio.timeout(10):
            await asyncio.gather(*(asyncio.wrap_future(future) for future in futures))
            results = [await op for op in ops]
    assert results == list(range(OPERATIONS))
    for op in ops:
        assert op.completions == 1
        assert op.overlaps == 0
        assert 1 <= op.attempts <= TRIGGERS + 1
    check_invariants(purgatory)
    assert errors == []
    await purgatory.shutdown()


# -- testDelayedFuture -----------------------------------------------------------------------


def watch_futures(
    purgatory: DelayedOperationPurgatory[DelayedFuture],
    timeout: float,
    futures: list[asyncio.Future[int]],
) -> DelayedFuture:
    """Kafka's ``DelayedFuturePurgatory.tryCompleteElseWatch``: watch, and let each future's
    completion trigger a check."""
    op = DelayedFuture(timeout, futures)
    key = ("futures", id(op))
    completed = purgatory.try_complete_else_watch(op, [key])
    assert completed == op.is_completed

    def trigger(_: asyncio.Future[int]) -> None:
        purgatory.check_and_complete(key)

    for future in futures:
        future.add_done_callback(trigger)
    return op


@pytest.mark.asyncio
async def test_delayed_future() -> None:
    """Kafka ``testDelayedFuture``, in virtual time."""
    loop = asyncio.get_running_loop()
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[DelayedFuture]("testDelayedFuture", clock=clock)

    def done(value: int) -> asyncio.Future[int]:
        future = loop.create_future()
        future.set_result(value)
        return future

    # Two completed futures: completes at once, in the watch call.
    r1 = watch_futures(purgatory, 100.0, [done(10), done(11)])
    assert r1.is_completed
    assert await r1 == 21

    # Two pending futures: waits for both.
    futures2: list[asyncio.Future[int]] = [loop.create_future(), loop.create_future()]
    r2 = watch_futures(purgatory, 100.0, futures2)
    assert not r2.is_completed
    futures2[0].set_result(20)
    await asyncio.sleep(0)
    assert not r2.is_completed
    futures2[1].set_result(21)
    async with asyncio.timeout(5):
        assert await r2 == 41

    # One pending, one completed: waits for the pending one.
    futures3: list[asyncio.Future[int]] = [loop.create_future(), done(31)]
    r3 = watch_futures(purgatory, 100.0, futures3)
    assert not r3.is_completed
    futures3[0].set_result(30)
    async with asyncio.timeout(5):
        assert await r3 == 61

    # One never completes: the operation expires at its deadline; that future times out.
    futures4: list[asyncio.Future[int]] = [loop.create_future(), loop.create_future()]
    r4 = watch_futures(purgatory, 2.0, futures4)
    futures4[0].set_result(40)
    await asyncio.sleep(0)
    assert not r4.is_completed
    clock.advance(1.999)
    assert not r4.is_completed
    clock.advance(0.001)
    assert r4.is_expired
    assert await r4 == 40
    assert isinstance(futures4[1].exception(), TimeoutError)
    check_invariants(purgatory)
    await purgatory.shutdown()
