"""The whole purgatory (`purgatory._purgatory`) against a small reference model, in virtual time.

Everything here runs on a `ManualClock` without an event loop. The model keeps time exactly (as
fractions of the decimal values the test means), so it never shares the implementation's float
arithmetic: the two agree only if the implementation rounds deadlines up to the tick and honours
its documented tolerance of about 1e-6 tick for float noise. Timeouts and advances are whole
hundredths of a tick, so every value is either exactly on a tick boundary or at least 0.01 tick
away from one; float noise is far below the tolerance and never decides an outcome.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Literal

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from purgatory import DelayedOperation, DelayedOperationPurgatory, PurgatoryFull
from purgatory.testing import ManualClock, check_invariants

# Tick lengths: decimal ones (float noise on every boundary) and exactly representable ones.
TICKS = (0.001, 0.01, 0.1, 0.25, 1.0)
# Thresholds: few values, so that equal ones occur; None is a plain watch of that key.
MARKS = st.sampled_from((None, 0, 1, 2, 3, 5))
# Any hashables will do as keys.
KEYS: tuple[object, ...] = ("a", "b", "c", 0, 1, ("t", 2))
UNITS_PER_TICK = 100  # timeouts and advances are whole hundredths of a tick

# Tick counts around the level boundaries of small wheels (2..8) and of the default one (1024).
WHEEL_BOUNDARIES = (
    2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 25, 26, 63, 64, 65, 511, 512, 513,
    1023, 1024, 1025, 4095, 4096, 4097, 32767, 32768, 32769, 1048575, 1048576, 1048577,
)  # fmt: skip

tick_counts = st.one_of(
    st.integers(0, 3),
    st.integers(0, 40),
    st.sampled_from(WHEEL_BOUNDARIES),
    st.integers(0, 70_000),
)
# Fraction of a tick, in hundredths: on the boundary, just after it, halfway, just before the next.
tick_fractions = st.sampled_from((0, 0, 0, 1, 50, 99))


@st.composite
def durations(draw: st.DrawFn) -> int:
    """A duration in hundredths of a tick, often on or within 0.01 tick of a tick boundary."""
    return draw(tick_counts) * UNITS_PER_TICK + draw(tick_fractions)


class Op(DelayedOperation[int]):
    """A synchronous operation whose condition is a flag; it logs every callback it runs."""

    def __init__(
        self,
        timeout: float,
        ident: int,
        log: list[tuple[str, int]],
        clock: ManualClock,
        complete_on_attempt: int | None = None,
    ) -> None:
        super().__init__(timeout)
        self.ident = ident
        self.log = log
        self.clock = clock
        self.ready = False
        self.complete_on_attempt = complete_on_attempt
        self.attempts = 0
        self.events: list[str] = []
        self.expired_at: float | None = None

    def try_complete(self) -> bool:
        self.attempts += 1
        if self.ready or (
            self.complete_on_attempt is not None and self.attempts >= self.complete_on_attempt
        ):
            return self.force_complete()
        return False

    def on_complete(self) -> int:
        self.events.append("complete")
        self.log.append(("complete", self.ident))
        return self.ident

    def on_expiration(self) -> None:
        self.events.append("expire")
        self.log.append(("expire", self.ident))
        self.expired_at = self.clock.now()


Status = Literal[
    "pending",  # watched and timed
    "completed",  # completed by its condition or force_complete (watched or completed at once)
    "expired",
    "cancelled",
    "rejected",  # PurgatoryFull: never watched
    "orphan",  # rejected, then force-completed outside the purgatory
]


@dataclass
class ModelOp:
    op: Op
    keys: tuple[object, ...]
    status: Status
    seq: int = -1  # watch order among timed operations
    deadline: int = -1  # rounded-up deadline tick, while timed
    watched_at: float = 0.0  # the clock's float time at the watch
    registered: bool = False
    thresholds: tuple[int | None, ...] | None = None  # per key, None: a plain watch
    attempts: int = 0  # try_complete calls the contract allows: no more, no fewer


@dataclass
class Model:
    """What a purgatory should contain, computed the simple way."""

    tick: Fraction
    purge_interval: int
    max_pending: int | None
    now: Fraction
    ops: list[ModelOp] = field(default_factory=list)
    # Per key: the plain watchers in the order they became plain (watched, or released), and
    # the watchers still waiting for their threshold, in watch order.
    watchers: dict[object, list[int]] = field(default_factory=dict)
    marks: dict[object, dict[int, int]] = field(default_factory=dict)
    estimated: int = 0
    completed: int = 0
    expired: int = 0
    cancelled: int = 0
    purged: int = 0
    next_seq: int = 0

    def pending(self) -> list[ModelOp]:
        return [m for m in self.ops if m.status == "pending"]

    def now_tick(self) -> int:
        return math.floor(self.now / self.tick)

    def deadline_tick(self, timeout: Fraction) -> int:
        return math.ceil((self.now + timeout) / self.tick)

    def watched(self) -> int:
        return sum(map(len, self.watchers.values())) + sum(map(len, self.marks.values()))

    def keys(self) -> set[object]:
        return set(self.watchers) | set(self.marks)

    def register(self, index: int) -> None:
        m = self.ops[index]
        thresholds = m.thresholds or (None,) * len(m.keys)
        for key, threshold in zip(m.keys, thresholds, strict=True):
            if threshold is None:
                self.watchers.setdefault(key, []).append(index)
            else:
                self.marks.setdefault(key, {})[index] = threshold
        m.registered = True
        self.estimated += 1

    def take(self, key: object, reached: int | None) -> list[int]:
        """The watchers a trigger of `key` re-tries, in order; releases those `reached` passes."""
        marks = self.marks.get(key, {})
        if reached is None:  # the plain watchers, then those at a threshold in threshold order
            return [*self.watchers.get(key, []), *sorted(marks, key=marks.__getitem__)]
        released = sorted((i for i, t in marks.items() if t <= reached), key=lambda i: marks[i])
        for i in released:
            del marks[i]
            self.watchers.setdefault(key, []).append(i)
        return list(self.watchers.get(key, []))

    def drop(self, key: object, index: int) -> None:
        if index in self.watchers.get(key, []):
            self.watchers[key].remove(index)
        self.marks.get(key, {}).pop(index, None)
        self.tidy(key)

    def tidy(self, key: object) -> None:
        if key in self.watchers and not self.watchers[key]:
            del self.watchers[key]
        if key in self.marks and not self.marks[key]:
            del self.marks[key]

    def purge_check(self) -> None:
        """Kafka's rule, run on every timer pass after the expirations."""
        delayed = len(self.pending())
        if self.estimated - delayed <= self.purge_interval:
            return
        self.estimated = delayed
        for key in list(self.watchers):
            kept = [i for i in self.watchers[key] if self.ops[i].status == "pending"]
            self.purged += len(self.watchers[key]) - len(kept)
            self.watchers[key] = kept
            self.tidy(key)
        for key in list(self.marks):
            marks = {i: t for i, t in self.marks[key].items() if self.ops[i].status == "pending"}
            self.purged += len(self.marks[key]) - len(marks)
            self.marks[key] = marks
            self.tidy(key)


