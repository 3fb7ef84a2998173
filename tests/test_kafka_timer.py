"""Kafka's ``TimerTest`` (``SystemTimer``), ported to the public API.

Kafka tests its timer directly; ours is reached through `DelayedOperationPurgatory`, with a
`ManualClock` standing in for Kafka's polling ``advanceClock`` loop, so every expiry happens at a
known virtual time and can be compared exactly. Kafka's ``tickMs = 1`` becomes ``tick=1.0``
(seconds) where exact float arithmetic matters, and the default one-millisecond tick elsewhere.
"""

from __future__ import annotations

import math
import random

import pytest

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory._purgatory import DEFAULT_WHEEL_SIZE
from purgatory.testing import ManualClock, check_invariants


class TimerOp(DelayedOperation[int]):
    """Kafka's ``TestTask``: never completes by itself; records when it expired, and in what order.

    Args:
        timeout: Seconds.
        ident: The label appended to `log` on expiry (Kafka's ``output``).
        clock: The clock whose time is recorded.
        log: Shared by the operations of one test, in expiry order.
    """

    def __init__(self, timeout: float, ident: int, clock: ManualClock, log: list[int]) -> None:
        super().__init__(timeout)
        self.ident = ident
        self.clock = clock
        self.log = log
        self.calls: list[str] = []
        self.expired_at: float | None = None

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> int:
        self.calls.append("complete")
        return self.ident

    def on_expiration(self) -> None:
        self.calls.append("expire")
        assert self.expired_at is None
        self.expired_at = self.clock.now()
        self.log.append(self.ident)


def kafka_delays() -> list[int]:
    """Kafka ``testTaskExpiration``'s delays: 0-4 once, 10-99 twice, 100-499 once (585 tasks)."""
    delays = list(range(5))
    for delay in range(10, 100):
        delays += [delay, delay]
    delays += list(range(100, 500))
    assert len(delays) == 585
    return delays


def watch_shuffled(
    purgatory: DelayedOperationPurgatory[TimerOp],
    clock: ManualClock,
    timeouts: list[float],
    log: list[int],
    seed: int,
) -> list[TimerOp]:
    """Watch one operation per timeout, in a seeded random order; ``ident`` is the watch index."""
    shuffled = list(timeouts)
    random.Random(seed).shuffle(shuffled)
    ops = [TimerOp(timeout, ident, clock, log) for ident, timeout in enumerate(shuffled)]
    for op in ops:
        assert not purgatory.try_complete_else_watch(op, [op.ident % 7])
        assert not op.is_completed
    check_invariants(purgatory)
    return ops


WHEEL_SIZES = [2, 3, 20, DEFAULT_WHEEL_SIZE]


# -- testAlreadyExpiredTask ------------------------------------------------------------------


@pytest.mark.parametrize("start", [0.0, 12.345])
@pytest.mark.parametrize("wheel_size", [3, DEFAULT_WHEEL_SIZE])
def test_already_expired_operations(start: float, wheel_size: int) -> None:
    """Kafka ``testAlreadyExpiredTask``: due-at-once operations run on the next timer pass.

    Kafka adds tasks with delays -5..-1 ms; ours refuses negative timeouts, so the closest
    equivalent is a timeout of 0: it is not expired inside the watch call, counts as delayed,
    and expires at the next ``advance(0)``, in watch order.
    """
    clock = ManualClock(start)
    purgatory = DelayedOperationPurgatory[TimerOp]("timer", clock=clock, wheel_size=wheel_size)
    log: list[int] = []
    ops = [TimerOp(0, ident, clock, log) for ident in range(5)]
    for op in ops:
        assert not purgatory.try_complete_else_watch(op, [f"key{op.ident}"])
        assert not op.is_completed
        assert op.calls == []
    assert purgatory.num_delayed() == 5
    assert purgatory.statistics().next_deadline_in == 0.0
    check_invariants(purgatory)

    assert clock.advance(0) == 5
    assert log == [0, 1, 2, 3, 4]
    for op in ops:
        assert op.is_completed
        assert op.is_expired
        assert op.expired_at == start
        assert op.calls == ["complete", "expire"]
    assert purgatory.num_delayed() == 0
    assert purgatory.statistics().expired == 5
    assert purgatory.statistics().next_deadline_in == math.inf
    check_invariants(purgatory)
    assert clock.advance(0) == 0
    assert log == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("delay_ms", [-5, -4, -3, -2, -1])
