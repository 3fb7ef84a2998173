"""The purgatory on a real event loop (the stock asyncio loop and uvloop, see conftest.py).

Real time on a shared machine is noisy, so timing assertions are one-sided where it matters:
exact lower bounds (an operation never expires early, measured on the loop's own clock) and
loose upper bounds (it expires well within a second). The only slack in the lower bounds is the
documented one: deadlines are compared in integer ticks with a tolerance of about 1e-6 tick, and
loop times are floats of a large magnitude whose differences carry rounding noise.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from purgatory import (
    DelayedOperation,
    DelayedOperationPurgatory,
    OperationCancelled,
    PurgatoryClosed,
)
from purgatory._purgatory import CASCADE_SLICE, PURGE_SLICE
from purgatory.testing import ManualClock

TICK = 0.001  # the default tick
# The documented tolerance (1e-6 tick) plus float noise of subtracting two loop times.
SLACK = 1e-6 * TICK + 1e-9
LOOSE = 1.0  # generous upper bound for "promptly" on a loaded 2-core machine


class Op(DelayedOperation[str]):
    """A synchronous operation completed by a flag; records when and where its callbacks ran."""

    def __init__(self, timeout: float, value: str = "done") -> None:
        super().__init__(timeout)
        self.value = value
        self.ready = False
        self.completions = 0
        self.expirations = 0
        self.completed_at: float | None = None
        self.expired_at: float | None = None
        self.thread: int | None = None

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> str:
        self.completions += 1
        self.completed_at = asyncio.get_running_loop().time()
        self.thread = threading.get_ident()
        return self.value

    def on_expiration(self) -> None:
        self.expirations += 1
        self.expired_at = asyncio.get_running_loop().time()


class RaisingOp(Op):
    """An operation whose on_complete raises."""

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.error = LookupError("on_complete failed")

    def on_complete(self) -> str:
        super().on_complete()
        raise self.error


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


class SleepyOp(Op):
    """An async try_complete that yields to the loop once before deciding."""

    async def try_complete(self) -> bool:  # type: ignore[override]
        await asyncio.sleep(0)
        return self.force_complete() if self.ready else False


class FutureOp(Op):
    """An async try_complete that asks a real future (resolved by a loop timer) for the answer."""

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.attempts = 0

    async def try_complete(self) -> bool:  # type: ignore[override]
        self.attempts += 1
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bool] = loop.create_future()
        loop.call_later(0.005, answer.set_result, self.ready)
        return self.force_complete() if await answer else False


class EagerAsyncOp(Op):
    """An async try_complete that never suspends."""

    async def try_complete(self) -> bool:  # type: ignore[override]
        return self.force_complete() if self.ready else False


async def outcome(op: DelayedOperation[str]) -> str:
    """`await op` inside a task of its own."""
    return await op


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the loop run until `condition` holds; fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


async def spin(iterations: int = 20) -> None:
    """Let the loop run a few iterations (ready callbacks and tasks) without sleeping."""
    for _ in range(iterations):
        await asyncio.sleep(0)


# -- expiry timing ---------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("timeout", [0.0, 0.0005, 0.001, 0.002, 0.015, 0.05, 0.1])
async def test_expiry_is_never_early(timeout: float) -> None:
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[Op]("timing") as p:
        op = Op(timeout, value="late")
        start = loop.time()
        assert await p.watch(op, ["k"]) == "late"
        elapsed = loop.time() - start
        assert op.is_expired
        assert op.is_completed
        assert (op.completions, op.expirations) == (1, 1)
        assert op.expired_at is not None
        assert op.expired_at - start >= timeout - SLACK
        assert elapsed >= timeout - SLACK
        assert elapsed < timeout + LOOSE
        assert p.num_delayed() == 0
        assert p.statistics().expired == 1


@pytest.mark.asyncio
async def test_many_concurrent_timeouts_never_early() -> None:
    loop = asyncio.get_running_loop()
    timeouts = [i * 0.0037 % 0.2 for i in range(60)]
    async with DelayedOperationPurgatory[Op]("many") as p:
        ops = [Op(t) for t in timeouts]
        starts = []
        for i, op in enumerate(ops):
            starts.append(loop.time())
            assert p.try_complete_else_watch(op, [i % 7]) is False
        begin = starts[0]
        results = await asyncio.gather(*(outcome(op) for op in ops))
        assert results == ["done"] * len(ops)
        assert loop.time() - begin < max(timeouts) + LOOSE
        for op, start in zip(ops, starts, strict=True):
            assert op.is_expired
            assert op.expired_at is not None
            assert op.expired_at - start >= op.timeout - SLACK
        assert p.statistics().expired == len(ops)
        assert p.num_delayed() == 0


@pytest.mark.asyncio
async def test_earlier_deadline_wakes_the_sleeping_reaper() -> None:
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[Op]("wake") as p:
        slow = Op(30.0)
        slow_task = asyncio.create_task(p.watch(slow, ["slow"]))
        await asyncio.sleep(0.02)  # the reaper is now asleep until the 30 s deadline
        assert p.num_delayed() == 1
        fast = Op(0.05, value="fast")
        start = loop.time()
        assert await p.watch(fast, ["fast"]) == "fast"
        elapsed = loop.time() - start
        assert fast.is_expired
        assert 0.05 - SLACK <= elapsed < 0.05 + LOOSE
        assert not slow.is_completed
        assert p.num_delayed() == 1
    with pytest.raises(PurgatoryClosed):
        await slow_task
    assert slow.is_cancelled
    assert (slow.completions, slow.expirations) == (0, 0)


@pytest.mark.asyncio
async def test_purge_runs_promptly_with_a_reaper() -> None:
    """Once enough watched operations finished, a pass purges without waiting for a deadline."""
    async with DelayedOperationPurgatory[Op]("purge", purge_interval=10) as p:
        long = Op(30.0)
        assert p.try_complete_else_watch(long, ["long"]) is False
        ops = [Op(30.0) for _ in range(20)]
        for op in ops:
            assert p.try_complete_else_watch(op, ["a", "b"]) is False
        for op in ops:
            assert op.force_complete() is True
        assert p.num_delayed() == 1
        await until(lambda: p.watched() == 1)
        stats = p.statistics()
        assert (stats.watched, stats.keys, stats.purged, stats.delayed) == (1, 1, 40, 1)
        assert not long.is_completed


@pytest.mark.asyncio
async def test_a_big_purge_runs_in_slices_that_let_the_loop_run() -> None:
    """A burst of garbage is purged a slice per reaper pass, other callbacks running between."""
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[Op]("slices", purge_interval=0) as p:
        n = 3 * PURGE_SLICE + 7
        ops = [Op(30.0) for _ in range(n)]
        for i, op in enumerate(ops):
            p.try_complete_else_watch(op, ["shared", i])
        assert p.watched() == 2 * n
        for op in ops:
            op.force_complete()
        seen: list[int] = []

        def observe() -> None:
            seen.append(p.watched())
            if seen[-1]:
                loop.call_soon(observe)

        loop.call_soon(observe)
        await until(lambda: p.watched() == 0)
        assert p.statistics().purged == 2 * n
        between = sorted({w for w in seen if 0 < w < 2 * n}, reverse=True)
        # Each slice removes PURGE_SLICE operations (two entries each); we saw the states between.
        assert between[:3] == [2 * (n - k * PURGE_SLICE) for k in (1, 2, 3)]


@pytest.mark.asyncio
async def test_a_big_cascade_runs_in_slices_that_let_the_loop_run() -> None:
    """Thousands of deadlines in one overflow bucket move down a slice per reaper pass.

    With 64 slots of 1 ms, level-1 buckets span 32 ms; a 0.2 s timeout lands there and its
    cascade falls due 32 ms before its span starts. The loop runs between the slices, and still
    nothing expires early.
    """
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[Op]("cascade", wheel_size=64) as p:
        ops = [Op(0.2) for _ in range(3 * CASCADE_SLICE)]
        watched_at = loop.time()
        for i, op in enumerate(ops):
            p.try_complete_else_watch(op, [i])
        assert p._wheel.levels == 2
        seen: list[bool] = []

        def observe() -> None:
            seen.append(p._wheel.cascading is not None)
            if p.num_delayed():
                loop.call_soon(observe)

        loop.call_soon(observe)
        await until(lambda: p.num_delayed() == 0)
        assert all(op.expirations == 1 for op in ops)
        assert min(op.expired_at or 0.0 for op in ops) >= watched_at + 0.2 - SLACK
        assert any(seen), "the loop never ran while a cascade was under way"


@pytest.mark.asyncio
async def test_shutdown_during_a_cascade_releases_every_operation() -> None:
    loop = asyncio.get_running_loop()
    p = DelayedOperationPurgatory[Op]("cascade-shutdown", wheel_size=64)
    ops = [Op(0.2) for _ in range(3 * CASCADE_SLICE)]
    for i, op in enumerate(ops):
        p.try_complete_else_watch(op, [i])
    end = loop.time() + 5.0
    while p._wheel.cascading is None:
        assert loop.time() < end, "the cascade never started"
        await asyncio.sleep(0)
    await p.shutdown()
    assert all(op.is_cancelled for op in ops)
    refs = [weakref.ref(op) for op in ops]
    del ops, op
    gc.collect()
    assert all(ref() is None for ref in refs), "the closed purgatory still holds operations"


@pytest.mark.asyncio
async def test_the_reaper_sleeps_while_nothing_is_due() -> None:
    """Nothing pending, or one far deadline: no timer pass at all while the loop idles."""
    async with DelayedOperationPurgatory[Op]("idle") as p:
        done = Op(1.0)
        done.ready = True
        assert p.try_complete_else_watch(done, ["bind"]) is True
        await spin()
        idle_from = p.statistics().timer_passes
        await asyncio.sleep(0.1)
        assert p.statistics().timer_passes == idle_from
        p.try_complete_else_watch(Op(30.0), ["far"])
        await spin()
        far_from = p.statistics().timer_passes
        await asyncio.sleep(0.1)
        assert p.statistics().timer_passes == far_from


@pytest.mark.asyncio
async def test_sparse_deadlines_cost_a_pass_per_deadline_not_per_tick() -> None:
    """Ten deadlines over 0.2 s (200 ticks): about ten passes, never one per tick."""
    async with DelayedOperationPurgatory[Op]("sparse") as p:
        ops = [Op(0.02 * (i + 1)) for i in range(10)]
        before = p.statistics().timer_passes
        for i, op in enumerate(ops):
            p.try_complete_else_watch(op, [i])
        await until(lambda: p.num_delayed() == 0)
        passes = p.statistics().timer_passes - before
        # A wake-up a hair before a tick boundary finds nothing due and sleeps again: 2 per op.
        assert passes <= 2 * len(ops) + 1
        assert all(op.expirations == 1 for op in ops)


# -- shutdown ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_shutdown_cancels_pending_operations() -> None:
    loop = asyncio.get_running_loop()
    baseline = asyncio.all_tasks()
    p = DelayedOperationPurgatory[DelayedOperation[str]]("shutdown")
    watched = [Op(30.0) for _ in range(3)]
    watchers = [asyncio.create_task(p.watch(op, [f"k{i}", "all"])) for i, op in enumerate(watched)]
    plain = Op(30.0)
    await spin()
    assert p.try_complete_else_watch(plain, ["all"]) is False
    plain_waiters = [asyncio.create_task(outcome(plain)) for _ in range(2)]
    gated = GatedOp(30.0)
    assert p.try_complete_else_watch(gated, ["all"]) is False  # an async attempt in flight
    await spin()
    assert p.num_delayed() == 5

    start = loop.time()
    await p.shutdown()
    assert loop.time() - start < LOOSE
    assert p.closed
    for task in [*watchers, *plain_waiters]:
        with pytest.raises(PurgatoryClosed):
            await task
    for op in [*watched, plain]:
        assert op.is_cancelled
        assert not op.is_completed
        assert (op.completions, op.expirations) == (0, 0)
    assert gated.is_cancelled
    assert (gated.completions, gated.expirations) == (0, 0)
    with pytest.raises(PurgatoryClosed):
        await plain
    assert p.num_delayed() == 0
    assert p.statistics().cancelled == 5

    # Closed for good: no watch of any kind.
    late = Op(1.0)
    with pytest.raises(PurgatoryClosed):
        p.try_complete_else_watch(late, ["x"])
    with pytest.raises(PurgatoryClosed):
        await p.watch(Op(1.0), ["x"])
    assert (late.completions, late.is_cancelled, p.num_delayed()) == (0, False, 0)

    await p.shutdown()  # idempotent
    assert p.closed
    await spin()
    assert asyncio.all_tasks() == baseline  # the reaper and the attempt task are gone

    # Nothing fires later either.
    await asyncio.sleep(0.05)
    assert all(op.completions == 0 for op in [*watched, plain])


@pytest.mark.asyncio
async def test_async_with_shuts_down_on_exit() -> None:
    baseline = asyncio.all_tasks()
    op = Op(30.0)
    async with DelayedOperationPurgatory[Op]("ctx") as p:
        task = asyncio.create_task(p.watch(op, ["k"]))
        await until(lambda: p.num_delayed() == 1)
        assert not p.closed
    assert p.closed
    with pytest.raises(PurgatoryClosed):
        await task
    assert op.is_cancelled
    assert (op.completions, op.expirations) == (0, 0)
    with pytest.raises(PurgatoryClosed):
        await p.watch(Op(0.0), ["k"])
    await p.shutdown()
    await spin()
    assert asyncio.all_tasks() == baseline


@pytest.mark.asyncio
async def test_shutdown_of_an_unused_purgatory() -> None:
    p = DelayedOperationPurgatory[Op]("unused")
    await p.shutdown()
    await p.shutdown()
    assert p.closed
    with pytest.raises(PurgatoryClosed):
        p.try_complete_else_watch(Op(1.0), ["k"])


# -- cancellation ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_cancelling_the_watching_task_cancels_the_operation() -> None:
    async with DelayedOperationPurgatory[Op]("cancel") as p:
        op = Op(0.05)
        task = asyncio.create_task(p.watch(op, ["k1", "k2"]))
        await until(lambda: p.num_delayed() == 1)
        other = asyncio.create_task(outcome(op))
        await spin()
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
        assert (op.completions, op.expirations) == (0, 0)
        assert not op.is_expired
        assert p.statistics().expired == 0
        # Triggers on its keys find it finished and drop it lazily.
        op.ready = True
        assert p.check_and_complete("k1") == 0
        assert op.completions == 0
        assert op.force_complete() is False


@pytest.mark.asyncio
async def test_cancelling_one_awaiter_only_ends_that_wait() -> None:
    async with DelayedOperationPurgatory[Op]("awaiters") as p:
        op = Op(30.0, value="shared")
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
        assert await waiters[0] == "shared"
        assert await waiters[2] == "shared"
        assert await op == "shared"
        assert op.completions == 1


@pytest.mark.asyncio
async def test_cancelling_an_awaiter_does_not_cancel_the_watch() -> None:
    async with DelayedOperationPurgatory[Op]("watch-and-await") as p:
        op = Op(30.0, value="kept")
        watcher = asyncio.create_task(p.watch(op, ["k"]))
        await until(lambda: p.num_delayed() == 1)
        bystander = asyncio.create_task(outcome(op))
        await spin()
        bystander.cancel()
        with pytest.raises(asyncio.CancelledError):
            await bystander
        assert not op.is_cancelled
        assert p.num_delayed() == 1
        op.ready = True
        assert p.check_and_complete("k") == 1
        assert await watcher == "kept"


@pytest.mark.asyncio
async def test_awaiters_timing_out_do_not_disturb_the_others() -> None:
    async with DelayedOperationPurgatory[Op]("timeouts") as p:
        op = Op(30.0, value="v")
        watcher = asyncio.create_task(p.watch(op, ["k"]))
        waiter = asyncio.create_task(outcome(op))
        await until(lambda: p.num_delayed() == 1)
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
        assert await watcher == "v"
        assert await waiter == "v"
        assert await op == "v"  # this task, timed out twice, can still await it


@pytest.mark.asyncio
@pytest.mark.parametrize("cancel_first", [True, False])
async def test_awaiter_cancelled_in_the_iteration_the_operation_completes(
    cancel_first: bool,
) -> None:
    async with DelayedOperationPurgatory[Op]("same-iteration") as p:
        op = Op(30.0, value="v")
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
        assert await waiters[1] == "v"
        assert await waiters[2] == "v"
        assert not op.is_cancelled
        assert op.completions == 1


# -- await op: value and exceptions ------------------------------------------------------------


@pytest.mark.asyncio
async def test_await_op_returns_on_complete_value() -> None:
    async with DelayedOperationPurgatory[Op]("value") as p:
        op = Op(30.0, value="v1")
        assert p.try_complete_else_watch(op, ["k"]) is False
        waiter = asyncio.create_task(outcome(op))
        await spin()
        op.ready = True
        assert p.check_and_complete("k") == 1
        assert await waiter == "v1"
        assert await op == "v1"  # again, after the fact
        assert not op.is_expired

        expiring = Op(0.01, value="v2")
        assert p.try_complete_else_watch(expiring, ["k"]) is False
        assert await expiring == "v2"
        assert expiring.is_expired

        immediate = Op(30.0, value="v3")
        immediate.ready = True
        assert await p.watch(immediate, ["k"]) == "v3"
        assert await immediate == "v3"


@pytest.mark.asyncio
async def test_await_op_reraises_what_on_complete_raised() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        async with DelayedOperationPurgatory[Op]("raise") as p:
            # Awaited while it completes: the error goes to the awaiter.
            op = RaisingOp(30.0)
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
            assert op.completions == 1
            assert reported == []

            # Raised on expiry: await re-raises it, on_expiration still ran once.
            expiring = RaisingOp(0.01)
            with pytest.raises(LookupError) as caught:
                await p.watch(expiring, ["k"])
            assert caught.value is expiring.error
            assert expiring.is_expired
            assert (expiring.completions, expiring.expirations) == (1, 1)

            # Nobody waiting when it raised: reported, and a later await still raises it.
            lonely = RaisingOp(30.0)
            assert p.try_complete_else_watch(lonely, ["k"]) is False
            lonely.ready = True
            p.check_and_complete("k")
            assert [c.get("exception") for c in reported] == [lonely.error]
            with pytest.raises(LookupError) as caught:
                await lonely
            assert caught.value is lonely.error

            # The reaper survived all of it.
            after = Op(0.01, value="after")
            assert await p.watch(after, ["k"]) == "after"
            assert after.is_expired
    finally:
        loop.set_exception_handler(previous)


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
    async with DelayedOperationPurgatory[Op]("handles") as p:
        first = Op(60.0)
        assert p.try_complete_else_watch(first, ["k"]) is False  # binds, starts the reaper
        await spin()
        before = scheduled_timers(loop)
        with TimerSpy(loop) as spy:
            ops = [Op(t) for t in timeouts]
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
            quick = Op(0.02, value="quick")
            assert await p.watch(quick, ["q"]) == "quick"
            assert quick.is_expired
            assert spy.live() <= 1
            assert spy.calls >= 1  # the spy does see the reaper's timer


@pytest.mark.asyncio
async def test_no_task_per_pending_operation() -> None:
    async with DelayedOperationPurgatory[Op]("tasks") as p:
        assert p.try_complete_else_watch(Op(60.0), ["k"]) is False  # starts the reaper
        await spin()
        tasks_before = len(asyncio.all_tasks())
        ops = [Op(30.0 + i / 1000) for i in range(10_000)]
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
    async with DelayedOperationPurgatory[Op]("threads") as p:
        op = Op(30.0, value="from thread")
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
        result = await asyncio.wait_for(outcome(op), 5.0)
        thread.join(5.0)
        assert errors == []
        assert result == "from thread"
        assert not op.is_expired
        assert op.completions == 1
        assert op.thread == loop_thread  # ran on the loop, not in the worker thread
        assert p.statistics().completed == 1
        assert p.num_delayed() == 0


@pytest.mark.asyncio
async def test_many_threadsafe_triggers() -> None:
    async with DelayedOperationPurgatory[Op]("threads-many") as p:
        ops = [Op(30.0, value=str(i)) for i in range(200)]
        for i, op in enumerate(ops):
            assert p.try_complete_else_watch(op, [i]) is False

        def worker(start: int) -> None:
            for i in range(start, len(ops), 4):
                ops[i].ready = True
                p.check_and_complete_threadsafe(i)

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for thread in threads:
            thread.start()
        results = await asyncio.wait_for(asyncio.gather(*(outcome(op) for op in ops)), 5.0)
        for thread in threads:
            thread.join(5.0)
        assert results == [str(i) for i in range(200)]
        assert all(op.completions == 1 and not op.is_expired for op in ops)
        assert p.num_delayed() == 0


def test_threadsafe_without_a_bound_loop_raises() -> None:
    p = DelayedOperationPurgatory[Op]("unbound")
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
    manual = DelayedOperationPurgatory[Op]("manual", clock=clock)
    op = Op(1.0)
    assert manual.try_complete_else_watch(op, ["k"]) is False
    with pytest.raises(RuntimeError, match="loop"):
        manual.check_and_complete_threadsafe("k")


@pytest.mark.asyncio
async def test_threadsafe_inside_a_loop_before_first_use_raises() -> None:
    async with DelayedOperationPurgatory[Op]("not yet") as p:
        with pytest.raises(RuntimeError, match="loop"):
            p.check_and_complete_threadsafe("k")
        assert p.try_complete_else_watch(Op(30.0), ["k"]) is False
        p.check_and_complete_threadsafe("k")  # bound now: no error
        await spin()


# -- async try_complete ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_try_complete_that_sleeps_completes_via_trigger() -> None:
    async with DelayedOperationPurgatory[Op]("sleepy") as p:
        op = SleepyOp(30.0, value="slept")
        task = asyncio.create_task(p.watch(op, ["k", "j"]))
        await until(lambda: p.num_delayed() == 1)
        await spin()
        assert not op.is_completed
        op.ready = True
        p.check_and_complete("j")
        assert await asyncio.wait_for(task, 5.0) == "slept"
        assert not op.is_expired
        assert op.completions == 1
        assert p.num_delayed() == 0
        assert p.statistics().completed == 1


@pytest.mark.asyncio
async def test_async_try_complete_awaiting_a_real_future() -> None:
    async with DelayedOperationPurgatory[Op]("future") as p:
        op = FutureOp(30.0)
        assert p.try_complete_else_watch(op, ["k"]) is False
        assert p.num_delayed() == 1
        await asyncio.sleep(0.05)  # the first attempt said no
        assert op.attempts == 1
        assert not op.is_completed
        op.ready = True
        p.check_and_complete("k")
        assert await asyncio.wait_for(outcome(op), 5.0) == "done"
        assert op.attempts == 2
        assert not op.is_expired
        assert p.num_delayed() == 0

        # Completable from the start: the attempt started by the watch finishes it.
        ready = FutureOp(30.0)
        ready.ready = True
        assert await asyncio.wait_for(p.watch(ready, ["k"]), 5.0) == "done"
        assert ready.attempts == 1
        assert not ready.is_expired


@pytest.mark.asyncio
async def test_async_try_complete_that_never_suspends_still_runs_in_its_own_task() -> None:
    async with DelayedOperationPurgatory[Op]("eager") as p:
        now = EagerAsyncOp(30.0)
        now.ready = True
        assert p.try_complete_else_watch(now, ["k"]) is False  # not run in the caller's task
        assert not now.is_completed
        assert p.num_delayed() == 1
        assert await asyncio.wait_for(outcome(now), 5.0) == "done"
        assert p.num_delayed() == 0

        later = EagerAsyncOp(30.0, value="later")
        assert p.try_complete_else_watch(later, ["k"]) is False
        await spin()
        assert p.num_delayed() == 1
        later.ready = True
        assert p.check_and_complete("k") == 0  # async completions are not synchronous
        assert await asyncio.wait_for(outcome(later), 5.0) == "later"
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
        assert await asyncio.wait_for(outcome(op), 5.0) == "gated"
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
        assert await asyncio.wait_for(outcome(op), 5.0) == "gated"
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
        assert await asyncio.wait_for(outcome(op), 5.0) == "gated"
        assert op.is_expired
        assert (op.completions, op.expirations) == (1, 0 + 1)
        op.gates[0].set_result(None)
        await until(lambda: op.running == 0)
        await spin()
        assert op.late_force_complete is False
        assert (op.completions, op.expirations) == (1, 1)
        assert p.statistics().expired == 1
        assert p.statistics().completed == 0