def _is_full(model: Model, delayed: int) -> bool:
    return model.max_pending is not None and delayed >= model.max_pending


def seconds(units: int | Fraction, tick: Fraction) -> Fraction:
    """The exact duration of `units` hundredths of a tick."""
    return Fraction(units) * tick / UNITS_PER_TICK


class RecordingLog:
    """An `EventLog` that keeps every call, to check the hook against the model."""

    def __init__(self) -> None:
        self.watches: list[tuple[Any, ...]] = []
        self.ends: dict[DelayedOperation[Any], list[str]] = {}

    def record_watch(  # noqa: PLR0917 - the protocol's signature
        self,
        purgatory: str,
        op: DelayedOperation[Any],
        keys: tuple[object, ...],
        thresholds: tuple[Any, ...] | None,
        watched_at: float,
        deadline: float,
    ) -> None:
        self.watches.append((op, keys, thresholds, watched_at, deadline))
        self.ends.setdefault(op, [])

    def record_end(
        self, purgatory: str, op: DelayedOperation[Any], outcome: str, ended_at: float
    ) -> None:
        assert op in self.ends, f"{op!r} ended ({outcome}) without a watch"
        self.ends[op].append(outcome)

    def flush(self) -> None:
        pass


EXPECTED_OUTCOMES = {
    "pending": [],
    "completed": ["completed"],
    "expired": ["expired"],
    "cancelled": ["cancelled"],
    "rejected": ["refused"],
    "orphan": ["refused"],
}


