"""`purgatory.testing.ManualClock`: time that moves only when the test says so, and
`advance_to`, which runs a timer pass at each tick where an attached purgatory has work."""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import pytest
from helpers import FlagOperation

from purgatory import (
    DelayedOperation,
    DelayedOperationPurgatory,
)
from purgatory.testing import ManualClock, check_invariants


@pytest.mark.parametrize("seconds", [-1.0, math.nan, math.inf])
def test_manual_clock_never_goes_backwards(seconds: float) -> None:
    clock = ManualClock(5.0)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(seconds)
    assert clock.now() == 5.0


def test_manual_clock_rejects_bad_start() -> None:
    with pytest.raises(ValueError, match="finite"):
        ManualClock(math.nan)
    with pytest.raises(TypeError):
        ManualClock("0")  # type: ignore[arg-type]


# -- advance_to -----------------------------------------------------------------------------------


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


@pytest.mark.parametrize("tick", [0.001, 0.01, 0.1])
def test_advance_to_a_deadline_expires_what_is_due_there(tick: float) -> None:
    """``advance_to(t + d)`` expires an operation watched at ``t`` with timeout ``d`` (on the
    tick grid), however the float ``t + d`` rounds: the clock compares ticks as the timer does,
    not a deadline tick turned back into seconds (``300 * 0.001`` is above ``0.3``)."""
    rng = random.Random(4)
    missed = []
    for _ in range(300):
        clock = ManualClock()
        p = DelayedOperationPurgatory[FlagOperation]("p", tick=tick, clock=clock)
        start = rng.randrange(10_000) * tick
        clock.advance_to(start)
        timeout = rng.randrange(1, 1000) * tick
        op = FlagOperation(timeout)
        p.try_complete_else_watch(op, ["k"])
        clock.advance_to(start + timeout)
        if not op.is_expired:
            missed.append((start, timeout))
    assert missed == []


def test_advance_to_a_deadline_through_the_fast_path_expires_it_too() -> None:
    """The same when the clock already knows when work is next due (its one comparison)."""
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("p", clock=clock)
    op = FlagOperation(0.009)
    p.try_complete_else_watch(op, ["k"])
    clock.advance_to(0.001)  # learns: due at tick 9, which is 0.009000000000000001 s
    assert 9 * 0.001 > 0.009
    clock.advance_to(0.009)
    assert op.is_expired


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


def purging_every_two(
    name: str,
) -> tuple[ManualClock, DelayedOperationPurgatory[FlagOperation], list[FlagOperation]]:
    """A purgatory that purges after every two completions, on a clock of its own, and four
    operations due in 60 s, each watched on ``"k"`` and on a key of its own."""
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation](name, clock=clock, purge_interval=2)
    ops = [FlagOperation(60.0, str(i)) for i in range(4)]
    for op in ops:
        p.try_complete_else_watch(op, ["k", op.name])
    return clock, p, ops


def test_advance_to_runs_due_work_and_purges_at_the_current_time() -> None:
    clock, p, ops = purging_every_two("purge")
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


# -- the alarm: time moves in one comparison while nothing is due ----------------------------------


def test_advance_to_meets_a_deadline_earlier_than_what_the_clock_last_learned() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[Stamped]("earlier", clock=clock)
    late = Stamped(clock, 10.0)
    p.try_complete_else_watch(late, ["a"])
    clock.advance_to(1.0)  # learns: nothing before 10 s
    passes = p.statistics().timer_passes
    clock.advance_to(1.2)  # nothing due: no pass
    assert p.statistics().timer_passes == passes
    soon = Stamped(clock, 0.5)  # due at 1.7 s, before what the clock knew
    p.try_complete_else_watch(soon, ["b"])
    check_invariants(p)
    assert clock.advance_to(2.0) == 1
    assert soon.expired_at == pytest.approx(1.7)
    assert not late.is_completed
    check_invariants(p)


def test_advance_to_runs_a_purge_owed_by_completions_since_it_last_learned() -> None:
    clock, p, ops = purging_every_two("owed")
    clock.advance_to(1.0)  # learns: nothing before 60 s
    for op in ops[:3]:
        op.force_complete()
    check_invariants(p)
    clock.advance_to(1.001)
    assert p.watched() == 2  # the purge ran at once, not at 60 s
    assert p.statistics().purges == 1


def test_a_completion_in_the_second_try_owes_a_purge_too() -> None:
    """An operation that completes in the watch's second try (after registration) is on the
    lists: it counts toward the purge rule like any other, and the clock hears of it."""
    clock = ManualClock()
    p = DelayedOperationPurgatory[Any]("second-try", clock=clock, purge_interval=0)

    class SecondTry(DelayedOperation[None]):
        def __init__(self) -> None:
            super().__init__(60.0)
            self.tries = 0

        def try_complete(self) -> bool:
            self.tries += 1
            return self.tries == 2 and self.force_complete()

        def on_complete(self) -> None:
            pass

        def on_expiration(self) -> None:
            pass

    clock.advance_to(1.0)
    assert p.try_complete_else_watch(SecondTry(), ["k", "l"])
    assert p.watched() == 2
    check_invariants(p)
    clock.advance_to(1.001)
    assert p.watched() == 0


