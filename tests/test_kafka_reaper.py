"""Kafka's ``SystemTimerReaperTest`` and the real-time parts of ``DelayedOperationTest``.

These run on a real event loop (asyncio and uvloop, see conftest.py), with the purgatory's own
reaper coroutine driving expirations from the loop's clock. The machine may be slow and shared:
lower bounds ("never early") are asserted exactly, in the loop's own time; upper bounds only
loosely, to catch a reaper that never wakes, not one that is a little late.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from helpers import DelayedFuture

from purgatory import (
    DelayedOperation,
    DelayedOperationPurgatory,
    OperationCancelled,
    PurgatoryClosed,
)

# API.md: deadlines are rounded up and the current time down, each with a tolerance of about
# 1e-6 tick for float rounding; with the default 1 ms tick that is 1 ns each way.
FLOAT_SLACK = 2e-9
# How late is "too late": only a reaper that failed to wake is that late.
LOOSE = 1.0


def now() -> float:
    return asyncio.get_running_loop().time()


class TimedOp(DelayedOperation[str]):
    """Kafka's ``MockDelayedOperation``, recording the loop time of each callback."""

    def __init__(self, timeout: float, name: str = "op", log: list[str] | None = None) -> None:
        super().__init__(timeout)
        self.name = name
        self.log = log
        self.completable = False
        self.calls: list[str] = []
        self.completed_at: float | None = None
        self.expired_at: float | None = None

    def try_complete(self) -> bool:
        if self.completable:
            return self.force_complete()
        return False

    def on_complete(self) -> str:
        self.calls.append("complete")
        self.completed_at = now()
        return f"{self.name} done"

    def on_expiration(self) -> None:
        self.calls.append("expire")
        self.expired_at = now()
        if self.log is not None:
            self.log.append(self.name)


def record_loop_errors() -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    return errors


def assert_expired_on_time(op: TimedOp, watched_at: float) -> None:
    """Expired, not before its deadline, and not absurdly late."""
    assert op.is_expired, op
    assert op.calls == ["complete", "expire"]
    assert op.expired_at is not None
    assert op.expired_at >= watched_at + op.timeout - FLOAT_SLACK, "expired before its deadline"
    assert op.expired_at < watched_at + op.timeout + LOOSE, "the reaper did not wake up"


@pytest.mark.asyncio
async def test_request_expiry() -> None:
    """Kafka ``DelayedOperationTest.testRequestExpiry``: r1 (20 ms) expires via the reaper."""
    async with DelayedOperationPurgatory[TimedOp]("mock") as purgatory:
        r1 = TimedOp(0.020, "r1")
        r2 = TimedOp(200.0, "r2")
        start = now()
        assert not purgatory.try_complete_else_watch(r1, ["test1"])
        assert not purgatory.try_complete_else_watch(r2, ["test2"])
        assert not r1.is_completed
        async with asyncio.timeout(LOOSE + 5):
            assert await r1 == "r1 done"
        assert_expired_on_time(r1, start)
        assert now() >= start + 0.020 - FLOAT_SLACK
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
        async with asyncio.timeout(LOOSE + 5):
            results = await asyncio.gather(*waiters)
        assert results == ["t1 done", "t2 done", "t3 done"]
        assert log == ["t1", "t2", "t3"]
        for op in ops:
            assert_expired_on_time(op, start)
        assert purgatory.statistics().expired == 3


@pytest.mark.asyncio
async def test_zero_timeout_expires_on_the_next_reaper_pass() -> None:
    async with DelayedOperationPurgatory[TimedOp]("reaper") as purgatory:
        op = TimedOp(0)
        start = now()
        assert not purgatory.try_complete_else_watch(op, ["k"])
        assert not op.is_completed  # not inside the watch call
        assert purgatory.num_delayed() == 1
        async with asyncio.timeout(LOOSE + 5):
            await op
        assert_expired_on_time(op, start)


@pytest.mark.asyncio
async def test_reaper_shutdown_is_prompt() -> None:
    """Kafka ``testReaperClose``: closing stops the reaper, however far its next deadline."""
    tasks_before = asyncio.all_tasks()
    purgatory = DelayedOperationPurgatory[TimedOp]("reaper")
    pending = TimedOp(100.0, "pending")
    waiter = asyncio.create_task(purgatory.watch(pending, ["k"]))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    started = time.monotonic()
    async with asyncio.timeout(LOOSE + 5):
        await purgatory.shutdown()
        with pytest.raises(PurgatoryClosed):
            await waiter
    assert time.monotonic() - started < LOOSE
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
    await asyncio.sleep(0.05)
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
        async with asyncio.timeout(LOOSE + 5):
            await consumer1
            await consumer2
        assert_expired_on_time(consumer1, start)
        assert_expired_on_time(consumer2, start)
        assert purgatory.num_delayed() == 0
        await asyncio.sleep(0.03)  # nothing timed: the reaper sleeps with no deadline

        late = TimedOp(0.02, "late")
        late_start = now()
        purgatory.try_complete_else_watch(late, ["c2"])
        async with asyncio.timeout(LOOSE + 5):
            await late
        assert_expired_on_time(late, late_start)