class PurgatoryMachine(RuleBasedStateMachine):
    """Random watch / trigger / force / cancel / advance sequences against the model."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int]] = []
        self.clock = ManualClock()
        self.p = DelayedOperationPurgatory[Op]("unused", clock=self.clock)
        self.model = Model(Fraction(1, 1000), 1000, None, Fraction(0))
        self.tick = 0.001
        self.started = False
        self.events = RecordingLog()

    @initialize(
        tick=st.sampled_from(TICKS),
        wheel_size=st.sampled_from((2, 2, 3, 4, 5, 8, None)),
        purge_interval=st.sampled_from((0, 1, 2, 3, 5, 1000)),
        max_pending=st.sampled_from((None, None, None, 1, 3, 8)),
        start_units=st.sampled_from((0, 1, 50, 99, 100, 123_456_700, 123_456_750)),
    )
    def setup(
        self,
        tick: float,
        wheel_size: int | None,
        purge_interval: int,
        max_pending: int | None,
        start_units: int,
    ) -> None:
        exact_tick = Fraction(str(tick))
        start = seconds(start_units, exact_tick)
        self.tick = tick
        self.clock = ManualClock(float(start))
        if wheel_size is None:
            self.p = DelayedOperationPurgatory[Op](
                "model",
                tick=tick,
                purge_interval=purge_interval,
                max_pending=max_pending,
                clock=self.clock,
                event_log=self.events,
            )
        else:
            self.p = DelayedOperationPurgatory[Op](
                "model",
                tick=tick,
                wheel_size=wheel_size,
                purge_interval=purge_interval,
                max_pending=max_pending,
                clock=self.clock,
                event_log=self.events,
            )
        self.model = Model(exact_tick, purge_interval, max_pending, start)
        self.started = True

    # -- helpers ------------------------------------------------------------------------------

    def _watch(
        self,
        units: int,
        keys: tuple[object, ...],
        mode: str,
        thresholds: tuple[int | None, ...] | None = None,
    ) -> None:
        model = self.model
        index = len(model.ops)
        timeout = seconds(units, model.tick)
        complete_on = {"never": None, "first": 1, "second": 2}[mode]
        op = Op(float(timeout), index, self.log, self.clock, complete_on)
        delayed = len(model.pending())
        m = ModelOp(op, keys, "pending", watched_at=self.clock.now(), thresholds=thresholds)
        model.ops.append(m)
        mark = len(self.log)
        watching: Any = keys if thresholds is None else dict(zip(keys, thresholds, strict=True))
        m.attempts = 1 if mode == "first" or _is_full(model, delayed) else 2
        if mode == "first":
            # Completes in the first attempt: never rejected, never registered.
            assert self.p.try_complete_else_watch(op, watching) is True
            m.status = "completed"
            model.completed += 1
        elif model.max_pending is not None and delayed >= model.max_pending:
            with pytest.raises(PurgatoryFull):
                self.p.try_complete_else_watch(op, watching)
            m.status = "rejected"
            assert op.attempts == 1, "the cap is checked after the first attempt"
        elif mode == "second":
            # Completes in the second attempt, after registration: its entries stay on the lists.
            assert self.p.try_complete_else_watch(op, watching) is True
            model.register(index)
            m.status = "completed"
            model.completed += 1
        else:
            assert self.p.try_complete_else_watch(op, watching) is False
            model.register(index)
            m.deadline = model.deadline_tick(timeout)
            m.seq = model.next_seq
            model.next_seq += 1
            assert op.attempts == 2
        expected_log = [("complete", index)] if m.status == "completed" else []
        assert self.log[mark:] == expected_log

    def _check_and_complete(self, key: object, reached: int | None = None) -> None:
        model = self.model
        expected_order: list[int] = []
        for i in model.take(key, reached):
            m = model.ops[i]
            if m.status != "pending":
                model.drop(key, i)  # finished entries are dropped, not counted
                continue
            m.attempts += 1
            if m.op.ready:
                m.status = "completed"
                model.completed += 1
                expected_order.append(i)
                model.drop(key, i)
        mark = len(self.log)
        assert self.p.check_and_complete(key, reached) == len(expected_order)
        assert self.log[mark:] == [("complete", i) for i in expected_order]

    def _advance(self, delta: Fraction) -> None:
        """Advance the clock by exactly `delta` seconds and check what expired, in what order."""
        model = self.model
        model.now += delta
        now_tick = model.now_tick()
        due = sorted(
            (m for m in model.pending() if m.deadline <= now_tick),
            key=lambda m: (m.deadline, m.seq),
        )
        mark = len(self.log)
        assert self.clock.advance(float(delta)) == len(due)
        expected_log = []
        for m in due:
            expected_log += [("complete", m.op.ident), ("expire", m.op.ident)]
        assert self.log[mark:] == expected_log, "expiry set or order differs from the model"
        for m in due:
            m.status = "expired"
            assert m.op.expired_at is not None
            # Never early: the float clock reached watch time + timeout (within the tolerance).
            assert m.op.expired_at >= m.watched_at + m.op.timeout - 1e-6 * self.tick
        model.expired += len(due)
        model.purge_check()

    # -- rules --------------------------------------------------------------------------------

    @rule(
        units=durations(),
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
        mode=st.sampled_from(("never", "never", "never", "never", "first", "second")),
    )
    def watch(self, units: int, keys: list[object], mode: str) -> None:
        self._watch(units, tuple(keys), mode)

    @rule(
        units=durations(),
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
        mode=st.sampled_from(("never", "never", "never", "first", "second")),
        data=st.data(),
    )
    def watch_at_thresholds(
        self, units: int, keys: list[object], mode: str, data: st.DataObject
    ) -> None:
        thresholds = data.draw(st.lists(MARKS, min_size=len(keys), max_size=len(keys)))
        self._watch(units, tuple(keys), mode, tuple(thresholds))

    @rule(key=st.sampled_from((*KEYS, "unknown")), reached=MARKS)
    def trigger_with_a_value(self, key: object, reached: int | None) -> None:
        self._check_and_complete(key, reached)

    @precondition(lambda self: bool(self.model.pending()))
    @rule(data=st.data())
    def make_ready_and_reach(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from(self.model.pending()))
        m.op.ready = True
        position = data.draw(st.integers(0, len(m.keys) - 1))
        threshold = m.thresholds[position] if m.thresholds else None
        offset = data.draw(st.sampled_from((0, 0, 1, -1)))
        reached = None if threshold is None else threshold + offset
        self._check_and_complete(m.keys[position], reached)

    @precondition(lambda self: not _is_full(self.model, len(self.model.pending())))
    @rule(
        good=st.lists(st.sampled_from(KEYS), min_size=0, max_size=2, unique=True),
        units=durations(),
    )
    def a_bad_key_registers_nothing(self, good: list[object], units: int) -> None:
        op = Op(float(seconds(units, self.model.tick)), -1, self.log, self.clock)
        before = self.p.statistics()
        keys: list[Any] = [*good, ["orders", 1]]  # a JSON-decoded tuple: unhashable
        with pytest.raises(TypeError, match="unhashable"):
            self.p.try_complete_else_watch(op, keys)
        assert self.p.statistics() == before
        assert op.events == []

    @precondition(lambda self: bool(self.model.pending()))
    @rule(data=st.data())
    def make_ready_and_trigger(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from(self.model.pending()))
        m.op.ready = True
        self._check_and_complete(data.draw(st.sampled_from(m.keys)))

    @precondition(lambda self: bool(self.model.pending()))
    @rule(data=st.data())
    def make_ready(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from(self.model.pending())).op.ready = True

    @rule(key=st.sampled_from((*KEYS, "unknown")))
    def check_and_complete(self, key: object) -> None:
        self._check_and_complete(key)

    @precondition(lambda self: bool(self.model.ops))
    @rule(data=st.data())
    def force_complete(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from(self.model.ops))
        mark = len(self.log)
        if m.status == "pending":
            assert m.op.force_complete() is True
            m.status = "completed"
            self.model.completed += 1
            assert self.log[mark:] == [("complete", m.op.ident)]
        elif m.status == "rejected":
            # Never watched: it completes, but the purgatory does not count it.
            assert m.op.force_complete() is True
            m.status = "orphan"
            assert self.log[mark:] == [("complete", m.op.ident)]
        else:
            assert m.op.force_complete() is False
            assert self.log[mark:] == []

    @rule(key=st.sampled_from((*KEYS, "unknown")))
    def cancel_for_key(self, key: object) -> None:
        model = self.model
        expected = []
        for i in model.watchers.pop(key, []):
            m = model.ops[i]
            if m.status == "pending":
                m.status = "cancelled"
                expected.append(m.op)
        marks = model.marks.pop(key, {})
        for i in sorted(marks, key=marks.__getitem__):
            m = model.ops[i]
            if m.status == "pending":
                m.status = "cancelled"
                expected.append(m.op)
        model.cancelled += len(expected)
        mark = len(self.log)
        cancelled = self.p.cancel_for_key(key)
        assert [op.ident for op in cancelled] == [op.ident for op in expected]
        assert all(a is b for a, b in zip(cancelled, expected, strict=True))
        assert self.log[mark:] == []

    @rule(units=st.one_of(st.just(0), st.integers(0, 300), durations()))
    def advance(self, units: int) -> None:
        self._advance(seconds(units, self.model.tick))

    @precondition(lambda self: bool(self.model.pending()))
    @rule(data=st.data(), offset=st.sampled_from((0, 0, -1, 1)))
    def advance_to_a_deadline(self, data: st.DataObject, offset: int) -> None:
        """Advance exactly onto a pending deadline tick, or one hundredth of a tick around it."""
        model = self.model
        m = data.draw(st.sampled_from(model.pending()))
        target = m.deadline * model.tick + seconds(offset, model.tick)
        self._advance(max(target - model.now, Fraction(0)))

    @precondition(lambda self: bool(self.model.ops))
    @rule(data=st.data())
    def rewatch_is_refused(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from([m for m in self.model.ops if m.status != "rejected"]))
        before = self.p.statistics()
        with pytest.raises(ValueError, match="watch"):
            self.p.try_complete_else_watch(m.op, ["a"])
        assert self.p.statistics() == before

    @rule()
    def empty_keys_are_refused(self) -> None:
        op = Op(1.0, -1, self.log, self.clock)
        before = self.p.statistics()
        with pytest.raises(ValueError, match="empty"):
            self.p.try_complete_else_watch(op, [])
        assert self.p.statistics() == before
        assert op.events == []

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def matches_model(self) -> None:
        if not self.started:
            return
        model = self.model
        p = self.p
        check_invariants(p)
        pending = model.pending()
        assert p.num_delayed() == len(pending)
        assert p.watched() == model.watched()
        stats = p.statistics()
        assert stats.watched == model.watched()
        assert stats.delayed == len(pending)
        assert stats.keys == len(model.keys())
        assert stats.completed == model.completed
        assert stats.expired == model.expired
        assert stats.cancelled == model.cancelled
        assert stats.purged == model.purged
        if pending:
            first = min(m.deadline for m in pending)
            until_first = float(first * model.tick - model.now)
            assert 0 <= stats.next_deadline_in <= max(until_first, 0.0) + 1e-6 * self.tick
        else:
            assert stats.next_deadline_in == math.inf
        for m in model.ops:
            op = m.op
            assert self.events.ends.get(op) == EXPECTED_OUTCOMES[m.status], m.status
            assert op.attempts == m.attempts, f"{op!r}: tried {op.attempts}, not {m.attempts}"
            if m.status == "pending":
                assert (op.is_completed, op.is_expired, op.is_cancelled) == (False, False, False)
                assert op.events == []
            elif m.status in ("completed", "orphan"):
                assert (op.is_completed, op.is_expired, op.is_cancelled) == (True, False, False)
                assert op.events == ["complete"]
            elif m.status == "expired":
                assert (op.is_completed, op.is_expired, op.is_cancelled) == (True, True, False)
                assert op.events == ["complete", "expire"]
            elif m.status == "cancelled":
                assert (op.is_completed, op.is_expired, op.is_cancelled) == (False, False, True)
                assert op.events == []
            else:
                assert m.status == "rejected"
                assert (op.is_completed, op.is_expired, op.is_cancelled) == (False, False, False)
                assert op.events == []

    def teardown(self) -> None:
        if not self.started:
            return
        model = self.model
        # Expire everything still pending.
        pending = model.pending()
        if pending:
            last = max(m.deadline for m in pending)
            self._advance(max(last * model.tick - model.now, Fraction(0)))
        assert self.p.num_delayed() == 0
        assert model.pending() == []
        # Watch and complete enough operations to make the next timer pass purge.
        while model.estimated <= model.purge_interval:
            self._watch(UNITS_PER_TICK, ("teardown",), "never")
            m = model.ops[-1]
            assert m.op.force_complete() is True
            m.status = "completed"
            model.completed += 1
        self._advance(Fraction(0))
        assert model.watchers == {}
        assert model.marks == {}
        self.matches_model()
        assert self.p.num_delayed() == 0
        assert self.p.watched() == 0
        assert self.p.statistics().keys == 0


PurgatoryMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestPurgatoryModel = PurgatoryMachine.TestCase


# -- "one big advance equals many small ones" ------------------------------------------------


@dataclass
class Workload:
    """Operations watched at various times, some completed early; then an expiry phase."""

    tick: float
    wheel_size: int
    # (advance before the watch, timeout), both in hundredths of a tick
    watches: list[tuple[int, int]]
    dropped: list[bool]  # force-complete this one before the expiry phase


@st.composite
def workloads(draw: st.DrawFn, max_timeout_ticks: int = 5000) -> Workload:
    n = draw(st.integers(1, 60))
    timeout = st.one_of(
        st.integers(0, 12),
        st.integers(0, 300),
        st.integers(0, max_timeout_ticks),
    ).map(lambda t: t * UNITS_PER_TICK) | st.integers(0, max_timeout_ticks * UNITS_PER_TICK)
    gap = st.sampled_from((0, 0, 0, 1, 50, 100, 250, 1000))
    return Workload(
        tick=draw(st.sampled_from(TICKS)),
        wheel_size=draw(st.sampled_from((2, 3, 4, 8, 20, 1024))),
        watches=draw(st.lists(st.tuples(gap, timeout), min_size=n, max_size=n)),
        dropped=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
    )


class Run:
    """One replay of a workload: a fresh clock and purgatory."""

    def __init__(self, workload: Workload) -> None:
        self.tick = Fraction(str(workload.tick))
        self.now = Fraction(0)
        self.log: list[tuple[str, int]] = []
        self.clock = ManualClock()
        self.p = DelayedOperationPurgatory[Op](
            "replay", tick=workload.tick, wheel_size=workload.wheel_size, clock=self.clock
        )
        self.ops: list[Op] = []
        self.deadlines: list[int] = []

    def advance(self, units: int) -> list[int]:
        """Advance by `units` hundredths of a tick; return who expired, in order."""
        self.now += seconds(units, self.tick)
        mark = len(self.log)
        count = self.clock.advance(float(seconds(units, self.tick)))
        check_invariants(self.p)
        expired = [ident for event, ident in self.log[mark:] if event == "expire"]
        assert count == len(expired)
        return expired

    def watch_all(self, workload: Workload) -> list[int]:
        """The watch phase; return who expired during it."""
        expired = []
        for index, (gap, timeout_units) in enumerate(workload.watches):
            expired += self.advance(gap)
            timeout = seconds(timeout_units, self.tick)
            op = Op(float(timeout), index, self.log, self.clock)
            assert self.p.try_complete_else_watch(op, [index % 3]) is False
            self.ops.append(op)
            self.deadlines.append(math.ceil((self.now + timeout) / self.tick))
        for op, dropped in zip(self.ops, workload.dropped, strict=True):
            if dropped:
                op.force_complete()
        check_invariants(self.p)
        return expired

    def expected_order(self, ops: list[Op]) -> list[int]:
        """Deadline order by tick, then watch order (the index) within a tick."""
        return sorted((op.ident for op in ops), key=lambda i: (self.deadlines[i], i))


@settings(deadline=None, max_examples=80)
@given(
    workload=workloads(),
    total=st.integers(0, 6000).map(lambda t: t * UNITS_PER_TICK) | st.integers(0, 600_000),
    cuts=st.lists(st.integers(0, 10**6), max_size=40),
)
def test_one_big_advance_equals_many_small_ones(
    workload: Workload, total: int, cuts: list[int]
) -> None:
    big, small = Run(workload), Run(workload)
    assert big.watch_all(workload) == small.watch_all(workload)
    passes_before = big.p.statistics().timer_passes
    pending = [op for op in big.ops if not op.is_completed]

    expired_big = big.advance(total)
    # The same span cut into pieces (zero-length pieces included: advance(0)).
    points = sorted({0, total, *(c % (total + 1) for c in cuts)})
    pieces = [b - a for a, b in itertools.pairwise(points)]
    pieces.insert(len(pieces) // 2, 0)
    assert sum(pieces) == total
    expired_small: list[int] = []
    for piece in pieces:
        expired_small += small.advance(piece)

    now_tick = math.floor(big.now / big.tick)
    due = [op for op in pending if big.deadlines[op.ident] <= now_tick]
    assert expired_big == big.expected_order(due)
    assert expired_small == expired_big
    assert big.p.num_delayed() == small.p.num_delayed() == len(pending) - len(due)
    big_stats, small_stats = big.p.statistics(), small.p.statistics()
    # Everything but the time to the next pass and the number of passes run.
    assert replace(big_stats, next_deadline_in=0.0, timer_passes=0) == replace(
        small_stats, next_deadline_in=0.0, timer_passes=0
    )
    assert big_stats.timer_passes == passes_before + 1
    assert small_stats.timer_passes == passes_before + len(pieces)
    assert big_stats.next_deadline_in == pytest.approx(small_stats.next_deadline_in, abs=1e-9)
    for a, b in zip(big.ops, small.ops, strict=True):
        assert (a.is_completed, a.is_expired, a.events) == (b.is_completed, b.is_expired, b.events)


# -- expiry order ------------------------------------------------------------------------------


@settings(deadline=None, max_examples=200)
@given(
    tick=st.sampled_from(TICKS),
    wheel_size=st.integers(2, 8),
    steps=st.lists(
        st.one_of(
            # watch: a timeout (few distinct ticks, so that many operations share one)
            st.tuples(st.just("watch"), st.integers(0, 70).map(lambda t: t * UNITS_PER_TICK)),
            st.tuples(st.just("watch"), st.sampled_from((0, 1, 50, 99, 700, 6400, 51_200))),
            # advance: sub-tick, a few ticks, or a jump across several wheel levels
            st.tuples(st.just("advance"), st.integers(0, 250)),
            st.tuples(st.just("advance"), st.integers(0, 80).map(lambda t: t * UNITS_PER_TICK)),
        ),
        min_size=10,
        max_size=150,
    ),
)
# Two operations due on one tick, parked in buckets of two different levels that
# cascade in the same advance (the later-watched one must not overtake the earlier one).
@example(
    tick=1.0,
    wheel_size=2,
    steps=[("watch", 6500), ("advance", 3200), ("watch", 3300), ("advance", 3300)],
)
def test_expiry_order_by_deadline_tick_then_watch_order(
    tick: float, wheel_size: int, steps: list[tuple[str, int]]
) -> None:
    exact_tick = Fraction(str(tick))
    log: list[tuple[str, int]] = []
    clock = ManualClock()
    p = DelayedOperationPurgatory[Op]("order", tick=tick, wheel_size=wheel_size, clock=clock)
    now = Fraction(0)
    deadlines: dict[int, int] = {}
    pending: set[int] = set()

    def advance(units: int) -> None:
        nonlocal now
        now += seconds(units, exact_tick)
        now_tick = math.floor(now / exact_tick)
        due = sorted(
            (i for i in pending if deadlines[i] <= now_tick), key=lambda i: (deadlines[i], i)
        )
        mark = len(log)
        assert clock.advance(float(seconds(units, exact_tick))) == len(due)
        assert [i for event, i in log[mark:] if event == "expire"] == due
        pending.difference_update(due)
        check_invariants(p)

    for kind, units in steps:
        if kind == "advance":
            advance(units)
        else:
            index = len(deadlines)
            timeout = seconds(units, exact_tick)
            op = Op(float(timeout), index, log, clock)
            assert p.try_complete_else_watch(op, ["k"]) is False
            deadlines[index] = math.ceil((now + timeout) / exact_tick)
            pending.add(index)
    # Flush everything in one jump: the longest cascades happen here.
    if pending:
        last = max(deadlines[i] for i in pending)
        advance(max(0, math.ceil((last * exact_tick - now) / exact_tick * UNITS_PER_TICK)))
    assert pending == set()
    assert p.num_delayed() == 0