def test_advance_to_after_a_pass_that_raised_asks_again() -> None:
    """An interrupt from a callback stops the move; the clock does not trust what it knew,
    so the operation left due expires at the next move, however small."""
    clock = ManualClock()
    p = DelayedOperationPurgatory[Any]("raised", clock=clock)
    Stop = SystemExit

    class Raising(Stamped):
        def on_expiration(self) -> None:
            raise Stop

    p.try_complete_else_watch(Raising(clock, 0.1), ["a"])
    survivor = Stamped(clock, 0.1)
    p.try_complete_else_watch(survivor, ["b"])
    with pytest.raises(Stop):
        clock.advance_to(1.0)
    now = clock.now()
    clock.advance_to(now)
    assert survivor.is_expired
    check_invariants(p)


def test_alarms_of_purgatories_with_different_ticks_share_one_clock() -> None:
    clock = ManualClock()
    coarse = DelayedOperationPurgatory[Stamped]("coarse", clock=clock, tick=0.1)
    fine = DelayedOperationPurgatory[Stamped]("fine", clock=clock, tick=0.001)
    coarse.try_complete_else_watch(Stamped(clock, 5.0), ["a"])
    clock.advance_to(0.5)  # learns: nothing before 5 s
    op = Stamped(clock, 0.0123)
    fine.try_complete_else_watch(op, ["a"])
    clock.advance_to(0.6)
    assert op.expired_at == pytest.approx(0.513)
    check_invariants(coarse)
    check_invariants(fine)


# -- a closed purgatory, time that goes only forward, times too large -------------------------


@pytest.mark.parametrize("owed", ["purge_interval=0", "more pending than purge_interval"])
def test_a_purgatory_shut_down_while_it_owes_a_purge_leaves_the_clock_free(owed: str) -> None:
    clock = ManualClock()
    interval = 0 if owed == "purge_interval=0" else 3
    closing = DelayedOperationPurgatory[FlagOperation](
        "closing", clock=clock, purge_interval=interval
    )
    other = DelayedOperationPurgatory[FlagOperation]("other", clock=clock)
    ops = [FlagOperation(30.0) for _ in range(1 if interval == 0 else 5)]
    for i, op in enumerate(ops):
        closing.try_complete_else_watch(op, [i])
        op.force_complete()  # finished on their lists: a purge is owed
    asyncio.run(closing.shutdown())
    later = FlagOperation(2.0)
    other.try_complete_else_watch(later, ["k"])
    assert clock.advance_to(1.0) == 0  # a closed purgatory has no timer work
    assert clock.advance_to(2.0) == 1
    assert later.is_expired
    check_invariants(other)


def test_a_callback_moving_the_clock_during_advance_to_never_moves_it_back() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[Any]("jump", clock=clock)

    class JumpsAhead(FlagOperation):
        def on_expiration(self) -> None:
            clock.advance(20.0)  # the contract allows ManualClock.advance from callbacks

    p.try_complete_else_watch(JumpsAhead(5.0), ["a"])
    clock.advance_to(10.0)
    assert clock.now() == 25.0
    later = Stamped(clock, 3.0)
    p.try_complete_else_watch(later, ["b"])
    clock.advance_to(27.9)
    assert not later.is_completed  # due at 28: never early
    clock.advance_to(28.0)
    assert later.is_expired
    check_invariants(p)


def test_check_invariants_catches_a_wheel_ahead_of_its_clock() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("ahead", clock=clock)
    p.try_complete_else_watch(FlagOperation(30.0), ["k"])
    timer = p._timer  # a driver that runs a pass at a time its clock has not reached
    timer.run_pass(10.0)
    with pytest.raises(AssertionError, match="ahead of the clock"):
        check_invariants(p)


def test_times_past_what_a_timer_counts_are_refused_with_value_error() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("p", clock=clock)  # 1 ms ticks: to 2**33 s
    with pytest.raises(ValueError, match="counts to"):
        clock.advance(1e306)
    with pytest.raises(ValueError, match="counts to"):
        clock.advance_to(1e306)
    assert clock.now() == 0.0
    check_invariants(p)
    with pytest.raises(ValueError, match="past what a timer"):
        DelayedOperationPurgatory[FlagOperation]("q", clock=ManualClock(1e306))


@pytest.mark.parametrize("tick", [0.001, 1e-6, 0.25, 3.0])
def test_times_where_float_seconds_cannot_resolve_the_tick_are_refused(tick: float) -> None:
    """Near 2**52 s a float's spacing is a second: a timeout shorter than that rounds away and
    the operation expires early. A clock refuses to reach times whose spacing is more than a
    thousandth of the tick (2**33 s for 1 ms ticks), and accepts every time before them."""
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("fine", tick=tick, clock=clock)
    limit = p._timer.time_limit
    assert math.ulp(math.nextafter(limit, 0)) <= tick / 1024 < math.ulp(limit)
    with pytest.raises(ValueError, match="cannot move to"):
        clock.advance_to(2.0**52)
    with pytest.raises(ValueError, match="cannot move to"):
        clock.advance(limit * 2)
    with pytest.raises(ValueError, match="past what a timer"):
        DelayedOperationPurgatory[FlagOperation]("late", tick=tick, clock=ManualClock(2.0**52))
    clock.advance_to(math.nextafter(limit, 0) * 0.99)  # the latest times are fine
    op = FlagOperation(tick)
    p.try_complete_else_watch(op, ["k"])
    clock.advance(tick * 0.999)
    assert not op.is_completed  # never early
    clock.advance(tick * 1.002)
    assert op.is_expired


def test_a_clock_alone_refuses_to_reach_infinity() -> None:
    clock = ManualClock()
    clock.advance(1e308)
    with pytest.raises(ValueError, match="finite"):
        clock.advance(1e308)
    assert clock.now() == 1e308
