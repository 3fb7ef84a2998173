"""`SystemTimer` (`purgatory._timer`) as a driver of one's own sees it: the `purgatory.Timer`
protocol's passes, what they refuse, and a watch whose timing fails on the driver's side."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from helpers import FlagOperation

from purgatory import Alarm, DelayedOperationPurgatory, Timer
from purgatory.testing import check_invariants


class OwnClock:
    """A driven clock written by a user: it reads `time`, and its test runs the passes."""

    def __init__(self, alarm: Any = None) -> None:
        self.time: Any = 0.0
        self.timer: Timer | None = None
        self.alarm = alarm

    def current_time(self) -> float:
        return self.time  # type: ignore[no-any-return]

    def attach(self, timer: Timer) -> Alarm | None:
        self.timer = timer
        return self.alarm  # type: ignore[no-any-return]

    def run(self, budget: int | None = None) -> int:
        """A pass at the current time, as a driver runs one."""
        assert self.timer is not None
        return self.timer.run_pass(self.time, budget)


def own_purgatory(
    alarm: Any = None, **options: Any
) -> tuple[OwnClock, DelayedOperationPurgatory[FlagOperation]]:
    clock = OwnClock(alarm)
    return clock, DelayedOperationPurgatory[FlagOperation]("own", clock=clock, **options)


# -- run_pass refuses what is not a time or a budget ---------------------------------------


@pytest.mark.parametrize(
    ("budget", "error"),
    [(1.5, TypeError), ("2", TypeError), (-1, ValueError), (True, TypeError)],
)
def test_run_pass_refuses_a_budget_that_is_not_an_int_at_least_0(
    budget: Any, error: type[Exception]
) -> None:
    """A bad budget is refused before anything moves: every operation still expires on time
    (a cascade under way with a float or negative budget lost them), and no pass is counted."""
    clock, p = own_purgatory()
    ops = [FlagOperation(5.0 + i / 100) for i in range(50)]  # beyond level 0: cascaded
    for op in ops:
        p.try_complete_else_watch(op, ["k"])
    clock.time = 4.5  # the cascade of their bucket is due
    with pytest.raises(error, match=r"budget must be an int >= 0 \(entries per pass\)"):
        clock.run(budget)
    assert p.statistics().timer_passes == 0
    check_invariants(p)
    while clock.time < 6.0:
        clock.time += 0.001
        clock.run(1)
    assert all(op.is_expired for op in ops)
    check_invariants(p)


def test_run_pass_takes_a_budget_of_0() -> None:
    clock, p = own_purgatory()
    op = FlagOperation(0.01)
    p.try_complete_else_watch(op, ["k"])
    clock.time = 0.01
    assert clock.run(0) == 1


@pytest.mark.parametrize(
    ("now", "error"),
    [
        (math.nan, ValueError),
        (math.inf, ValueError),
        pytest.param(10**400, ValueError, id="10**400"),
        ("12", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
)
def test_run_pass_refuses_a_time_that_is_not_a_finite_number(
    now: Any, error: type[Exception]
) -> None:
    clock, p = own_purgatory()
    op = FlagOperation(1.0)
    p.try_complete_else_watch(op, ["k"])
    assert clock.timer is not None
    with pytest.raises(error, match=r"^now must be a finite number of seconds, got "):
        clock.timer.run_pass(now)
    assert p.statistics().timer_passes == 0  # refused: not a pass
    clock.time = 1.0
    assert clock.run() == 1
    assert p.statistics().timer_passes == 1


# -- a watch whose timing fails on the driver's side leaves nothing behind -----------------


@pytest.mark.parametrize(
    ("time", "error"), [(math.nan, ValueError), (math.inf, ValueError), ("x", TypeError)]
)
def test_a_clock_that_reads_a_non_time_fails_the_watch_and_leaves_nothing(
    time: Any, error: type[Exception]
) -> None:
    clock, p = own_purgatory()
    clock.time = time
    op = FlagOperation(1.0)
    with pytest.raises(error, match="the clock's time must be a finite number of seconds"):
        p.try_complete_else_watch(op, ["k"])
    stats = p.statistics()
    assert (stats.watched, stats.delayed, stats.keys) == (0, 0, 0)
    assert repr(op).startswith("<FlagOperation new")  # never watched: it may be watched again
    clock.time = 0.0
    assert not p.try_complete_else_watch(op, ["k"])
    check_invariants(p)


class RaisingAlarm:
    """An alarm whose `wake_by` raises (a driver's bug)."""

    wake_tick = math.inf
    alive = True

    def wake_by(self, tick: float) -> None:
        raise RuntimeError("the driver's alarm broke")


def test_an_alarm_that_raises_fails_the_watch_and_leaves_nothing() -> None:
    _, p = own_purgatory(RaisingAlarm())
    op = FlagOperation(1.0)
    with pytest.raises(RuntimeError, match="alarm broke"):
        p.try_complete_else_watch(op, ["k"])
    stats = p.statistics()
    assert (stats.watched, stats.delayed, stats.keys) == (0, 0, 0)
    check_invariants(p)


@pytest.mark.parametrize("alarm", [object(), True, "alarm"])
def test_attach_returning_something_that_is_no_alarm_is_refused_at_once(alarm: object) -> None:
    with pytest.raises(TypeError, match=r"OwnClock.attach returned .*: it must return a "):
        own_purgatory(alarm)


def test_a_clock_that_starts_at_a_non_time_is_refused_at_once() -> None:
    clock = OwnClock()
    clock.time = math.nan
    with pytest.raises(ValueError, match="the clock's time must be a finite number"):
        DelayedOperationPurgatory[FlagOperation]("own", clock=clock)


# -- times of ticks ------------------------------------------------------------------------


@pytest.mark.parametrize("tick_length", [0.001, 0.01, 0.1, 1 / 3, 7.0])
def test_time_of_a_tick_is_the_earliest_time_a_pass_reaches_it(tick_length: float) -> None:
    """A pass at ``time_of(tick)`` reaches the tick and a pass a float earlier does not, where
    ``tick * tick_length`` may be either; `next_pass_at` is the tick's own time, or the first
    float after it that reaches the tick."""
    _, p = own_purgatory(tick=tick_length)
    timer = p._timer
    rng = random.Random(7)
    for tick in [1, 9, 300, *(rng.randrange(1, 2**40) for _ in range(300))]:
        at = timer.time_of(tick)
        assert timer.ticks(at) >= tick, (tick, at)
        assert timer.ticks(math.nextafter(at, -math.inf)) < tick, (tick, at)
        assert at <= tick * tick_length or timer.ticks(tick * tick_length) < tick
    assert timer.time_of(math.inf) == math.inf
    assert timer.time_of(-math.inf) == -math.inf


def test_next_pass_at_is_a_time_that_reaches_the_due_tick() -> None:
    clock, p = own_purgatory()
    p.try_complete_else_watch(FlagOperation(0.009), ["k"])  # due at tick 9
    assert p._timer.next_pass_at() == 9 * 0.001  # the tick's own time, which reaches it
    clock.time = p._timer.next_pass_at()
    assert clock.run() == 1


class _CountingDriver:
    """A user's own clock and driver (docs/testing.md), counting its reads; its time is read
    through a bound method or, with `plain`, a function kept on the instance."""

    def __init__(self, plain: bool) -> None:
        self.now = 0.0
        self.reads = 0
        self.timers: list[Any] = []
        if plain:
            self.current_time = self._read  # type: ignore[method-assign]

    def _read(self) -> float:
        self.reads += 1
        return self.now

    def current_time(self) -> float:
        return self._read()

    def attach(self, timer: Any) -> None:
        self.timers.append(timer)

    def step(self, seconds: float) -> int:
        self.now += seconds
        return sum(t.run_pass(self.now) for t in self.timers if t.next_pass_at() <= self.now)


@pytest.mark.parametrize("plain", [False, True], ids=["method", "function"])
def test_a_users_own_clock_is_read_once_per_watch_and_its_passes_expire_on_time(
    plain: bool,
) -> None:
    """Every clock takes one path in the timer (no clock class of the project's is special):
    a user's own is read once per watch, not by a completion nor a pass (given its time)."""
    driver = _CountingDriver(plain)
    purgatory = DelayedOperationPurgatory[Any]("driven", clock=driver)
    reads = driver.reads
    ops = [FlagOperation(0.05) for _ in range(3)]
    for i, op in enumerate(ops):
        assert not purgatory.try_complete_else_watch(op, [i])
    assert driver.reads == reads + 3
    assert ops[0].force_complete()
    assert driver.step(0.04) == 0
    assert driver.step(0.01) == 2
    assert driver.reads == reads + 3
    assert [op.is_expired for op in ops] == [False, True, True]