@pytest.mark.asyncio
async def test_an_earlier_deadline_wakes_the_reaper_sooner() -> None:
    """The reaper sleeps toward a 60 s deadline; a 20 ms operation must not wait for it."""
    async with DelayedOperationPurgatory[TimedOp]("reaper") as purgatory:
        far = TimedOp(60.0, "far")
        purgatory.try_complete_else_watch(far, ["k"])
        await asyncio.sleep(0.01)  # let the reaper go to sleep
        near = TimedOp(0.02, "near")
        start = now()
        purgatory.try_complete_else_watch(near, ["k"])
        async with asyncio.timeout(LOOSE + 5):
            await near
        assert_expired_on_time(near, start)
        assert not far.is_completed


class RaisingOp(TimedOp):
    def __init__(self, timeout: float, name: str, where: str) -> None:
        super().__init__(timeout, name)
        self.where = where

    def on_complete(self) -> str:
        result = super().on_complete()
        if self.where == "on_complete":
            raise ValueError(f"{self.name}: on_complete failed")
        return result

    def on_expiration(self) -> None:
        super().on_expiration()
        if self.where == "on_expiration":
            raise RuntimeError(f"{self.name}: on_expiration failed")


@pytest.mark.asyncio
async def test_reaper_keeps_running_after_a_callback_raises() -> None:
    errors = record_loop_errors()
    async with DelayedOperationPurgatory[TimedOp]("reaper") as purgatory:
        bad_expiry = RaisingOp(0.01, "bad_expiry", "on_expiration")
        bad_complete = RaisingOp(0.01, "bad_complete", "on_complete")
        good = TimedOp(0.03, "good")
        start = now()
        purgatory.try_complete_else_watch(bad_expiry, ["k"])
        failing = asyncio.create_task(purgatory.watch(bad_complete, ["k"]))
        async with asyncio.timeout(LOOSE + 5):
            assert await purgatory.watch(good, ["k"]) == "good done"
            with pytest.raises(ValueError, match="bad_complete: on_complete failed"):
                await failing
            assert await bad_expiry == "bad_expiry done"
        assert_expired_on_time(good, start)
        assert bad_expiry.calls == bad_complete.calls == ["complete", "expire"]
        # The on_expiration error has no awaiter: it reaches the loop's exception handler.
        # The on_complete error went to its awaiter instead, and is not reported twice.
        reported = [ctx.get("exception") for ctx in errors]
        assert len(reported) == 1
        assert isinstance(reported[0], RuntimeError)
        assert str(reported[0]) == "bad_expiry: on_expiration failed"

        # And the reaper is still alive for what comes next.
        later = TimedOp(0.02, "later")
        later_start = now()
        purgatory.try_complete_else_watch(later, ["k"])
        async with asyncio.timeout(LOOSE + 5):
            await later
        assert_expired_on_time(later, later_start)
        assert purgatory.statistics().expired == 4


@pytest.mark.asyncio
async def test_purge_runs_without_waiting_for_an_expiry() -> None:
    """With a reaper, a due purge runs promptly, not at the next deadline (here 100 s away)."""
    async with DelayedOperationPurgatory[TimedOp]("reaper", purge_interval=0) as purgatory:
        op = TimedOp(100.0)
        purgatory.try_complete_else_watch(op, ["a", "b", "c"])
        assert purgatory.watched() == 3
        assert op.force_complete()
        deadline = time.monotonic() + LOOSE
        while purgatory.watched() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert purgatory.watched() == 0
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
        async with asyncio.timeout(LOOSE + 5):
            assert await op == 40
        assert op.is_expired
        assert op.completed_at is not None
        assert op.completed_at >= start + 0.05 - FLOAT_SLACK
        assert isinstance(futures[1].exception(), TimeoutError)


@pytest.mark.asyncio
async def test_cancelled_watch_leaves_the_timer_at_once() -> None:
    """Cancelling the task awaiting ``watch`` cancels the operation: it never expires."""
    async with DelayedOperationPurgatory[TimedOp]("reaper") as purgatory:
        op = TimedOp(0.03)
        waiter = asyncio.create_task(purgatory.watch(op, ["k"]))
        await asyncio.sleep(0)
        assert purgatory.num_delayed() == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert op.is_cancelled
        assert purgatory.num_delayed() == 0
        await asyncio.sleep(0.06)
        assert op.calls == []
        with pytest.raises(OperationCancelled):
            await op