def test_negative_delays_are_refused(delay_ms: int) -> None:
    """Kafka accepts negative delays as "already expired"; our contract says ValueError."""
    with pytest.raises(ValueError, match="timeout"):
        TimerOp(delay_ms / 1000, 0, ManualClock(), [])


# -- testTaskExpiration ----------------------------------------------------------------------


@pytest.mark.parametrize("wheel_size", WHEEL_SIZES)
def test_task_expiration_step_by_step(wheel_size: int) -> None:
    """Kafka ``testTaskExpiration``: 585 tasks, each expired exactly at its deadline.

    Time moves one tick at a time; after each step exactly the operations whose timeout is the
    current time have expired, the time they saw is their deadline, and the whole expiry order is
    (deadline, watch order).
    """
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[TimerOp](
        "timer", clock=clock, tick=1.0, wheel_size=wheel_size
    )
    log: list[int] = []
    delays = kafka_delays()
    ops = watch_shuffled(purgatory, clock, [float(d) for d in delays], log, seed=wheel_size)
    assert purgatory.num_delayed() == 585

    for step in range(0, 501):
        before = len(log)
        assert clock.advance(0.0 if step == 0 else 1.0) == len(log) - before
        assert clock.now() == float(step)
        newly = log[before:]
        assert newly == [op.ident for op in ops if op.timeout == step], step
        assert purgatory.num_delayed() == sum(1 for d in delays if d > step)
        if step % 50 == 0:
            check_invariants(purgatory)

    assert all(op.expired_at == op.timeout for op in ops)
    assert all(op.calls == ["complete", "expire"] for op in ops)
    assert log == [op.ident for op in sorted(ops, key=lambda op: (op.timeout, op.ident))]
    assert sorted(op.timeout for op in ops) == sorted(float(d) for d in delays)
    assert purgatory.statistics().expired == 585
    check_invariants(purgatory)


@pytest.mark.parametrize("wheel_size", WHEEL_SIZES)
def test_task_expiration_in_one_pass(wheel_size: int) -> None:
    """One big advance equals many small ones: same set, same (deadline, watch) order."""
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[TimerOp](
        "timer", clock=clock, tick=1.0, wheel_size=wheel_size
    )
    log: list[int] = []
    ops = watch_shuffled(purgatory, clock, [float(d) for d in kafka_delays()], log, seed=7)
    assert clock.advance(499.0) == 585
    assert log == [op.ident for op in sorted(ops, key=lambda op: (op.timeout, op.ident))]
    assert all(op.expired_at == 499.0 for op in ops)
    assert purgatory.num_delayed() == 0
    check_invariants(purgatory)


@pytest.mark.parametrize("wheel_size", [20, DEFAULT_WHEEL_SIZE])
def test_task_expiration_in_milliseconds(wheel_size: int) -> None:
    """Kafka's actual units: 1 ms ticks, 1 ms steps, float time that is never quite exact.

    The step at which each operation expires must be its delay in milliseconds: the float noise
    of adding 0.001 five hundred times neither delays an expiry by a tick nor fires one early.
    """
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[TimerOp]("timer", clock=clock, wheel_size=wheel_size)
    log: list[int] = []
    delays = kafka_delays()
    ops = watch_shuffled(purgatory, clock, [d / 1000 for d in delays], log, seed=3)
    delay_ms = {op.ident: round(op.timeout * 1000) for op in ops}
    times: list[float] = []
    for step in range(0, 501):
        before = len(log)
        clock.advance(0.0 if step == 0 else 0.001)
        times.append(clock.now())
        assert [delay_ms[ident] for ident in log[before:]] == [step] * (len(log) - before)
        assert len(log) - before == delays.count(step), step
    for op in ops:
        assert op.expired_at == times[delay_ms[op.ident]]
    assert log == [op.ident for op in sorted(ops, key=lambda op: (delay_ms[op.ident], op.ident))]
    check_invariants(purgatory)


