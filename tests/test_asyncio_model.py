"""The reaper on a real event loop in virtual time, against a model, while things try to kill it.

The stock asyncio loop runs with ``loop.time`` patched to a virtual clock (the purgatory reads the
one clock the loop reads, so its reaper follows it), which makes real-loop runs deterministic:
the rules advance virtual time, cancel the reaper task from outside (a helper that cancels "all
other tasks"), and watch operations whose callbacks raise ``BaseException`` subclasses. Whatever
happened, every operation whose deadline has passed is expired once the loop has run, and none
before it.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory.testing import check_invariants

TICK = 0.001


class Fatal(BaseException):
    """Not an ``Exception``: raised from an expiry callback, it must not end the reaper."""


class Op(DelayedOperation[str]):
    def __init__(self, timeout: float, raises: str | None) -> None:
        super().__init__(timeout)
        self.raises = raises

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> str:
        if self.raises == "on_complete":
            raise Fatal("on_complete")
        return "done"

    def on_expiration(self) -> None:
        if self.raises == "on_expiration":
            raise Fatal("on_expiration")


class ReaperMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.reports: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda loop, context: self.reports.append(context))
        self.now_ms = 1_000_000
        self.loop.time = self._virtual_time  # type: ignore[method-assign]
        self.p = DelayedOperationPurgatory[Op]("reaper-model")
        self.ops: list[tuple[Op, int]] = []  # with the deadline tick
        self.tasks: list[asyncio.Task[str]] = []
        self.loop.run_until_complete(self._bind())

    def _virtual_time(self) -> float:
        return self.now_ms * TICK

    async def _bind(self) -> None:
        self.p.check_and_complete("bind")

    def _run(self) -> None:
        for _ in range(8):
            self.loop.run_until_complete(asyncio.sleep(0))

    @rule(
        timeout_ms=st.integers(0, 3000),
        raises=st.sampled_from((None, None, None, "on_complete", "on_expiration")),
    )
    def watch(self, timeout_ms: int, raises: str | None) -> None:
        op = Op(timeout_ms * TICK, raises)
        self.tasks.append(self.loop.create_task(self.p.watch(op, ["k"])))
        self.ops.append((op, self.now_ms + timeout_ms))
        self._run()

    @rule(delta_ms=st.one_of(st.integers(0, 5), st.integers(0, 1500)))
    def advance(self, delta_ms: int) -> None:
        self.now_ms += delta_ms
        self._run()

    @rule()
    def cancel_the_reaper_from_outside(self) -> None:
        reaper = self.p._binding.reaper
        assert reaper is not None
        reaper._task.cancel()
        self._run()

    @precondition(lambda self: any(not op.is_completed for op, _ in self.ops))
    @rule(data=st.data())
    def force_complete(self, data: st.DataObject) -> None:
        op, _ = data.draw(st.sampled_from([pair for pair in self.ops if not pair[0].is_completed]))
        assert op.force_complete() is True
        self._run()

    @invariant()
    def nothing_late_nothing_early(self) -> None:
        check_invariants(self.p)
        for (op, _), task in zip(self.ops, self.tasks, strict=True):
            assert task.done() == op.is_completed, f"{op!r}: its awaiter has no outcome"
        for op, deadline in self.ops:
            if op.is_expired:
                assert deadline <= self.now_ms, f"{op!r} expired early"
            elif not op.is_completed:
                assert deadline > self.now_ms, f"{op!r} is past its deadline and pending"
        reaper = self.p._binding.reaper
        assert reaper is not None
        restarts = [r for r in self.reports if "ended unexpectedly" in r.get("message", "")]
        assert len(restarts) == reaper.restarts
        # A reaper whose task ended has a timer armed to come back by the next deadline.
        pending = self.p.statistics().next_deadline_in
        assert pending == math.inf or reaper.alive or reaper._handle is not None

    async def _gather(self) -> None:
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self.p.shutdown())
            for task in self.tasks:
                if not task.done():
                    task.cancel()
            if self.tasks:
                self.loop.run_until_complete(self._gather())
        finally:
            self.loop.close()


ReaperMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestReaperModel = ReaperMachine.TestCase
