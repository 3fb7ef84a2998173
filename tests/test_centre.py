"""The centre's new behaviour: driving time for replays, NaN triggers, failing recorders,
in-order thresholds."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Hashable
from typing import Any

import pytest
from helpers import FlagOperation

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory._thresholds import ThresholdWatchers
from purgatory.testing import ManualClock, check_invariants


class Stamped(DelayedOperation[float]):
    """Records the clock's time when it expires."""

    def __init__(self, clock: ManualClock, timeout: float) -> None:
        super().__init__(timeout)
        self.clock = clock
        self.expired_at = math.nan

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> float:
        return self.clock.now()

    def on_expiration(self) -> None:
        self.expired_at = self.clock.now()


# -- ManualClock.advance_to ----------------------------------------------------------------------


def test_advance_to_expires_each_operation_at_its_own_tick() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[Stamped]("stamped", clock=clock)
    ops = [Stamped(clock, timeout) for timeout in (0.005, 0.0021, 0.3, 2.5)]
    for index, op in enumerate(ops):
        p.try_complete_else_watch(op, [index])
    assert clock.advance_to(1.0) == 3
    assert clock.now() == 1.0
    # Deadlines rounded up to the 1 ms tick; the pass ran there, not at the end of the move.
    assert [op.expired_at for op in ops[:3]] == pytest.approx([0.005, 0.003, 0.3])
    assert not ops[3].is_completed
    assert clock.advance_to(3.0) == 1
    assert ops[3].expired_at == pytest.approx(2.5)
    check_invariants(p)


def test_advance_to_runs_a_pass_only_where_there_is_work() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[Stamped]("sparse", clock=clock)
    p.try_complete_else_watch(Stamped(clock, 0.5), ["a"])
    p.try_complete_else_watch(Stamped(clock, 0.5), ["b"])
    p.try_complete_else_watch(Stamped(clock, 5.0), ["c"])  # cascades down a level first
    before = p.statistics().timer_passes
    clock.advance_to(1.0)
    assert p.statistics().timer_passes - before == 1  # one tick had work: 0.5 s
    clock.advance_to(10.0)
    passes = p.statistics().timer_passes - before
    assert 2 <= passes <= 4  # the cascade of the 5 s deadline, then its expiry
    assert p.statistics().expired == 3


def test_advance_to_runs_due_work_and_purges_at_the_current_time() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("purge", clock=clock, purge_interval=2)
    ops = [FlagOperation(60.0, str(i)) for i in range(4)]
    for op in ops:
        p.try_complete_else_watch(op, ["k", op.name])
    for op in ops[:3]:
        op.force_complete()
    assert p.watched() == 8  # finished entries stay on the lists until a purge
    clock.advance_to(clock.now())  # a purge is owed: it runs now, without moving time
    assert clock.now() == 0.0
    assert p.watched() == 2
    check_invariants(p)


def test_advance_to_serves_every_attached_purgatory_in_time_order() -> None:
    clock = ManualClock()
    order: list[tuple[str, float]] = []

    class Noted(Stamped):
        def on_expiration(self) -> None:
            order.append((self.name, self.clock.now()))

        def __init__(self, name: str, timeout: float) -> None:
            super().__init__(clock, timeout)
            self.name = name

    first = DelayedOperationPurgatory[Noted]("first", clock=clock)
    second = DelayedOperationPurgatory[Noted]("second", clock=clock)
    second.try_complete_else_watch(Noted("b", 0.1), ["x"])
    first.try_complete_else_watch(Noted("a", 0.2), ["x"])
    second.try_complete_else_watch(Noted("c", 0.3), ["x"])
    clock.advance_to(1.0)
    assert [name for name, _ in order] == ["b", "a", "c"]
    assert [at for _, at in order] == pytest.approx([0.1, 0.2, 0.3])


