"""The purgatory on a real event loop (the stock asyncio loop and uvloop, see conftest.py): the
reaper, async attempts, awaiting and cancelling, one timer handle, threadsafe triggers, anyio.

The loops run in virtual time (virtual_time.py): the clock jumps to the next timer whenever the
loop would sleep, as trio's ``MockClock(autojump_threshold=0)`` does. Sleeps, timeouts and
expiries take no wall time, and time is read exactly: an operation expires at its deadline
rounded up to the tick, to the float (`due`), where API.md allows "one tick late plus scheduling
delay" and a virtual loop has no scheduling delay. A bound such as ``asyncio.timeout(GUARD)``
costs nothing and fails a test at once when its loop stops making progress (a reaper that never
wakes), never because a shared machine was slow. Threads are joined before the loop awaits what
they triggered, since a virtual clock would jump a pending timeout while a thread works.

Two tests run on the real clock (marked ``realclock``), for what only a real clock shows:
`test_the_reaper_wakes_on_the_loops_real_timer` (the reaper's timer is a real loop timer that
really fires, with a one-minute bound for "it woke at all") and
`test_never_early_by_the_monotonic_clock` (uvloop rounds its timers to the millisecond and caches
its clock, so a timer may fire before the deadline by ``time.monotonic``: the reaper must find
nothing due and sleep again, never expire early).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import anyio
import pytest
from helpers import (
    Boom,
    Custom,
    DelayedFuture,
    FailsFirstAttempt,
    FlagOperation,
    Raises,
    RaisingComplete,
    RaisingExpiration,
    Recorder,
    attempt_running,
    attempt_tasks,
    cascading,
    loop_errors,
    reaper_restarts,
    until,
    wheel_levels,
)
from virtual_time import EACH_LOOP, NewLoop

from purgatory import (
    DelayedOperation,
    DelayedOperationPurgatory,
    OperationCancelled,
    PurgatoryClosed,
)
from purgatory._reaper import PASS_BUDGET
from purgatory.testing import ManualClock, check_invariants

pytestmark = pytest.mark.virtualclock

TICK = 0.001  # the default tick

#: A bound in loop time on a wait: free in virtual time, where it fails only a stuck loop.
GUARD = 60.0


def due(watched_at: float, timeout: float) -> float:
    """When an operation watched at `watched_at` expires in virtual time.

    API.md: at the first timer pass at or after its deadline rounded up to the tick, comparisons
    in ticks with a tolerance of 1e-6 tick. The reaper's pass is at that tick, to the float.
    """
    return math.ceil((watched_at + timeout) / TICK - 1e-6) * TICK


class TimedOp(FlagOperation):
    """A `FlagOperation` that notes the loop time (and thread) of its callbacks.

    With `log`, it appends its name there on expiry: the order of expiries (Kafka's
    ``MockDelayedOperation``).
    """

    def __init__(self, timeout: float, name: str = "op", log: list[str] | None = None) -> None:
        super().__init__(timeout, name)
        self.log = log
        self.completed_at: float | None = None
        self.expired_at: float | None = None
        self.thread: int | None = None

    def on_complete(self) -> str:
        self.completed_at = asyncio.get_running_loop().time()
        self.thread = threading.get_ident()
        return super().on_complete()

    def on_expiration(self) -> None:
        super().on_expiration()
        self.expired_at = asyncio.get_running_loop().time()
        if self.log is not None:
            self.log.append(self.name)


def assert_expired_at_its_deadline(op: TimedOp, watched_at: float) -> None:
    """Expired, by the reaper's pass at its deadline tick: not a moment early or late."""
    assert op.is_expired, op
    assert op.calls == ["complete", "expire"]
    assert op.expired_at == due(watched_at, op.timeout)


async def expires_on_time(purgatory: DelayedOperationPurgatory[Any], op: TimedOp, key: str) -> None:
    """Watch `op` on `key` now and wait for it: it must expire at its deadline tick."""
    start = now()
    purgatory.try_complete_else_watch(op, [key])
    async with asyncio.timeout(GUARD):
        await op
    assert_expired_at_its_deadline(op, start)


class GatedOp(DelayedOperation[str]):
    """An async try_complete that reads its condition, then waits on a gate the test opens.

    Reading the condition *before* suspending makes a trigger that arrives during an attempt
    observable: that attempt decides on stale data, so only a follow-up attempt can complete.
    """

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False
        self.gates: list[asyncio.Future[None]] = []
        self.attempts = 0
        self.running = 0
        self.max_running = 0
        self.completions = 0
        self.expirations = 0
        self.late_force_complete: bool | None = None

    async def try_complete(self) -> bool:
        self.attempts += 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            ready = self.ready
            gate = asyncio.get_running_loop().create_future()
            self.gates.append(gate)
            await gate
        finally:
            self.running -= 1
        if not ready:
            return False
        won = self.force_complete()
        if self.is_expired:
            self.late_force_complete = won
        return won

    def on_complete(self) -> str:
        self.completions += 1
        return "gated"

    def on_expiration(self) -> None:
        self.expirations += 1


class SleepyOp(TimedOp):
    """An async try_complete that yields to the loop once before deciding."""

    async def try_complete(self) -> bool:  # type: ignore[override]
        await asyncio.sleep(0)
        return self.force_complete() if self.ready else False


class FutureOp(TimedOp):
    """An async try_complete that asks a real future (resolved by a loop timer) for the answer."""

    async def try_complete(self) -> bool:  # type: ignore[override]
        self.attempts += 1
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bool] = loop.create_future()
        loop.call_later(0.005, answer.set_result, self.ready)
        return self.force_complete() if await answer else False


class EagerAsyncOp(TimedOp):
    """An async try_complete that never suspends."""

    async def try_complete(self) -> bool:  # type: ignore[override]
        return self.force_complete() if self.ready else False


async def outcome(op: DelayedOperation[Any]) -> Any:
    """`await op` inside a task of its own."""
    return await op


async def spin(iterations: int = 20) -> None:
    """Let the loop run a few iterations (ready callbacks and tasks) without sleeping."""
    for _ in range(iterations):
        await asyncio.sleep(0)


async def watched_and_awaited(
    purgatory: DelayedOperationPurgatory[Any], op: DelayedOperation[Any], keys: list[str]
) -> tuple[asyncio.Task[Any], asyncio.Task[Any]]:
    """`op` watched on `keys` in a task of its own and awaited in another, both under way."""
    watcher = asyncio.create_task(purgatory.watch(op, keys))
    await until(lambda: purgatory.num_delayed() == 1, "watched")
    awaiter = asyncio.create_task(outcome(op))
    await spin()
    return watcher, awaiter