@pytest.mark.parametrize("wheel_size", WHEEL_SIZES)
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_watches_and_advances_expire_exactly_on_time(wheel_size: int, seed: int) -> None:
    """Operations watched at random times, time moved by random amounts (all exact floats).

    Each operation expires in the first advance that reaches its deadline rounded up to the
    tick, never before, and each advance expires by (deadline tick, watch order).
    """
    rng = random.Random(seed)
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[TimerOp](
        "timer", clock=clock, tick=1.0, wheel_size=wheel_size
    )
    log: list[int] = []
    ops: list[TimerOp] = []
    due_tick: dict[int, int] = {}
    expected_at: dict[int, float] = {}
    for _ in range(400):
        for _ in range(rng.randrange(4)):
            timeout = rng.choice([0, rng.randrange(8), rng.randrange(400)]) * 0.25
            op = TimerOp(timeout, len(ops), clock, log)
            ops.append(op)
            due_tick[op.ident] = math.ceil(clock.now() + timeout)
            assert not purgatory.try_complete_else_watch(op, ["k"])
        before = len(log)
        clock.advance(rng.choice([0, 1, rng.randrange(12), rng.randrange(200)]) * 0.25)
        now = clock.now()
        expected = sorted(
            (ident for ident in due_tick if ident not in expected_at and due_tick[ident] <= now),
            key=lambda ident: (due_tick[ident], ident),
        )
        for ident in expected:
            expected_at[ident] = now
        assert sorted(log[before:]) == sorted(expected)  # exactly what is due: none early or late
        assert log[before:] == expected  # by (deadline tick, watch order)
        check_invariants(purgatory)
    for op in ops:
        assert op.expired_at == expected_at.get(op.ident)
        if op.expired_at is not None:
            assert op.expired_at >= due_tick[op.ident]  # never early


# -- rounding and order ----------------------------------------------------------------------


def test_deadline_is_rounded_up_to_the_tick() -> None:
    clock = ManualClock(0.5)
    purgatory = DelayedOperationPurgatory[TimerOp]("timer", clock=clock, tick=1.0)
    op = TimerOp(1.0, 0, clock, [])
    purgatory.try_complete_else_watch(op, ["k"])
    clock.advance(1.0)  # 1.5: the deadline itself, but not yet a tick boundary
    assert not op.is_completed
    clock.advance(0.25)  # 1.75
    assert not op.is_completed
    clock.advance(0.25)  # 2.0
    assert op.is_expired
    assert op.expired_at == 2.0


def test_deadline_on_a_tick_boundary_is_not_pushed_to_the_next_tick() -> None:
    """Ten steps of 0.1 s make 0.9999999999999999 s, which must count as the 1 s tick."""
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[TimerOp]("timer", clock=clock)
    log: list[int] = []
    one_second = TimerOp(1.0, 0, clock, log)
    just_after = TimerOp(1.001, 1, clock, log)
    purgatory.try_complete_else_watch(one_second, ["k"])
    purgatory.try_complete_else_watch(just_after, ["k"])
    clock.advance(0.1)
    later = TimerOp(0.2, 2, clock, log)  # deadline 0.1 + 0.2 = 0.30000000000000004
    purgatory.try_complete_else_watch(later, ["k"])
    clock.advance(0.1)
    assert log == []
    clock.advance(0.1)
    assert log == [2]
    assert later.expired_at == clock.now()
    for _ in range(6):
        clock.advance(0.1)
    assert log == [2]  # 0.9 s
    clock.advance(0.1)
    assert clock.now() < 1.0
    assert log == [2, 0]
    clock.advance(0.0009)
    assert log == [2, 0]  # 1 ms after the second is 1.001: not yet
    clock.advance(0.0001)
    assert log == [2, 0, 1]
    check_invariants(purgatory)


def test_one_pass_expires_by_tick_then_watch_order() -> None:
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[TimerOp]("timer", clock=clock, tick=1.0)
    log: list[int] = []
    # ident: timeout -> tick 1 for idents 0-2, tick 2 for idents 3-4.
    for ident, timeout in enumerate([1.0, 0.25, 0.5, 2.0, 1.75]):
        purgatory.try_complete_else_watch(TimerOp(timeout, ident, clock, log), ["k"])
    assert clock.advance(5.0) == 5
    assert log == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("tick", "wheel_size", "first", "wait", "second"),
    [
        # A lands in overflow level 3, B (same deadline tick 30) in level 2; both spans start
        # on tick 27.
        (1.0, 3, 30.0, 23.0, 7.0),
        # The same with the defaults: deadline tick 1024**2 + 5, A in level 2, B in level 1.
        (0.001, DEFAULT_WHEEL_SIZE, 1048.581, 1046.576, 2.005),
    ],
)
def test_watch_order_within_a_tick_survives_overflow_levels(
    tick: float, wheel_size: int, first: float, wait: float, second: float
) -> None:
    """API.md: operations due in one advance expire in watch order within a tick.

    A is watched first with a long timeout; B is watched later with a timeout that puts its
    deadline on the same tick. A must expire before B.
    """
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[TimerOp](
        "timer", clock=clock, tick=tick, wheel_size=wheel_size
    )
    log: list[int] = []
    a = TimerOp(first, 0, clock, log)
    b = TimerOp(second, 1, clock, log)
    purgatory.try_complete_else_watch(a, ["k"])
    clock.advance(wait)
    purgatory.try_complete_else_watch(b, ["k"])
    assert a._deadline == b._deadline  # the premise: one tick
    clock.advance(20.0)
    assert log == [0, 1]


