"""The timing wheel against a reference model, with cascades sliced as the event loop slices them.

A hypothesis state machine adds entries (batches on one deadline, and later ones on a deadline
already held, included), removes them from anywhere (preferring the bucket whose cascade is under
way), adds removed or returned entries again, and advances time by small and large steps,
backwards, and the reaper's way (to `next_deadline()` again and again), each advance with a
random cascade budget or none. After every step the wheel must hold exactly the model's entries,
consistently (`check_timing_wheel`); every advance must return exactly the entries due, by
(deadline, insertion order).
"""

from __future__ import annotations

import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from purgatory._wheel import Bucket, TimingWheel
from purgatory.testing._invariants import check_timing_wheel


class Entry:
    __slots__ = ("_bucket", "_deadline", "name")

    def __init__(self, name: int) -> None:
        self.name = name
        self._bucket: Bucket | None = None
        self._deadline: int

    def __repr__(self) -> str:
        return f"Entry({self.name}, deadline={getattr(self, '_deadline', None)})"


# Offsets from now: near, boundary values of small wheels' levels, and far.
DELTAS = st.one_of(
    st.integers(-3, 3),
    st.integers(0, 40),
    st.sampled_from([4, 5, 8, 9, 16, 17, 25, 32, 33, 63, 64, 65, 125, 128, 129, 256, 625]),
    st.integers(0, 3000),
)
STEPS = st.one_of(
    st.integers(0, 3), st.integers(0, 30), st.sampled_from([16, 64, 128]), st.integers(0, 2000)
)
BUDGETS = st.none() | st.integers(1, 10)


class WheelModel(RuleBasedStateMachine):
    wheel: TimingWheel
    now: int

    @initialize(size=st.sampled_from([2, 3, 4, 5, 6, 8]), start=st.integers(0, 50))
    def setup(self, size: int, start: int) -> None:
        self.wheel = TimingWheel(size, start)
        self.now = start
        self.inserted = 0
        self.order: dict[Entry, int] = {}
        self.held: dict[Entry, int] = {}  # entry -> deadline
        self.loose: list[Entry] = []  # removed or returned: may be added again

    def _add(self, entry: Entry, delta: int) -> None:
        deadline = self.now + delta
        due = self.wheel.add(entry, deadline)
        assert due <= max(deadline, self.wheel.current_tick)
        self.order[entry] = self.inserted
        self.inserted += 1
        self.held[entry] = deadline

    @rule(delta=DELTAS, count=st.integers(1, 4))
    def add(self, delta: int, count: int) -> None:
        for _ in range(count):
            self._add(Entry(self.inserted), delta)

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 10**6))
    def add_on_a_held_deadline(self, pick: int) -> None:
        """A later insert on a deadline an earlier one may hold in a higher level."""
        deadlines = sorted(set(self.held.values()))
        self._add(Entry(self.inserted), deadlines[pick % len(deadlines)] - self.now)

    @precondition(lambda self: self.loose)
    @rule(pick=st.integers(0, 10**6), delta=DELTAS)
    def add_again(self, pick: int, delta: int) -> None:
        self._add(self.loose.pop(pick % len(self.loose)), delta)

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 10**6), from_cascade=st.booleans())
    def remove(self, pick: int, from_cascade: bool) -> None:
        cascading = self.wheel.cascading
        candidates: list[Entry] = []
        if from_cascade and cascading is not None:
            candidates = [*(cascading.older or ()), *cascading]
        if not candidates:
            candidates = sorted(self.held, key=self.order.__getitem__)
        entry = candidates[pick % len(candidates)]
        assert self.wheel.remove(entry)
        assert not self.wheel.remove(entry)
        del self.held[entry]
        self.loose.append(entry)

    @rule(step=STEPS, budget=BUDGETS)
    def advance(self, step: int, budget: int | None) -> None:
        self._advance(self.now + step, budget)

    @rule(back=st.integers(1, 5), budget=BUDGETS)
    def advance_backwards(self, back: int, budget: int | None) -> None:
        self._advance(self.now - back, budget)

    @rule(budget=BUDGETS, passes=st.integers(1, 50))
    def advance_like_the_reaper(self, budget: int | None, passes: int) -> None:
        for _ in range(passes):
            wake = self.wheel.next_deadline()
            if wake == math.inf:
                break
            self._advance(max(int(wake), self.now), budget)

    def _advance(self, now: int, budget: int | None) -> None:
        self.now = max(self.now, now)
        due = self.wheel.advance(now, budget)
        expected = sorted(
            (entry for entry, deadline in self.held.items() if deadline <= self.now),
            key=lambda entry: (self.held[entry], self.order[entry]),
        )
        assert due == expected
        for entry in due:
            assert entry._bucket is None
            del self.held[entry]
            self.loose.append(entry)
        assert self.wheel.current_tick == self.now

    @invariant()
    def holds_exactly_the_model(self) -> None:
        wheel = self.wheel
        check_timing_wheel(wheel)
        assert set(wheel) == set(self.held)
        assert len(wheel) == len(self.held)
        wake = wheel.next_deadline()
        if not self.held:
            assert wake == math.inf
            assert wheel.cascading is None
            return
        assert wake <= max(min(self.held.values()), wheel.current_tick)
        if wheel.cascading is not None:
            assert wake == wheel.current_tick


WheelModel.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestWheelModel = WheelModel.TestCase