@contextmanager
def looking_between_passes(
    purgatory: DelayedOperationPurgatory[Any], look: Callable[[], object]
) -> Iterator[None]:
    """Queue `look` on the loop each time a timer is set while a cascade is under way.

    A cascade cut in slices sets the reaper's timer for the current tick after each slice, so
    `look` runs between two slices if the loop runs other callbacks there, and never if the
    cascade runs whole. (All slices fall at one virtual instant, which no sleep can aim at.)
    """
    loop = asyncio.get_running_loop()
    call_at = loop.call_at

    def spy(when: float, callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
        if cascading(purgatory):
            loop.call_soon(look)
        return call_at(when, callback, *args, **kw)

    loop.call_at = spy  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        del loop.call_at


# -- expiry timing ---------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("timeout", [0.0, 0.0005, 0.001, 0.002, 0.015, 0.05, 0.1])
async def test_expiry_is_at_the_deadline_tick(timeout: float) -> None:
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[TimedOp]("timing") as p:
        op = TimedOp(timeout, "late")
        start = loop.time()
        assert await p.watch(op, ["k"]) == "late done"
        assert loop.time() == due(start, timeout)
        assert_expired_at_its_deadline(op, start)
        assert p.num_delayed() == 0
        assert p.statistics().expired == 1


@pytest.mark.asyncio
async def test_many_concurrent_timeouts_expire_each_at_its_tick_in_deadline_order() -> None:
    loop = asyncio.get_running_loop()
    timeouts = [i * 0.0037 % 0.2 for i in range(60)]
    log: list[str] = []
    async with DelayedOperationPurgatory[TimedOp]("many") as p:
        ops = [TimedOp(t, str(i), log) for i, t in enumerate(timeouts)]
        start = loop.time()
        for i, op in enumerate(ops):
            assert p.try_complete_else_watch(op, [i % 7]) is False
        results = await asyncio.gather(*(outcome(op) for op in ops))
        assert results == [f"{i} done" for i in range(len(ops))]
        assert loop.time() == due(start, max(timeouts))
        for op in ops:
            assert_expired_at_its_deadline(op, start)
        expiry_ticks = [due(start, timeouts[int(name)]) for name in log]
        assert expiry_ticks == sorted(expiry_ticks)
        assert p.statistics().expired == len(ops)
        assert p.num_delayed() == 0


@pytest.mark.asyncio
async def test_earlier_deadline_wakes_the_sleeping_reaper() -> None:
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[TimedOp]("wake") as p:
        slow = TimedOp(30.0)
        slow_task = asyncio.create_task(p.watch(slow, ["slow"]))
        await asyncio.sleep(0.02)  # the reaper is now asleep until the 30 s deadline
        assert p.num_delayed() == 1
        fast = TimedOp(0.05, "fast")
        start = loop.time()
        assert await p.watch(fast, ["fast"]) == "fast done"
        assert_expired_at_its_deadline(fast, start)
        assert loop.time() == due(start, 0.05)
        assert not slow.is_completed
        assert p.num_delayed() == 1
    with pytest.raises(PurgatoryClosed):
        await slow_task
    assert slow.is_cancelled
    assert slow.calls == []


@pytest.mark.asyncio
async def test_purge_runs_promptly_with_a_reaper() -> None:
    """Once enough watched operations finished, a pass purges without waiting for a deadline."""
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[TimedOp]("purge", purge_interval=10) as p:
        long = TimedOp(30.0)
        assert p.try_complete_else_watch(long, ["long"]) is False
        ops = [TimedOp(30.0) for _ in range(20)]
        for op in ops:
            assert p.try_complete_else_watch(op, ["a", "b"]) is False
        for op in ops:
            assert op.force_complete() is True
        assert p.num_delayed() == 1
        start = loop.time()
        await spin()
        assert loop.time() == start  # no time passed: the purge did not wait for a timer
        stats = p.statistics()
        assert (stats.watched, stats.keys, stats.purged, stats.delayed) == (1, 1, 40, 1)
        assert not long.is_completed


@pytest.mark.asyncio
async def test_a_big_purge_runs_in_slices_that_let_the_loop_run() -> None:
    """A burst of garbage is purged a slice per reaper pass, other callbacks running between."""
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[TimedOp]("slices", purge_interval=0) as p:
        n = 3 * PASS_BUDGET + 7
        ops = [TimedOp(30.0) for _ in range(n)]
        for i, op in enumerate(ops):
            p.try_complete_else_watch(op, ["shared", i])
        assert p.watched() == 2 * n
        for op in ops:
            op.force_complete()
        seen: list[int] = []

        def observe() -> None:  # every loop iteration, until the purge is done (or time must pass)
            seen.append(p.watched())
            if seen[-1] and len(seen) < 10_000:
                loop.call_soon(observe)

        loop.call_soon(observe)
        await until(lambda: p.watched() == 0, "purged")
        assert p.statistics().purged == 2 * n
        between = sorted({w for w in seen if 0 < w < 2 * n}, reverse=True)
        # Each slice removes PASS_BUDGET operations (two entries each); we saw the states between.
        assert between[:3] == [2 * (n - k * PASS_BUDGET) for k in (1, 2, 3)]


@pytest.mark.asyncio
async def test_a_big_cascade_runs_in_slices_that_let_the_loop_run() -> None:
    """Thousands of deadlines in one overflow bucket move down a slice per reaper pass.

    With the default 1024 slots of 1 ms, level-1 buckets span 512 ms; a 1.6 s timeout lands
    there and its cascade falls due before its span starts. The loop runs between the slices,
    and still each operation expires at its deadline tick.
    """
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[TimedOp]("cascade") as p:
        ops = [TimedOp(1.6) for _ in range(3 * PASS_BUDGET)]
        watched_at = loop.time()
        for i, op in enumerate(ops):
            p.try_complete_else_watch(op, [i])
        assert wheel_levels(p) == 2
        seen: list[bool] = []
        with looking_between_passes(p, lambda: seen.append(cascading(p))):
            await until(lambda: p.num_delayed() == 0, "expired", timeout=GUARD)
        for op in ops:
            assert_expired_at_its_deadline(op, watched_at)
        assert any(seen), "the loop never ran while a cascade was under way"


@pytest.mark.asyncio
async def test_shutdown_during_a_cascade_releases_every_operation() -> None:
    loop = asyncio.get_running_loop()
    p = DelayedOperationPurgatory[TimedOp]("cascade-shutdown")
    ops = [TimedOp(1.6) for _ in range(3 * PASS_BUDGET)]
    for i, op in enumerate(ops):
        p.try_complete_else_watch(op, [i])
    shutdowns: list[asyncio.Task[None]] = []

    def shut_down() -> None:
        if not shutdowns:
            shutdowns.append(loop.create_task(p.shutdown()))

    with looking_between_passes(p, shut_down):
        await until(lambda: bool(shutdowns), "a cascade under way", timeout=GUARD)
    await shutdowns[0]
    assert all(op.is_cancelled for op in ops)
    assert all(op.calls == [] for op in ops)
    refs = [weakref.ref(op) for op in ops]
    del ops, op
    gc.collect()
    assert all(ref() is None for ref in refs), "the closed purgatory still holds operations"


@pytest.mark.asyncio
async def test_the_reaper_sleeps_while_nothing_is_due() -> None:
    """Nothing pending, or one far deadline: no timer pass at all while the loop idles."""
    async with DelayedOperationPurgatory[TimedOp]("idle") as p:
        done = TimedOp(1.0)
        done.ready = True
        assert p.try_complete_else_watch(done, ["bind"]) is True
        await spin()
        idle_from = p.statistics().timer_passes
        await asyncio.sleep(10.0)
        assert p.statistics().timer_passes == idle_from
        p.try_complete_else_watch(TimedOp(30.0), ["far"])
        await spin()
        far_from = p.statistics().timer_passes
        await asyncio.sleep(10.0)
        assert p.statistics().timer_passes == far_from


@pytest.mark.asyncio
async def test_sparse_deadlines_cost_a_pass_per_deadline_not_per_tick() -> None:
    """Ten deadlines over 0.2 s (200 ticks): a timer pass at each, none in between."""
    async with DelayedOperationPurgatory[TimedOp]("sparse") as p:
        ops = [TimedOp(0.02 * (i + 1)) for i in range(10)]
        for i, op in enumerate(ops):
            p.try_complete_else_watch(op, [i])
        await spin()  # the reaper's first pass, as it starts
        before = p.statistics().timer_passes
        await until(lambda: p.num_delayed() == 0, "expired")
        assert p.statistics().timer_passes - before == len(ops)
        assert all(op.is_expired for op in ops)


# -- shutdown ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_shutdown_cancels_pending_operations() -> None:
    loop = asyncio.get_running_loop()
    baseline = asyncio.all_tasks()
    p = DelayedOperationPurgatory[DelayedOperation[str]]("shutdown")
    watched = [TimedOp(30.0) for _ in range(3)]
    watchers = [asyncio.create_task(p.watch(op, [f"k{i}", "all"])) for i, op in enumerate(watched)]
    plain = TimedOp(30.0)
    await spin()
    assert p.try_complete_else_watch(plain, ["all"]) is False
    plain_waiters = [asyncio.create_task(outcome(plain)) for _ in range(2)]
    gated = GatedOp(30.0)
    assert p.try_complete_else_watch(gated, ["all"]) is False  # an async attempt in flight
    await spin()
    assert p.num_delayed() == 5

    start = loop.time()
    await p.shutdown()
    assert loop.time() == start  # it waited for no timer
    assert p.closed
    for task in [*watchers, *plain_waiters]:
        with pytest.raises(PurgatoryClosed):
            await task
    for op in [*watched, plain]:
        assert op.is_cancelled
        assert not op.is_completed
        assert op.calls == []
    assert gated.is_cancelled
    assert (gated.completions, gated.expirations) == (0, 0)
    with pytest.raises(PurgatoryClosed):
        await plain
    assert p.num_delayed() == 0
    assert p.statistics().cancelled == 5

    # Closed for good: no watch of any kind.
    late = TimedOp(1.0)
    with pytest.raises(PurgatoryClosed):
        p.try_complete_else_watch(late, ["x"])
    with pytest.raises(PurgatoryClosed):
        await p.watch(TimedOp(1.0), ["x"])
    assert (late.calls, late.is_cancelled, p.num_delayed()) == ([], False, 0)

    await p.shutdown()  # idempotent
    assert p.closed
    await spin()
    assert asyncio.all_tasks() == baseline  # the reaper and the attempt task are gone

    # Nothing fires later either, past every deadline.
    await asyncio.sleep(60.0)
    assert all(op.calls == [] for op in [*watched, plain])


@pytest.mark.asyncio
async def test_async_with_shuts_down_on_exit() -> None:
    baseline = asyncio.all_tasks()
    op = TimedOp(30.0)
    async with DelayedOperationPurgatory[TimedOp]("ctx") as p:
        task = asyncio.create_task(p.watch(op, ["k"]))
        await until(lambda: p.num_delayed() == 1, "watched")
        assert not p.closed
    assert p.closed
    with pytest.raises(PurgatoryClosed):
        await task
    assert op.is_cancelled
    assert op.calls == []
    with pytest.raises(PurgatoryClosed):
        await p.watch(TimedOp(0.0), ["k"])
    await p.shutdown()
    await spin()
    assert asyncio.all_tasks() == baseline


@pytest.mark.asyncio
async def test_shutdown_of_an_unused_purgatory() -> None:
    p = DelayedOperationPurgatory[TimedOp]("unused")
    await p.shutdown()
    await p.shutdown()
    assert p.closed
    with pytest.raises(PurgatoryClosed):
        p.try_complete_else_watch(TimedOp(1.0), ["k"])


# -- cancellation ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_cancelling_the_watching_task_cancels_the_operation() -> None:
    async with DelayedOperationPurgatory[TimedOp]("cancel") as p:
        op = TimedOp(0.05)
        task, other = await watched_and_awaited(p, op, ["k1", "k2"])
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # At once: out of the timer, cancelled, no callback.
        assert op.is_cancelled
        assert not op.is_completed
        assert p.num_delayed() == 0
        assert p.statistics().cancelled == 1
        with pytest.raises(OperationCancelled) as caught:
            await other
        assert type(caught.value) is OperationCancelled
        # Its deadline passes: still nothing runs, nothing expires.
        await asyncio.sleep(0.1)
        assert op.calls == []
        assert not op.is_expired
        assert p.statistics().expired == 0
        # Triggers on its keys find it finished and drop it lazily.
        op.ready = True
        assert p.check_and_complete("k1") == 0
        assert op.calls == []
        assert op.force_complete() is False


@pytest.mark.asyncio
async def test_cancelling_one_awaiter_only_ends_that_wait() -> None:
    async with DelayedOperationPurgatory[TimedOp]("awaiters") as p:
        op = TimedOp(30.0, "shared")
        assert p.try_complete_else_watch(op, ["k"]) is False
        waiters = [asyncio.create_task(outcome(op)) for _ in range(3)]
        await spin()
        waiters[1].cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiters[1]
        await spin()
        assert not op.is_cancelled
        assert not op.is_completed
        assert p.num_delayed() == 1
        assert not waiters[0].done()
        assert not waiters[2].done()
        op.ready = True
        assert p.check_and_complete("k") == 1
        assert await waiters[0] == "shared done"
        assert await waiters[2] == "shared done"
        assert await op == "shared done"
        assert op.calls == ["complete"]


@pytest.mark.asyncio
async def test_cancelling_an_awaiter_does_not_cancel_the_watch() -> None:
    async with DelayedOperationPurgatory[TimedOp]("watch-and-await") as p:
        op = TimedOp(30.0, "kept")
        watcher, bystander = await watched_and_awaited(p, op, ["k"])
        bystander.cancel()
        with pytest.raises(asyncio.CancelledError):
            await bystander
        assert not op.is_cancelled
        assert p.num_delayed() == 1
        op.ready = True
        assert p.check_and_complete("k") == 1
        assert await watcher == "kept done"


@pytest.mark.asyncio
async def test_awaiters_timing_out_do_not_disturb_the_others() -> None:
    async with DelayedOperationPurgatory[TimedOp]("timeouts") as p:
        op = TimedOp(30.0, "v")
        watcher = asyncio.create_task(p.watch(op, ["k"]))
        waiter = asyncio.create_task(outcome(op))
        await until(lambda: p.num_delayed() == 1, "watched")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(outcome(op), 0.01)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):  # cancels and uncancels this very task
                await op
        await spin()
        assert not op.is_cancelled
        assert p.num_delayed() == 1
        assert not watcher.done()
        assert not waiter.done()
        op.ready = True
        assert p.check_and_complete("k") == 1
        assert await watcher == "v done"
        assert await waiter == "v done"
        assert await op == "v done"  # this task, timed out twice, can still await it