# -- around the timer ------------------------------------------------------------------------


class RewatchOp(TimerOp):
    """On expiry, watches `follower` in the same purgatory (a timeout-0 follow-up)."""

    def __init__(
        self,
        timeout: float,
        ident: int,
        clock: ManualClock,
        log: list[int],
        *,
        purgatory: DelayedOperationPurgatory[TimerOp],
        follower: TimerOp,
    ) -> None:
        super().__init__(timeout, ident, clock, log)
        self.purgatory = purgatory
        self.follower = follower

    def on_expiration(self) -> None:
        super().on_expiration()
        assert not self.purgatory.try_complete_else_watch(self.follower, ["follow"])


def test_timeout_zero_watched_during_a_pass_expires_on_the_next_pass() -> None:
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[TimerOp]("timer", clock=clock)
    log: list[int] = []
    follower = TimerOp(0, 1, clock, log)
    leader = RewatchOp(1.0, 0, clock, log, purgatory=purgatory, follower=follower)
    purgatory.try_complete_else_watch(leader, ["lead"])
    assert clock.advance(1.0) == 1
    assert log == [0]
    assert not follower.is_completed
    assert purgatory.num_delayed() == 1
    check_invariants(purgatory)
    assert clock.advance(0) == 1
    assert log == [0, 1]
    assert follower.expired_at == 1.0
    check_invariants(purgatory)


def test_purgatories_sharing_a_clock_expire_together() -> None:
    """The ``MockTimer`` shared by several purgatories: one advance drives them all."""
    clock = ManualClock()
    log: list[int] = []
    first = DelayedOperationPurgatory[TimerOp]("first", clock=clock)
    second = DelayedOperationPurgatory[TimerOp]("second", clock=clock, tick=0.01)
    first.try_complete_else_watch(TimerOp(1.0, 1, clock, log), ["k"])
    second.try_complete_else_watch(TimerOp(1.0, 2, clock, log), ["k"])
    second.try_complete_else_watch(TimerOp(2.0, 3, clock, log), ["k"])
    assert clock.advance(0.99) == 0
    assert clock.advance(0.01) == 2
    assert sorted(log) == [1, 2]
    assert clock.advance(1.0) == 1
    assert log[2:] == [3]
    check_invariants(first)
    check_invariants(second)


def test_next_deadline_in_follows_the_clock() -> None:
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[TimerOp]("timer", clock=clock, tick=1.0)
    assert purgatory.statistics().next_deadline_in == math.inf
    op = TimerOp(5.0, 0, clock, [])
    purgatory.try_complete_else_watch(op, ["k"])
    assert purgatory.statistics().next_deadline_in == 5.0
    clock.advance(2.0)
    assert purgatory.statistics().next_deadline_in == 3.0
    assert op.force_complete()
    assert purgatory.statistics().next_deadline_in == math.inf
    assert purgatory.num_delayed() == 0


def test_completed_and_cancelled_operations_never_expire() -> None:
    """Kafka's ``TimerTask.cancel``: completion and cancellation leave the timer at once."""
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[TimerOp]("timer", clock=clock)
    log: list[int] = []
    completed = TimerOp(1.0, 0, clock, log)
    cancelled = TimerOp(1.0, 1, clock, log)
    survivor = TimerOp(1.0, 2, clock, log)
    purgatory.try_complete_else_watch(completed, ["a"])
    purgatory.try_complete_else_watch(cancelled, ["b"])
    purgatory.try_complete_else_watch(survivor, ["c"])
    assert completed.force_complete()
    assert purgatory.cancel_for_key("b") == [cancelled]
    assert purgatory.num_delayed() == 1
    check_invariants(purgatory)
    assert clock.advance(10.0) == 1
    assert log == [2]
    assert completed.calls == ["complete"]
    assert not completed.is_expired
    assert cancelled.calls == []
    assert cancelled.is_cancelled
    assert not cancelled.is_completed
    stats = purgatory.statistics()
    assert (stats.completed, stats.expired, stats.cancelled) == (1, 1, 1)
    check_invariants(purgatory)