@pytest.mark.parametrize(
    ("when", "error"),
    [(-0.5, ValueError), (math.nan, ValueError), (math.inf, ValueError), ("1", TypeError)],
)
def test_advance_to_refuses_the_past_and_non_times(when: Any, error: type[Exception]) -> None:
    clock = ManualClock(start=1.0)
    with pytest.raises(error, match="when must be"):
        clock.advance_to(when)
    assert clock.now() == 1.0


def test_advance_to_stops_a_callback_that_keeps_adding_work_due_at_once() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[Any]("runaway", clock=clock)

    class Again(Stamped):
        def on_expiration(self) -> None:
            p.try_complete_else_watch(Again(clock, 0.0), ["k"])

    p.try_complete_else_watch(Again(clock, 0.0), ["k"])
    with pytest.raises(RuntimeError, match="keeps having work"):
        clock.advance_to(1.0)


# -- NaN triggers ----------------------------------------------------------------------------


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


# -- event logs that fail --------------------------------------------------------------------


class Failing:
    """An event log whose every call raises, as a full disk or a removed directory makes one."""

    def __init__(self) -> None:
        self.calls = 0

    def record_watch(self, *args: Any) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")

    def record_end(self, *args: Any) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        self.calls += 1
        raise OSError(2, "No such file or directory")


class Settles(DelayedOperation[str]):
    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False
        self.expirations = 0

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> str:
        return "expired" if self.is_expired else "done"

    def on_expiration(self) -> None:
        self.expirations += 1


@pytest.mark.asyncio
async def test_a_failing_event_log_never_strands_an_awaiter() -> None:
    contexts: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: contexts.append(ctx))
    log = Failing()
    async with DelayedOperationPurgatory[Settles]("disk-full", event_log=log) as p:
        completes, expires, cancelled = Settles(30.0), Settles(0.01), Settles(30.0)
        waiting = asyncio.ensure_future(p.watch(completes, ["a"]))
        assert await p.watch(expires, ["b"]) == "expired"
        assert expires.expirations == 1
        completes.ready = True
        assert p.check_and_complete("a") == 1
        assert await asyncio.wait_for(waiting, 5) == "done"
        p.try_complete_else_watch(cancelled, ["c"])
        assert p.cancel_for_key("c") == [cancelled]
        assert p.statistics().completed == 1
        assert p.statistics().expired == 1
        assert p.statistics().cancelled == 1
        check_invariants(p)
    # Watch and end of each of the three, and the flush at shutdown: each one reported.
    assert log.calls == 7
    assert len(contexts) == 7
    assert all(isinstance(ctx["exception"], OSError) for ctx in contexts)
    assert all("event log" in ctx["message"] for ctx in contexts)


def test_a_failing_event_log_is_reported_through_the_logger_without_a_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[Settles]("no-loop", clock=clock, event_log=Failing())
    op = Settles(0.5)
    with caplog.at_level(logging.ERROR, logger="purgatory"):
        assert not p.try_complete_else_watch(op, ["k"])
        assert clock.advance(1.0) == 1
    assert op.is_expired
    assert op.expirations == 1
    assert len([r for r in caplog.records if "event log" in r.getMessage()]) == 2


# -- thresholds in increasing order ----------------------------------------------------------


def test_in_order_thresholds_take_the_run_and_out_of_order_ones_the_heap() -> None:
    watchers: ThresholdWatchers[str] = ThresholdWatchers({})
    for name, threshold in [("a", 1), ("b", 3), ("c", 3), ("d", 7), ("e", 2), ("f", 9)]:
        watchers.add(name, threshold)
    assert [cell[2] for cell in watchers.run] == ["a", "b", "c", "d", "f"]
    assert [cell[2] for cell in watchers.heap] == ["e"]
    watchers.release(3)
    assert list(watchers.plain) == ["a", "e", "b", "c"]  # threshold order, then watch order
    watchers.release(8)
    assert list(watchers.plain) == ["a", "e", "b", "c", "d"]
    watchers._check()


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