@pytest.mark.asyncio
@pytest.mark.parametrize("cancel_first", [True, False])
async def test_awaiter_cancelled_in_the_iteration_the_operation_completes(
    cancel_first: bool,
) -> None:
    async with DelayedOperationPurgatory[TimedOp]("same-iteration") as p:
        op = TimedOp(30.0, "v")
        assert p.try_complete_else_watch(op, ["k"]) is False
        waiters = [asyncio.create_task(outcome(op)) for _ in range(3)]
        await spin()
        op.ready = True
        if cancel_first:
            waiters[0].cancel()
            assert p.check_and_complete("k") == 1
        else:
            assert p.check_and_complete("k") == 1
            waiters[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiters[0]
        assert await waiters[1] == "v done"
        assert await waiters[2] == "v done"
        assert not op.is_cancelled
        assert op.calls == ["complete"]


# -- await op: value and exceptions ------------------------------------------------------------


@pytest.mark.asyncio
async def test_await_op_returns_on_complete_value() -> None:
    async with DelayedOperationPurgatory[TimedOp]("value") as p:
        op = TimedOp(30.0, "v1")
        assert p.try_complete_else_watch(op, ["k"]) is False
        waiter = asyncio.create_task(outcome(op))
        await spin()
        op.ready = True
        assert p.check_and_complete("k") == 1
        assert await waiter == "v1 done"
        assert await op == "v1 done"  # again, after the fact
        assert not op.is_expired

        expiring = TimedOp(0.01, "v2")
        assert p.try_complete_else_watch(expiring, ["k"]) is False
        assert await expiring == "v2 done"
        assert expiring.is_expired

        immediate = TimedOp(30.0, "v3")
        immediate.ready = True
        assert await p.watch(immediate, ["k"]) == "v3 done"
        assert await immediate == "v3 done"


@pytest.mark.asyncio
async def test_await_op_reraises_what_on_complete_raised() -> None:
    reported = loop_errors()
    async with DelayedOperationPurgatory[FlagOperation]("raise") as p:
        # Awaited while it completes: the error goes to the awaiter.
        op = Raises(30.0, "on_complete", LookupError("on_complete failed"))
        assert p.try_complete_else_watch(op, ["k"]) is False
        waiter = asyncio.create_task(outcome(op))
        await spin()
        op.ready = True
        p.check_and_complete("k")
        assert op.is_completed
        with pytest.raises(LookupError) as caught:
            await waiter
        assert caught.value is op.error
        with pytest.raises(LookupError) as caught:
            await op
        assert caught.value is op.error
        assert op.calls == ["complete"]
        assert reported.contexts == []

        # Raised on expiry: await re-raises it, on_expiration still ran once.
        expiring = Raises(0.01, "on_complete", LookupError("on_complete failed"))
        with pytest.raises(LookupError) as caught:
            await p.watch(expiring, ["k"])
        assert caught.value is expiring.error
        assert expiring.is_expired
        assert expiring.calls == ["complete", "expire"]

        # Nobody waiting when it raised: reported, and a later await still raises it.
        lonely = Raises(30.0, "on_complete", LookupError("on_complete failed"))
        assert p.try_complete_else_watch(lonely, ["k"]) is False
        lonely.ready = True
        p.check_and_complete("k")
        assert reported.exceptions == [lonely.error]
        with pytest.raises(LookupError) as caught:
            await lonely
        assert caught.value is lonely.error

        # The reaper survived all of it.
        after = FlagOperation(0.01, "after")
        assert await p.watch(after, ["k"]) == "after done"
        assert after.is_expired


# -- one timer handle, no task per operation ---------------------------------------------------


class TimerSpy:
    """Counts the loop timer handles created through call_at / call_later and still pending."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls = 0
        self.records: list[tuple[asyncio.TimerHandle, list[bool]]] = []
        self._inside = False
        self._call_at = loop.call_at
        self._call_later = loop.call_later

    def _wrap(self, real: Callable[..., asyncio.TimerHandle]) -> Callable[..., asyncio.TimerHandle]:
        def spy(when: float, callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
            if self._inside:  # uvloop's call_at goes through call_later: count it once
                return real(when, callback, *args, **kw)
            fired = [False]

            def run(*a: Any) -> None:
                fired[0] = True
                callback(*a)

            self._inside = True
            try:
                handle = real(when, run, *args, **kw)
            finally:
                self._inside = False
            self.calls += 1
            self.records.append((handle, fired))
            return handle

        return spy

    def __enter__(self) -> TimerSpy:
        self.loop.call_at = self._wrap(self._call_at)  # type: ignore[method-assign,assignment]
        self.loop.call_later = self._wrap(self._call_later)  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.loop.call_at
        del self.loop.call_later

    def live(self) -> int:
        return sum(1 for handle, fired in self.records if not fired[0] and not handle.cancelled())


def scheduled_timers(loop: asyncio.AbstractEventLoop) -> int | None:
    """Uncancelled timer handles of the stock asyncio loop (None on loops that hide them)."""
    scheduled = getattr(loop, "_scheduled", None)
    if scheduled is None:
        return None
    return sum(1 for handle in scheduled if not handle.cancelled())


@pytest.mark.asyncio
@pytest.mark.parametrize("order", ["random", "decreasing"])
async def test_one_timer_handle_however_many_pending(order: str) -> None:
    loop = asyncio.get_running_loop()
    n = 10_000
    if order == "random":
        timeouts = [10.0 + (i * 7919 % n) / 1000 for i in range(n)]
    else:
        timeouts = [10.0 + (n - i) / 1000 for i in range(n)]  # each one earlier than the last
    async with DelayedOperationPurgatory[TimedOp]("handles") as p:
        first = TimedOp(60.0)
        assert p.try_complete_else_watch(first, ["k"]) is False  # binds, starts the reaper
        await spin()
        before = scheduled_timers(loop)
        with TimerSpy(loop) as spy:
            ops = [TimedOp(t) for t in timeouts]
            for batch in range(10):
                for i in range(batch * 1000, (batch + 1) * 1000):
                    assert p.try_complete_else_watch(ops[i], [i % 100]) is False
                    if i % 997 == 0:
                        assert spy.live() <= 1
                await spin(3)  # let the reaper run between batches
            assert p.num_delayed() == n + 1
            assert spy.live() <= 1
            after = scheduled_timers(loop)
            if before is not None and after is not None:
                assert after - before <= 1
            if order == "random":
                assert spy.calls < n // 10, "a timer handle per operation"
            # The earliest deadline still wakes the reaper: complete one via expiry quickly.
            quick = TimedOp(0.02, "quick")
            assert await p.watch(quick, ["q"]) == "quick done"
            assert quick.is_expired
            assert spy.live() <= 1
            assert spy.calls >= 1  # the spy does see the reaper's timer


@pytest.mark.asyncio
async def test_no_task_per_pending_operation() -> None:
    async with DelayedOperationPurgatory[TimedOp]("tasks") as p:
        assert p.try_complete_else_watch(TimedOp(60.0), ["k"]) is False  # starts the reaper
        await spin()
        tasks_before = len(asyncio.all_tasks())
        ops = [TimedOp(30.0 + i / 1000) for i in range(10_000)]
        for i, op in enumerate(ops):
            assert p.try_complete_else_watch(op, [i % 10]) is False
        await spin()
        assert len(asyncio.all_tasks()) == tasks_before
        assert p.num_delayed() == 10_001
        for op in ops[:5000]:
            op.ready = True
        assert sum(p.check_and_complete(k) for k in range(10)) == 5000
        await spin()
        assert len(asyncio.all_tasks()) == tasks_before
        assert p.num_delayed() == 5001


# -- threads -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_check_and_complete_threadsafe_from_another_thread() -> None:
    loop_thread = threading.get_ident()
    async with DelayedOperationPurgatory[TimedOp]("threads") as p:
        op = TimedOp(30.0, "from thread")
        assert p.try_complete_else_watch(op, ["k"]) is False
        errors: list[Exception] = []

        def worker() -> None:
            try:
                op.ready = True
                p.check_and_complete_threadsafe("k")
            except Exception as exc:  # noqa: BLE001 - handed to the test thread
                errors.append(exc)

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()  # the trigger is queued on the loop, which has not run it yet
        assert not op.is_completed
        result = await asyncio.wait_for(outcome(op), GUARD)
        assert errors == []
        assert result == "from thread done"
        assert not op.is_expired
        assert op.calls == ["complete"]
        assert op.thread == loop_thread  # ran on the loop, not in the worker thread
        assert p.statistics().completed == 1
        assert p.num_delayed() == 0


@pytest.mark.asyncio
async def test_many_threadsafe_triggers() -> None:
    async with DelayedOperationPurgatory[TimedOp]("threads-many") as p:
        ops = [TimedOp(30.0, str(i)) for i in range(200)]
        for i, op in enumerate(ops):
            assert p.try_complete_else_watch(op, [i]) is False

        def worker(start: int) -> None:
            for i in range(start, len(ops), 4):
                ops[i].ready = True
                p.check_and_complete_threadsafe(i)

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        results = await asyncio.wait_for(asyncio.gather(*(outcome(op) for op in ops)), GUARD)
        assert results == [f"{i} done" for i in range(200)]
        assert all(op.calls == ["complete"] for op in ops)
        assert p.num_delayed() == 0


def test_threadsafe_without_a_bound_loop_raises() -> None:
    p = DelayedOperationPurgatory[TimedOp]("unbound")
    with pytest.raises(RuntimeError, match="loop"):
        p.check_and_complete_threadsafe("k")
    # Also from another thread, and for a manually clocked purgatory used without a loop.
    errors: list[Exception] = []

    def worker() -> None:
        try:
            p.check_and_complete_threadsafe("k")
        except Exception as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(5.0)
    assert len(errors) == 1
    assert isinstance(errors[0], RuntimeError)
    assert "loop" in str(errors[0])

    clock = ManualClock()
    manual = DelayedOperationPurgatory[TimedOp]("manual", clock=clock)
    op = TimedOp(1.0)
    assert manual.try_complete_else_watch(op, ["k"]) is False
    with pytest.raises(RuntimeError, match="loop"):
        manual.check_and_complete_threadsafe("k")


@pytest.mark.asyncio
async def test_threadsafe_inside_a_loop_before_first_use_raises() -> None:
    async with DelayedOperationPurgatory[TimedOp]("not yet") as p:
        with pytest.raises(RuntimeError, match="loop"):
            p.check_and_complete_threadsafe("k")
        assert p.try_complete_else_watch(TimedOp(30.0), ["k"]) is False
        p.check_and_complete_threadsafe("k")  # bound now: no error
        await spin()


# -- async try_complete ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_try_complete_that_sleeps_completes_via_trigger() -> None:
    async with DelayedOperationPurgatory[TimedOp]("sleepy") as p:
        op = SleepyOp(30.0, "slept")
        task = asyncio.create_task(p.watch(op, ["k", "j"]))
        await until(lambda: p.num_delayed() == 1)
        await spin()
        assert not op.is_completed
        op.ready = True
        p.check_and_complete("j")
        assert await asyncio.wait_for(task, GUARD) == "slept done"
        assert not op.is_expired
        assert op.calls == ["complete"]
        assert p.num_delayed() == 0
        assert p.statistics().completed == 1


@pytest.mark.asyncio
async def test_async_try_complete_awaiting_a_real_future() -> None:
    async with DelayedOperationPurgatory[TimedOp]("future") as p:
        op = FutureOp(30.0)
        assert p.try_complete_else_watch(op, ["k"]) is False
        assert p.num_delayed() == 1
        await asyncio.sleep(0.05)  # the first attempt said no
        assert op.attempts == 1
        assert not op.is_completed
        op.ready = True
        p.check_and_complete("k")
        assert await asyncio.wait_for(outcome(op), GUARD) == "op done"
        assert op.attempts == 2
        assert not op.is_expired
        assert p.num_delayed() == 0

        # Completable from the start: the attempt started by the watch finishes it.
        ready = FutureOp(30.0)
        ready.ready = True
        assert await asyncio.wait_for(p.watch(ready, ["k"]), GUARD) == "op done"
        assert ready.attempts == 1
        assert not ready.is_expired


@pytest.mark.asyncio
async def test_async_try_complete_that_never_suspends_still_runs_in_its_own_task() -> None:
    async with DelayedOperationPurgatory[TimedOp]("eager") as p:
        now = EagerAsyncOp(30.0)
        now.ready = True
        assert p.try_complete_else_watch(now, ["k"]) is False  # not run in the caller's task
        assert not now.is_completed
        assert p.num_delayed() == 1
        assert await asyncio.wait_for(outcome(now), GUARD) == "op done"
        assert p.num_delayed() == 0

        later = EagerAsyncOp(30.0, "later")
        assert p.try_complete_else_watch(later, ["k"]) is False
        await spin()
        assert p.num_delayed() == 1
        later.ready = True
        assert p.check_and_complete("k") == 0  # async completions are not synchronous
        assert await asyncio.wait_for(outcome(later), GUARD) == "later done"
        assert p.num_delayed() == 0


@pytest.mark.asyncio
async def test_one_attempt_at_a_time_and_exactly_one_follow_up() -> None:
    async with DelayedOperationPurgatory[GatedOp]("gated") as p:
        op = GatedOp(30.0)
        assert p.try_complete_else_watch(op, ["k"]) is False
        await until(lambda: len(op.gates) == 1)
        assert (op.attempts, len(op.gates)) == (1, 1)
        assert p.num_delayed() == 1

        # Triggers during an attempt start nothing now...
        for _ in range(5):
            assert p.check_and_complete("k") == 0
        assert op.attempts == 1
        # ...and exactly one attempt after it.
        op.gates[0].set_result(None)
        await until(lambda: len(op.gates) == 2)
        await spin()
        await asyncio.sleep(0.01)
        assert op.attempts == 2
        assert op.max_running == 1

        # No trigger during the second attempt: no third one.
        op.gates[1].set_result(None)
        await spin()
        await asyncio.sleep(0.01)
        assert op.attempts == 2
        assert op.running == 0
        assert not op.is_completed

        # No lost wake-up: the condition becomes true during an attempt that already read it.
        assert p.check_and_complete("k") == 0
        await until(lambda: len(op.gates) == 3)
        assert op.attempts == 3
        op.ready = True
        assert p.check_and_complete("k") == 0
        op.gates[2].set_result(None)  # attempt 3 saw ready=False
        await until(lambda: len(op.gates) == 4)
        assert op.attempts == 4
        op.gates[3].set_result(None)  # attempt 4 saw ready=True
        assert await asyncio.wait_for(outcome(op), GUARD) == "gated"
        assert (op.completions, op.expirations) == (1, 0)
        assert op.max_running == 1
        assert p.num_delayed() == 0
        await spin()
        assert op.attempts == 4


@pytest.mark.asyncio
async def test_concurrent_triggers_on_many_keys_during_an_attempt() -> None:
    async with DelayedOperationPurgatory[GatedOp]("gated-keys") as p:
        op = GatedOp(30.0)
        assert p.try_complete_else_watch(op, ["a", "b", "c"]) is False
        await until(lambda: len(op.gates) == 1)
        for key in ["a", "b", "c", "a", "b", "c"]:
            assert p.check_and_complete(key) == 0
        op.ready = True
        op.gates[0].set_result(None)
        await until(lambda: len(op.gates) == 2)
        op.gates[1].set_result(None)
        assert await asyncio.wait_for(outcome(op), GUARD) == "gated"
        await spin()
        await asyncio.sleep(0.01)
        assert op.attempts == 2
        assert op.max_running == 1


@pytest.mark.asyncio
async def test_expiry_during_an_async_attempt() -> None:
    async with DelayedOperationPurgatory[GatedOp]("gated-expiry") as p:
        op = GatedOp(0.03)
        op.ready = True  # the attempt would complete it, but its gate stays shut past the deadline
        assert p.try_complete_else_watch(op, ["k"]) is False
        assert await asyncio.wait_for(outcome(op), GUARD) == "gated"
        assert op.is_expired
        assert (op.completions, op.expirations) == (1, 0 + 1)
        op.gates[0].set_result(None)
        await until(lambda: op.running == 0)
        await spin()
        assert op.late_force_complete is False
        assert (op.completions, op.expirations) == (1, 1)
        assert p.statistics().expired == 1
        assert p.statistics().completed == 0


# -- one clock: the loop's ------------------------------------------------------------------------


def test_a_patched_loop_time_is_the_one_clock() -> None:
    loop = asyncio.new_event_loop()
    virtual = [time.monotonic() + 1000.0]
    try:
        with mock.patch.object(loop, "time", side_effect=lambda: virtual[0]):

            async def scenario() -> bool:
                async with DelayedOperationPurgatory[FlagOperation]("virtual") as p:
                    op = FlagOperation(10.0)
                    p.try_complete_else_watch(op, ["k"])
                    await asyncio.sleep(0)
                    await asyncio.sleep(0)
                    early = op.is_completed
                    virtual[0] += 10.0 + 0.002  # past the deadline rounded up to the tick
                    for _ in range(20):
                        await asyncio.sleep(0)
                        if op.is_completed:
                            break
                    return not early and op.is_expired

            assert loop.run_until_complete(scenario())
    finally:
        loop.close()


# -- the reaper cannot be killed by accident ------------------------------------------------------


@pytest.mark.asyncio
async def test_a_reaper_cancelled_from_outside_comes_back() -> None:
    recorder = loop_errors()
    async with DelayedOperationPurgatory[FlagOperation]("cancel-all") as p:
        op = FlagOperation(0.05)
        waiter = asyncio.create_task(p.watch(op, ["k"]))
        await asyncio.sleep(0)
        me = asyncio.current_task()
        for task in asyncio.all_tasks():  # a shutdown helper that cancels "all other tasks"
            if task is not me and task is not waiter:
                task.cancel()
        assert await asyncio.wait_for(waiter, GUARD) == "op done"
        assert op.is_expired
        assert reaper_restarts(p) == 1
        # Idle when cancelled: it comes back with the next watch.
        for task in asyncio.all_tasks():
            if task is not me:
                task.cancel()
        await asyncio.sleep(0.01)
        late = FlagOperation(0.02)
        assert await asyncio.wait_for(p.watch(late, ["k"]), GUARD) == "op done"
        assert late.is_expired
        assert reaper_restarts(p) == 2
    assert [c["message"].split(";")[0] for c in recorder.contexts] == [
        "the reaper of purgatory 'cancel-all' ended unexpectedly (CancelledError)"
    ] * 2


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["on_complete", "on_expiration"])
@pytest.mark.parametrize("error", [Custom("mine"), asyncio.CancelledError("leaked")])
async def test_a_base_exception_in_an_expiry_callback_is_that_operations_failure(
    where: str, error: BaseException
) -> None:
    recorder = loop_errors()
    async with DelayedOperationPurgatory[FlagOperation]("base-exc") as p:
        bad = Raises(0.01, where, error)
        bad_waiter = asyncio.create_task(p.watch(bad, ["k"]))
        bystanders = [FlagOperation(0.02 + 0.01 * i) for i in range(3)]
        waiters = [asyncio.create_task(p.watch(op, ["k"])) for op in bystanders]
        assert await asyncio.wait_for(asyncio.gather(*waiters), GUARD) == ["op done"] * 3
        outcome = await asyncio.wait_for(asyncio.gather(bad_waiter, return_exceptions=True), GUARD)
        if where == "on_complete" and isinstance(error, asyncio.CancelledError):
            # Raised as such, it would cancel the awaiting task: it comes as a RuntimeError.
            assert isinstance(outcome[0], RuntimeError)
            assert outcome[0].__cause__ is error
        elif where == "on_complete":
            assert list(outcome) == [error]
        else:
            assert list(outcome) == ["fine"]
            assert recorder.exceptions == [error]
        later = FlagOperation(0.01)
        assert await asyncio.wait_for(p.watch(later, ["k"]), GUARD) == "op done"
        check_invariants(p)


@EACH_LOOP
@pytest.mark.parametrize("where", ["on_complete", "on_expiration"])
def test_a_keyboard_interrupt_in_an_expiry_propagates_and_the_reaper_goes_on(
    new_loop: NewLoop, where: str
) -> None:
    loop = new_loop()
    recorder = Recorder()
    loop.set_exception_handler(recorder)
    p = DelayedOperationPurgatory[FlagOperation]("interrupt")
    bad = Raises(0.01, where, KeyboardInterrupt())
    bystanders = [FlagOperation(0.01) for _ in range(3)]

    async def watch_all() -> list[asyncio.Task[str]]:
        tasks = [loop.create_task(p.watch(bad, ["k"]))]
        tasks += [loop.create_task(p.watch(op, ["k"])) for op in bystanders]
        return tasks

    try:
        tasks = loop.run_until_complete(watch_all())
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(asyncio.sleep(1.0))
        check_invariants(p)
        assert bad.is_expired
        # The loop goes on (an application that handles Ctrl-C and keeps serving).
        done = loop.run_until_complete(
            asyncio.wait_for(asyncio.gather(*tasks[1:], return_exceptions=True), GUARD)
        )
        assert done == ["op done"] * 3
        assert all(op.is_expired for op in bystanders)

        async def one_more() -> str:
            return await p.watch(FlagOperation(0.01), ["k"])

        assert loop.run_until_complete(asyncio.wait_for(one_more(), GUARD)) == "op done"
        loop.run_until_complete(p.shutdown())
        gathered = loop.run_until_complete(asyncio.gather(tasks[0], return_exceptions=True))
        if where == "on_complete":  # the awaiter learns of it, without a second interrupt
            assert isinstance(gathered[0], RuntimeError)
            assert isinstance(gathered[0].__cause__, KeyboardInterrupt)
        else:
            assert list(gathered) == ["fine"]
    finally:
        loop.close()


@EACH_LOOP
def test_the_reaper_comes_back_in_a_program_without_tasks(new_loop: NewLoop) -> None:
    """A callback-based server (no task but the reaper) that handles Ctrl-C and goes on."""
    loop = new_loop()
    recorder = Recorder()
    loop.set_exception_handler(recorder)
    p = DelayedOperationPurgatory[FlagOperation]("callbacks")
    bad = Raises(0.01, "on_expiration", KeyboardInterrupt())
    bystander = FlagOperation(0.2)
    try:
        loop.call_soon(p.try_complete_else_watch, bad, ["k"])
        loop.call_soon(p.try_complete_else_watch, bystander, ["k"])
        with pytest.raises(KeyboardInterrupt):
            loop.run_forever()
        loop.call_later(1.0, loop.stop)
        loop.run_forever()
        assert bystander.is_expired
        assert reaper_restarts(p) == 1
        loop.run_until_complete(p.shutdown())
    finally:
        loop.close()


def test_no_reaper_comes_back_for_a_loop_that_winds_down() -> None:
    """More than purge_interval handlers parked, no shutdown: asyncio.run cancels them all."""
    recorder = Recorder()
    p = DelayedOperationPurgatory[FlagOperation]("wind-down", purge_interval=10)

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(recorder)
        tasks = [asyncio.create_task(p.watch(FlagOperation(30), [i])) for i in range(30)]
        await asyncio.sleep(0)
        assert not any(task.done() for task in tasks)

    asyncio.run(main())
    assert reaper_restarts(p) == 0
    assert recorder.contexts == []


@pytest.mark.asyncio
async def test_reaper_survives_raising_callbacks() -> None:
    recorder = loop_errors()
    async with DelayedOperationPurgatory[FlagOperation]("survivor") as p:
        first = RaisingExpiration(0.01)
        p.try_complete_else_watch(first, ["k"])
        second = RaisingComplete(0.03)
        with pytest.raises(Boom):
            await p.watch(second, ["k"])
        assert first.is_expired
        third = FlagOperation(0.01)
        assert await p.watch(third, ["k"]) == "op done"
        assert third.is_expired
    assert [str(e) for e in recorder.exceptions] == ["on_expiration"]


# -- async attempts run in a task and a context of their own --------------------------------------


probe: contextvars.ContextVar[str] = contextvars.ContextVar("probe", default="caller")


class Bounded(DelayedOperation[str]):
    """An attempt bounded by its own timeout, which sets a context variable."""

    def __init__(self) -> None:
        super().__init__(30.0)
        self.outcomes: list[str] = []

    async def try_complete(self) -> bool:
        token = probe.set("attempt")
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(1)
        except TimeoutError:
            self.outcomes.append("timed out")
        probe.reset(token)
        probe.set("leaked?")
        return False

    def on_complete(self) -> str:
        return "done"

    def on_expiration(self) -> None:
        pass


@pytest.mark.asyncio
async def test_an_async_attempt_runs_in_its_own_task_and_context() -> None:
    recorder = loop_errors()
    async with DelayedOperationPurgatory[Bounded]("own-task") as p:
        op = Bounded()
        assert not p.try_complete_else_watch(op, ["k"])
        await until(lambda: len(op.outcomes) == 1)
        p.check_and_complete("k")  # as a notify handler would: it must not be cancelled
        await asyncio.sleep(0.05)  # this task was not cancelled by the attempt's timeout
        assert probe.get() == "caller"
        await until(lambda: len(op.outcomes) == 2)

        def from_thread() -> None:
            p.check_and_complete_threadsafe("k")

        thread = threading.Thread(target=from_thread)
        thread.start()
        thread.join()
        await until(lambda: len(op.outcomes) == 3)
        assert op.outcomes == ["timed out"] * 3
        assert probe.get() == "caller"
    assert recorder.contexts == []


@pytest.mark.asyncio
async def test_an_async_attempt_raising_a_base_exception_does_not_jam_the_operation() -> None:
    recorder = loop_errors()
    async with DelayedOperationPurgatory[FailsFirstAttempt]("jam") as p:
        op = FailsFirstAttempt(Custom("first attempt"))
        p.try_complete_else_watch(op, ["k"])
        await until(lambda: op.attempts == 1 and not attempt_running(p, op))
        p.check_and_complete("k")
        assert await asyncio.wait_for(outcome(op), GUARD) == "second time lucky"
    assert [type(e) for e in recorder.exceptions] == [Custom]


class Gated(DelayedOperation[str]):
    def __init__(self) -> None:
        super().__init__(30.0)
        self.ready = False
        self.attempts = 0
        self.gate = asyncio.Event()

    async def try_complete(self) -> bool:
        self.attempts += 1
        ready = self.ready
        await self.gate.wait()
        return self.force_complete() if ready else False

    def on_complete(self) -> str:
        return "done"

    def on_expiration(self) -> None:
        pass


@pytest.mark.asyncio
@pytest.mark.parametrize("when", ["before it starts", "with a trigger pending"])
async def test_an_attempt_cancelled_from_outside_runs_again(when: str) -> None:
    recorder = loop_errors()
    async with DelayedOperationPurgatory[Gated]("attempts") as p:
        op = Gated()
        op.gate.set()
        p.try_complete_else_watch(op, ["k"])
        if when == "with a trigger pending":
            await until(lambda: op.attempts == 1)
            op.gate.clear()
            await until(lambda: op.attempts == 1)
            p.check_and_complete("k")  # a second attempt is owed to this trigger
            await until(lambda: op.attempts == 2)
            op.ready = True
            p.check_and_complete("k")  # pending behind the running attempt
        (task,) = attempt_tasks(p)
        task.cancel()  # "cancel all other tasks"
        op.ready = True
        op.gate.set()
        assert await asyncio.wait_for(outcome(op), GUARD) == "done"
        assert not op.is_expired
    assert all("cancelled from outside" in c["message"] for c in recorder.contexts)
    assert len(recorder.contexts) == 1


# -- anyio on its asyncio backend -----------------------------------------------------------------


@EACH_LOOP
def test_watch_under_anyio_task_groups_and_cancel_scopes(new_loop: NewLoop) -> None:
    results: dict[str, object] = {}

    async def main() -> None:
        async with DelayedOperationPurgatory[FlagOperation]("anyio") as purgatory:
            completed = FlagOperation(30, "completed")
            abandoned = FlagOperation(30, "abandoned")
            expiring = FlagOperation(0.02, "expiring")

            async def wait(op: FlagOperation) -> None:
                results[op.name] = await purgatory.watch(op, ["k"])

            async with anyio.create_task_group() as group:
                group.start_soon(wait, completed)
                group.start_soon(wait, expiring)
                with anyio.move_on_after(0.05) as scope:
                    await purgatory.watch(abandoned, ["other"])
                assert scope.cancelled_caught
                completed.ready = True
                purgatory.check_and_complete("k")
            results["abandoned"] = abandoned.is_cancelled
            results["expired"] = expiring.is_expired
            results["delayed"] = purgatory.num_delayed()

    anyio.run(main, backend="asyncio", backend_options={"loop_factory": new_loop})
    assert results == {
        "completed": "completed done",
        "expiring": "expiring done",
        "abandoned": True,
        "expired": True,
        "delayed": 0,
    }


# -- Ported from Kafka's SystemTimerReaperTest ----------------------------------------------------
# With the real-time parts of Kafka's DelayedOperationTest. The purgatory's own reaper coroutine
# drives expirations from the loop's clock, here a virtual one: each operation expires exactly at
# its deadline tick, and a reaper that never woke would fail the test at once (the `GUARD`).


def now() -> float:
    return asyncio.get_running_loop().time()


@pytest.mark.asyncio
async def test_request_expiry() -> None:
    """Kafka ``DelayedOperationTest.testRequestExpiry``: r1 (20 ms) expires via the reaper."""
    async with DelayedOperationPurgatory[TimedOp]("mock") as purgatory:
        start = now()  # before the operations are made, as Kafka's test reads it
        r1 = TimedOp(0.020, "r1")
        r2 = TimedOp(200.0, "r2")
        assert not purgatory.try_complete_else_watch(r1, ["test1"])
        assert not purgatory.try_complete_else_watch(r2, ["test2"])
        assert not r1.is_completed
        async with asyncio.timeout(GUARD):
            assert await r1 == "r1 done"
        assert_expired_at_its_deadline(r1, start)
        assert now() == due(start, 0.020)
        assert not r2.is_completed
        assert purgatory.num_delayed() == 1
    assert r2.is_cancelled


@pytest.mark.asyncio
async def test_reaper() -> None:
    """Kafka ``SystemTimerReaperTest.testReaper``: three deadlines, each met, in order."""
    async with DelayedOperationPurgatory[TimedOp]("reaper") as purgatory:
        log: list[str] = []
        ops = [TimedOp(0.03 * i, f"t{i}", log) for i in (1, 2, 3)]
        start = now()
        waiters = [asyncio.create_task(purgatory.watch(op, [op.name])) for op in ops]
        async with asyncio.timeout(GUARD):
            results = await asyncio.gather(*waiters)
        assert results == ["t1 done", "t2 done", "t3 done"]
        assert log == ["t1", "t2", "t3"]
        for op in ops:
            assert_expired_at_its_deadline(op, start)
        assert purgatory.statistics().expired == 3


@pytest.mark.asyncio
async def test_zero_timeout_expires_on_the_next_reaper_pass() -> None:
    async with DelayedOperationPurgatory[TimedOp]("reaper") as purgatory:
        op = TimedOp(0)
        start = now()
        assert not purgatory.try_complete_else_watch(op, ["k"])
        assert not op.is_completed  # not inside the watch call
        assert purgatory.num_delayed() == 1
        async with asyncio.timeout(GUARD):
            await op
        assert_expired_at_its_deadline(op, start)
        assert op.expired_at == start  # on the next pass, with no time passing


@pytest.mark.asyncio
async def test_reaper_shutdown_is_prompt() -> None:
    """Kafka ``testReaperClose``: closing stops the reaper, however far its next deadline."""
    tasks_before = asyncio.all_tasks()
    purgatory = DelayedOperationPurgatory[TimedOp]("reaper")
    pending = TimedOp(100.0, "pending")
    waiter = asyncio.create_task(purgatory.watch(pending, ["k"]))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    started = now()
    async with asyncio.timeout(GUARD):
        await purgatory.shutdown()
        with pytest.raises(PurgatoryClosed):
            await waiter
    assert now() == started  # no timer was waited for
    assert pending.is_cancelled
    assert pending.calls == []
    assert asyncio.all_tasks() - tasks_before == set(), "shutdown left a task running"
    await purgatory.shutdown()  # idempotent
    with pytest.raises(PurgatoryClosed):
        purgatory.try_complete_else_watch(TimedOp(1.0), ["k"])


@pytest.mark.asyncio
async def test_nothing_expires_after_shutdown() -> None:
    purgatory = DelayedOperationPurgatory[TimedOp]("reaper")
    op = TimedOp(0.02)
    purgatory.try_complete_else_watch(op, ["k"])
    await purgatory.shutdown()
    await asyncio.sleep(60.0)
    assert op.calls == []
    assert op.is_cancelled
    with pytest.raises(PurgatoryClosed):
        await op


@pytest.mark.asyncio
async def test_shared_timer_between_consumers() -> None:
    """Kafka ``testSharedTimerBetweenConsumers``: the reaper re-arms after going idle."""
    async with DelayedOperationPurgatory[TimedOp]("shared-reaper") as purgatory:
        consumer1 = TimedOp(0.02, "consumer1")
        consumer2 = TimedOp(0.04, "consumer2")
        start = now()
        purgatory.try_complete_else_watch(consumer1, ["c1"])
        purgatory.try_complete_else_watch(consumer2, ["c2"])
        async with asyncio.timeout(GUARD):
            await consumer1
            await consumer2
        assert_expired_at_its_deadline(consumer1, start)
        assert_expired_at_its_deadline(consumer2, start)
        assert purgatory.num_delayed() == 0
        await asyncio.sleep(0.03)  # nothing timed: the reaper sleeps with no deadline

        await expires_on_time(purgatory, TimedOp(0.02, "late"), "c2")


@pytest.mark.asyncio
async def test_an_earlier_deadline_wakes_the_reaper_sooner() -> None:
    """The reaper sleeps toward a 60 s deadline; a 20 ms operation must not wait for it."""
    async with DelayedOperationPurgatory[TimedOp]("reaper") as purgatory:
        far = TimedOp(60.0, "far")
        purgatory.try_complete_else_watch(far, ["k"])
        await asyncio.sleep(0.01)  # let the reaper go to sleep
        await expires_on_time(purgatory, TimedOp(0.02, "near"), "k")
        assert not far.is_completed


@pytest.mark.asyncio
async def test_reaper_keeps_running_after_a_callback_raises() -> None:
    errors = loop_errors()
    async with DelayedOperationPurgatory[FlagOperation]("reaper") as purgatory:
        bad_expiry = Raises(0.01, "on_expiration", RuntimeError("bad_expiry: on_expiration"))
        bad_complete = Raises(0.01, "on_complete", ValueError("bad_complete: on_complete"))
        good = TimedOp(0.03, "good")
        start = now()
        purgatory.try_complete_else_watch(bad_expiry, ["k"])
        failing = asyncio.create_task(purgatory.watch(bad_complete, ["k"]))
        async with asyncio.timeout(GUARD):
            assert await purgatory.watch(good, ["k"]) == "good done"
            with pytest.raises(ValueError, match="bad_complete: on_complete"):
                await failing
            assert await bad_expiry == "fine"
        assert_expired_at_its_deadline(good, start)
        assert bad_expiry.calls == bad_complete.calls == ["complete", "expire"]
        # The on_expiration error has no awaiter: it reaches the loop's exception handler.
        # The on_complete error went to its awaiter instead, and is not reported twice.
        assert errors.exceptions == [bad_expiry.error]

        # And the reaper is still alive for what comes next.
        await expires_on_time(purgatory, TimedOp(0.02, "later"), "k")
        assert purgatory.statistics().expired == 4


@pytest.mark.asyncio
async def test_purge_runs_without_waiting_for_an_expiry() -> None:
    """With a reaper, a due purge runs promptly, not at the next deadline (here 100 s away)."""
    async with DelayedOperationPurgatory[TimedOp]("reaper", purge_interval=0) as purgatory:
        op = TimedOp(100.0)
        purgatory.try_complete_else_watch(op, ["a", "b", "c"])
        assert purgatory.watched() == 3
        assert op.force_complete()
        started = now()
        await spin()
        assert purgatory.watched() == 0
        assert now() == started
        stats = purgatory.statistics()
        assert (stats.purged, stats.keys, stats.delayed) == (3, 0, 0)


class TimedDelayedFuture(DelayedFuture):
    """Kafka's ``DelayedFuture``, noting when it completed."""

    completed_at: float | None = None

    def on_complete(self) -> int:
        self.completed_at = now()
        return super().on_complete()


@pytest.mark.asyncio
async def test_delayed_future_expires_on_the_reaper() -> None:
    """Kafka ``testDelayedFuture``, its last case: one future never completes."""
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[DelayedFuture]("testDelayedFuture") as purgatory:
        futures: list[asyncio.Future[int]] = [loop.create_future(), loop.create_future()]
        op = TimedDelayedFuture(0.05, futures)
        start = now()
        assert not purgatory.try_complete_else_watch(op, ["futures"])
        for future in futures:
            future.add_done_callback(lambda _: purgatory.check_and_complete("futures"))
        futures[0].set_result(40)
        async with asyncio.timeout(GUARD):
            assert await op == 40
        assert op.is_expired
        assert op.completed_at == due(start, 0.05)
        assert isinstance(futures[1].exception(), TimeoutError)


@pytest.mark.asyncio
async def test_cancelled_watch_leaves_the_timer_at_once() -> None:
    """Cancelling the task awaiting ``watch`` cancels the operation: it never expires."""
    async with DelayedOperationPurgatory[TimedOp]("reaper") as purgatory:
        op = TimedOp(5.0)
        waiter = asyncio.create_task(purgatory.watch(op, ["k"]))
        await asyncio.sleep(0)
        assert purgatory.num_delayed() == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert op.is_cancelled
        assert purgatory.num_delayed() == 0
        assert purgatory.statistics().next_deadline_in == math.inf
        check_invariants(purgatory)
        assert op.calls == []
        with pytest.raises(OperationCancelled):
            await op
        await asyncio.sleep(10.0)  # well past its deadline
        assert op.calls == []


# -- on the real clock ----------------------------------------------------------------------------
# What only a real clock shows, with bounds that catch a reaper that never wakes, not a slow one.

#: A minute: the bound of a real-clock wait, for a hang, not for a slow or loaded machine.
REAL_GUARD = 60.0


@pytest.mark.asyncio
@pytest.mark.realclock
@pytest.mark.parametrize("timeout", [0.0005, 0.015])
async def test_the_reaper_wakes_on_the_loops_real_timer(timeout: float) -> None:
    """The reaper's alarm is a real loop timer, and it fires: never early by the loop's clock."""
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[TimedOp]("real-timer") as p:
        op = TimedOp(timeout, "late")
        start = loop.time()
        async with asyncio.timeout(REAL_GUARD):
            assert await p.watch(op, ["k"]) == "late done"
        assert op.is_expired
        assert op.expired_at is not None
        # Deadlines are compared in ticks with a tolerance of 1e-6 tick (API.md), and two
        # loop times of a large magnitude differ with rounding noise.
        assert op.expired_at - start >= timeout - (1e-6 * TICK + 1e-9)


class Stamped(DelayedOperation[float]):
    """Notes ``time.monotonic()`` when created and when it completes."""

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.watched_at = time.monotonic()

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> float:
        return time.monotonic()

    def on_expiration(self) -> None:
        pass


@pytest.mark.asyncio
@pytest.mark.realclock
async def test_never_early_by_the_monotonic_clock() -> None:
    """uvloop rounds its timers to the millisecond and caches its clock: its timer may fire
    before a deadline by ``time.monotonic``; the reaper then finds nothing due and sleeps again.
    Deadlines between whole milliseconds, 600 of them: none expires early by that clock."""
    async with DelayedOperationPurgatory[Stamped]("monotonic") as p:
        ops = []
        for index in range(600):
            op = Stamped(0.001 + (index % 17) * 0.0007)
            p.try_complete_else_watch(op, ["k"])
            ops.append(op)
            if index % 50 == 0:
                await asyncio.sleep(0)
        results = await asyncio.wait_for(asyncio.gather(*(outcome(op) for op in ops)), REAL_GUARD)
    early = [
        (op.watched_at + op.timeout - ended)
        for op, ended in zip(ops, results, strict=True)
        if ended < op.watched_at + op.timeout
    ]
    assert early == []
