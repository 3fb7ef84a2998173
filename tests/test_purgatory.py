"""`DelayedOperationPurgatory` through its public API: the watch and its two tries, triggers,
expiry, purge, cancellation, shutdown, its arguments, its event loop and its thread, and what
happens when the user's callbacks raise or re-enter.

Time is a `ManualClock` unless a test is about the event loop itself; the real-loop side of the
purgatory (the reaper, async attempts, awaiting) is in test_asyncio.py. The event loops run in
virtual time (conftest.py): a timeout that guards a wait costs nothing and fails only a loop that
stopped making progress. A loop waiting for other threads has no timer pending, so it waits for
them as a real loop does; a guard is set only once they are done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, assert_type

import anyio
import pytest
from helpers import (
    AsyncFlag,
    Boom,
    DelayedFuture,
    FailsFirstAttempt,
    FlagOperation,
    RaisingComplete,
    RaisingExpiration,
    loop_errors,
    manual_purgatory,
    raised_in_a_thread,
    until,
    wheel_levels,
)

from purgatory import (
    DelayedOperation,
    DelayedOperationPurgatory,
    OperationCancelled,
    PurgatoryClosed,
    PurgatoryFull,
)
from purgatory._purgatory import DEFAULT_WHEEL_SIZE
from purgatory.testing import ManualClock, check_invariants

pytestmark = pytest.mark.virtualclock

# -- arguments, admission, statistics -------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"purge_interval": -1}, ValueError),
        ({"purge_interval": 1.5}, TypeError),
        ({"tick": 0}, ValueError),
        ({"tick": -1.0}, ValueError),
        ({"tick": math.nan}, ValueError),
        ({"tick": math.inf}, ValueError),
        ({"tick": "1ms"}, TypeError),
        ({"wheel_size": 1}, ValueError),
        ({"wheel_size": 8.0}, TypeError),
        ({"max_pending": 0}, ValueError),
        ({"max_pending": 2.5}, TypeError),
        ({"clock": object()}, TypeError),
    ],
)
def test_purgatory_rejects_bad_arguments(kwargs: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        DelayedOperationPurgatory("bad", **kwargs)  # type: ignore[arg-type]


def test_purgatory_rejects_a_non_string_name() -> None:
    with pytest.raises(TypeError, match="name"):
        DelayedOperationPurgatory(42)  # type: ignore[arg-type]


def test_empty_keys_are_rejected_and_nothing_is_registered() -> None:
    _, p = manual_purgatory()
    op = FlagOperation(1)
    with pytest.raises(ValueError, match="at least one key"):
        p.try_complete_else_watch(op, [])
    assert (p.watched(), p.num_delayed()) == (0, 0)
    assert not p.try_complete_else_watch(op, ["k"])  # still usable


def test_a_string_is_not_a_collection_of_keys() -> None:
    _, p = manual_purgatory()
    with pytest.raises(TypeError, match="collection of keys"):
        p.try_complete_else_watch(FlagOperation(1), "topic-0")


def test_an_operation_is_watched_once() -> None:
    _, p = manual_purgatory()
    op = FlagOperation(1)
    p.try_complete_else_watch(op, ["a"])
    with pytest.raises(ValueError, match="already watched"):
        p.try_complete_else_watch(op, ["b"])
    other = DelayedOperationPurgatory[FlagOperation]("other", clock=ManualClock())
    with pytest.raises(ValueError, match="already watched"):
        other.try_complete_else_watch(op, ["a"])
    done = FlagOperation(1)
    done.force_complete()
    with pytest.raises(ValueError, match="finished"):
        p.try_complete_else_watch(done, ["a"])
    check_invariants(p)


def test_a_subclass_that_forgot_super_init_gets_a_clear_error() -> None:
    class Forgetful(FlagOperation):
        def __init__(self) -> None:
            pass

    _, p = manual_purgatory()
    with pytest.raises(TypeError, match=r"super\(\).__init__"):
        p.try_complete_else_watch(Forgetful(), ["a"])


def test_value_equality_is_refused() -> None:
    @dataclasses.dataclass
    class ByValue(DelayedOperation[None]):
        label: str

        def __post_init__(self) -> None:
            super().__init__(1.0)

        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> None:
            return None

        def on_expiration(self) -> None:
            return None

    p = DelayedOperationPurgatory[ByValue]("eq", clock=ManualClock())
    with pytest.raises(TypeError, match="eq=False"):
        p.try_complete_else_watch(ByValue("x"), ["a"])


def test_max_pending_rejects_without_registering_but_admits_instant_completions() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("cap", clock=clock, max_pending=2)
    assert not p.try_complete_else_watch(FlagOperation(1), ["a"])
    assert not p.try_complete_else_watch(FlagOperation(1), ["a"])
    with pytest.raises(PurgatoryFull, match="max_pending=2"):
        p.try_complete_else_watch(FlagOperation(1), ["a", "b"])
    assert (p.num_delayed(), p.watched(), p.statistics().keys) == (2, 2, 1)
    instant = FlagOperation(1)
    instant.ready = True
    assert p.try_complete_else_watch(instant, ["a"])
    clock.advance(1)
    assert not p.try_complete_else_watch(FlagOperation(1), ["b"])
    check_invariants(p)


def test_closed_purgatory_refuses_watches() -> None:
    _, p = manual_purgatory()
    asyncio.run(p.shutdown())
    with pytest.raises(PurgatoryClosed):
        p.try_complete_else_watch(FlagOperation(1), ["a"])
    assert p.closed


def test_statistics_is_a_frozen_snapshot() -> None:
    clock, p = manual_purgatory()
    op = FlagOperation(0.5)
    p.try_complete_else_watch(op, ["a", "b"])
    stats = p.statistics()
    assert (stats.watched, stats.delayed, stats.keys) == (2, 1, 2)
    assert stats.next_deadline_in == pytest.approx(0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.watched = 0  # type: ignore[misc]
    clock.advance(0.5)
    stats = p.statistics()
    assert (stats.delayed, stats.expired, stats.completed) == (0, 1, 0)
    assert stats.next_deadline_in == math.inf


@pytest.mark.parametrize("timeout", [1e300, 1.8e306, 2.0**53 * 0.001 * 1.001])
def test_an_absurd_timeout_is_refused_and_registers_nothing(timeout: float) -> None:
    _clock, p = manual_purgatory()
    op = FlagOperation(timeout)
    with pytest.raises(ValueError, match="horizon"):
        p.try_complete_else_watch(op, ["k"])
    assert (p.watched(), p.num_delayed(), wheel_levels(p)) == (0, 0, 1)
    check_invariants(p)


def test_the_largest_timeout_works() -> None:
    _clock, p = manual_purgatory(tick=1.0)
    op = FlagOperation(2.0**53 - 1)
    p.try_complete_else_watch(op, ["k"])
    assert wheel_levels(p) <= 7
    assert p.statistics().next_deadline_in < math.inf
    check_invariants(p)


class Other(DelayedOperation[int]):
    def try_complete(self) -> bool:
        return self.force_complete()

    def on_complete(self) -> int:
        return 7

    def on_expiration(self) -> None:
        pass


@pytest.mark.asyncio
async def test_watch_is_typed_by_the_purgatorys_operation_type() -> None:
    """Checked by mypy (``make test`` runs it on the tests): an unused ignore is an error."""
    clock = ManualClock()
    flags = DelayedOperationPurgatory[FlagOperation]("typed", clock=clock)
    ready = FlagOperation(1)
    ready.ready = True
    assert_type(await flags.watch(ready, ["k"]), str)
    with pytest.raises(ValueError, match="keys is empty"):  # at run time: not checked
        await flags.watch(Other(1), [])  # type: ignore[arg-type]
    others = DelayedOperationPurgatory[Other]("typed-other", clock=clock)
    assert_type(await others.watch(Other(1), ["k"]), int)


# -- shutdown from inside a callback --------------------------------------------------------------


class ShutsDown(FlagOperation):
    """Shuts its purgatory down from a callback (a driven clock's shutdown never suspends)."""

    def __init__(self, timeout: float, purgatory: DelayedOperationPurgatory[Any], when: str):
        super().__init__(timeout, when)
        self.purgatory = purgatory
        self.when = when

    def _shutdown(self) -> None:
        with pytest.raises(StopIteration):
            self.purgatory.shutdown().send(None)

    def try_complete(self) -> bool:
        if self.when == "try" or (self.when == "second try" and self.attempts == 1):
            self._shutdown()
        return super().try_complete()

    def on_expiration(self) -> None:
        super().on_expiration()
        if self.when == "expiry":
            self._shutdown()


@pytest.mark.asyncio
@pytest.mark.parametrize("when", ["try", "second try"])
async def test_a_shutdown_inside_the_watch_leaves_no_awaiter_hanging(when: str) -> None:
    _clock, p = manual_purgatory()
    op = ShutsDown(30, p, when)
    with pytest.raises(PurgatoryClosed):
        await asyncio.wait_for(p.watch(op, ["k", "j"]), 5.0)
    assert op.is_cancelled
    assert (p.watched(), p.num_delayed()) == (0, 0)
    check_invariants(p)


@pytest.mark.asyncio
async def test_a_shutdown_inside_an_expiry_cancels_the_rest_of_the_pass() -> None:
    clock, p = manual_purgatory()
    first = ShutsDown(0.01, p, "expiry")
    rest = [FlagOperation(0.01) for _ in range(3)]
    waiters = [asyncio.create_task(p.watch(op, ["k"])) for op in [first, *rest]]
    await asyncio.sleep(0)
    clock.advance(0.01)
    results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 5.0)
    assert results[0] == "expiry done"
    assert all(isinstance(r, PurgatoryClosed) for r in results[1:])
    assert all(op.is_cancelled for op in rest)
    assert (p.watched(), p.num_delayed()) == (0, 0)
    check_invariants(p)


# -- the event loop and its thread ----------------------------------------------------------------


def test_unbound_purgatory_refuses_threadsafe_triggers() -> None:
    _, p = manual_purgatory()
    with pytest.raises(RuntimeError, match="not bound to an event loop"):
        p.check_and_complete_threadsafe("a")


def test_loop_clock_purgatory_needs_a_running_loop() -> None:
    p = DelayedOperationPurgatory[FlagOperation]("loopless")
    with pytest.raises(RuntimeError, match="inside a running asyncio loop"):
        p.try_complete_else_watch(FlagOperation(1), ["a"])
    assert p.watched() == 0


def test_a_loop_clock_purgatory_refuses_a_second_loop() -> None:
    p = DelayedOperationPurgatory[FlagOperation]("one-loop")

    async def use() -> None:
        p.try_complete_else_watch(FlagOperation(30), ["a"])

    asyncio.run(use())
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(use())
    assert p.num_delayed() == 1


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("call", "advice"),
    [
        ("check_and_complete", "check_and_complete_threadsafe"),
        ("cancel_for_key", "another thread"),
        ("purge", "another thread"),
    ],
)
async def test_changing_the_lists_from_a_foreign_thread_is_refused(call: str, advice: str) -> None:
    async with DelayedOperationPurgatory[FlagOperation]("threads") as p:
        op = FlagOperation(30)
        p.try_complete_else_watch(op, ["k"])
        op.ready = True
        calls = {
            "check_and_complete": lambda: p.check_and_complete("k"),
            "cancel_for_key": lambda: p.cancel_for_key("k"),
            "purge": p.purge,
        }
        error = raised_in_a_thread(calls[call])
        assert isinstance(error, RuntimeError)
        assert advice in str(error)
        assert not op.is_completed  # nothing happened to it from that thread
        assert not op.is_cancelled
        assert p.check_and_complete("k") == 1


@pytest.mark.asyncio
async def test_check_and_complete_on_an_unknown_key_binds_the_purgatory() -> None:
    p = DelayedOperationPurgatory[FlagOperation]("binds")
    assert p.check_and_complete("nothing") == 0
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def from_thread() -> None:
        p.check_and_complete_threadsafe("x")
        loop.call_soon_threadsafe(done.set)

    thread = threading.Thread(target=from_thread)
    thread.start()
    thread.join()
    await asyncio.wait_for(done.wait(), 5.0)
    await p.shutdown()


def test_a_trigger_for_a_closed_loop_says_so() -> None:
    loop = asyncio.new_event_loop()
    p = DelayedOperationPurgatory[FlagOperation]("closed-loop")

    async def bind() -> None:
        p.try_complete_else_watch(FlagOperation(30), ["k"])

    loop.run_until_complete(bind())
    loop.close()
    with pytest.raises(RuntimeError, match="closed; the trigger for 'k' was not delivered"):
        p.check_and_complete_threadsafe("k")


def test_under_trio_the_error_says_asyncio_is_needed() -> None:
    async def main() -> None:
        p = DelayedOperationPurgatory[FlagOperation]("trio")
        with pytest.raises(RuntimeError, match="runs under trio") as info:
            p.try_complete_else_watch(FlagOperation(1), ["k"])
        assert "ManualClock" in str(info.value)  # still offered, for tests without a loop

    anyio.run(main, backend="trio")


@pytest.mark.asyncio
async def test_a_manual_clock_purgatory_refuses_another_threads_loop_while_its_own_runs() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("fixture", clock=clock)
    p.try_complete_else_watch(FlagOperation(1), ["k"])

    async def use() -> None:
        p.try_complete_else_watch(FlagOperation(1), ["k"])

    error = raised_in_a_thread(lambda: asyncio.run(use()))
    assert isinstance(error, RuntimeError)
    assert "another thread while that loop runs" in str(error)
    await p.shutdown()


def test_a_manual_clock_purgatory_is_usable_without_a_loop_after_one() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("sequential", clock=clock)

    async def use() -> bool:
        op = FlagOperation(1)
        op.ready = True
        return p.try_complete_else_watch(op, ["k"])

    assert asyncio.run(use())
    op = FlagOperation(1)
    assert not p.try_complete_else_watch(op, ["k"])  # no loop now: fine
    assert p.check_and_complete("k") == 0
    assert asyncio.run(use())  # and a second loop
    clock.advance(1)
    assert op.is_expired


# -- callbacks that raise or re-enter, triggers from other threads --------------------------------


class RaisingTry(FlagOperation):
    """try_complete raises on chosen attempts (1-based)."""

    def __init__(self, timeout: float, fail_on: set[int]) -> None:
        super().__init__(timeout)
        self.fail_on = fail_on

    def try_complete(self) -> bool:
        result = super().try_complete()
        if self.attempts in self.fail_on:
            raise Boom(f"attempt {self.attempts}")
        return result


@pytest.mark.parametrize("attempt", [1, 2])
def test_try_complete_raising_inside_the_watch_leaves_nothing_registered(attempt: int) -> None:
    clock, p = manual_purgatory()
    op = RaisingTry(1, {attempt})
    with pytest.raises(Boom):
        p.try_complete_else_watch(op, ["a", "b"])
    assert (p.watched(), p.num_delayed(), p.statistics().keys) == (0, 0, 0)
    check_invariants(p)
    # The operation was not consumed: it can be watched again and expires normally.
    assert not p.try_complete_else_watch(op, ["a"])
    assert clock.advance(1) == 1
    assert op.calls == ["complete", "expire"]


def test_try_complete_raising_in_a_trigger_is_logged_and_others_still_complete(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, p = manual_purgatory()
    bad = RaisingTry(1, {3})
    good = FlagOperation(1)
    p.try_complete_else_watch(bad, ["k"])
    p.try_complete_else_watch(good, ["k"])
    bad.ready = False
    good.ready = True
    with caplog.at_level(logging.ERROR, logger="purgatory"):
        assert p.check_and_complete("k") == 1
    assert "RaisingTry.try_complete raised" in caplog.text
    assert good.is_completed
    assert not bad.is_completed
    assert p.num_delayed() == 1
    bad.ready = True
    assert p.check_and_complete("k") == 1
    assert bad.calls == ["complete"]
    check_invariants(p)


def completed_by_a_trigger(
    p: DelayedOperationPurgatory[Any], op: FlagOperation, caplog: pytest.LogCaptureFixture
) -> int:
    """Watch `op` on ``"k"``, meet its condition, trigger ``"k"`` with the purgatory's error log
    captured: how many operations the trigger completed."""
    p.try_complete_else_watch(op, ["k"])
    op.ready = True
    with caplog.at_level(logging.ERROR, logger="purgatory"):
        return p.check_and_complete("k")


def test_on_complete_raising_without_awaiter_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, p = manual_purgatory()
    op = RaisingComplete(1)
    assert completed_by_a_trigger(p, op, caplog) == 1
    assert caplog.text.count("RaisingComplete.on_complete raised") == 1
    assert op.is_completed
    assert not op.force_complete()
    assert op.calls == ["complete"]
    assert p.num_delayed() == 0
    clock.advance(2)
    assert op.calls == ["complete"]


def test_on_expiration_raising_does_not_stop_the_other_expiries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, p = manual_purgatory()
    ops = [RaisingExpiration(0.1), FlagOperation(0.1), RaisingExpiration(0.2)]
    for op in ops:
        p.try_complete_else_watch(op, ["k"])
    with caplog.at_level(logging.ERROR, logger="purgatory"):
        assert clock.advance(0.2) == 3
    assert caplog.text.count("on_expiration raised") == 2
    assert all(op.calls == ["complete", "expire"] for op in ops)
    assert p.statistics().expired == 3
    check_invariants(p)


def test_on_complete_raising_on_expiry_still_runs_on_expiration() -> None:
    clock, p = manual_purgatory()
    op = RaisingComplete(0.1)
    p.try_complete_else_watch(op, ["k"])
    clock.advance(0.1)
    assert op.calls == ["complete", "expire"]
    assert op.is_expired


@pytest.mark.asyncio
async def test_await_re_raises_what_on_complete_raised() -> None:
    recorder = loop_errors()
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("await", clock=clock)
    op = RaisingComplete(1)
    task = asyncio.create_task(p.watch(op, ["k"]))
    await asyncio.sleep(0)
    op.ready = True
    p.check_and_complete("k")
    with pytest.raises(Boom, match="on_complete"):
        await task
    with pytest.raises(Boom, match="on_complete"):
        await op
    instant = RaisingComplete(1)
    instant.ready = True
    with pytest.raises(Boom):
        await p.watch(instant, ["k"])
    assert recorder.contexts == []  # delivered to the awaiters: not reported again


class Reentrant(FlagOperation):
    """Callbacks that call back into the purgatory."""

    def __init__(self, timeout: float, purgatory: DelayedOperationPurgatory[FlagOperation]) -> None:
        super().__init__(timeout)
        self.purgatory = purgatory
        self.spawned: list[FlagOperation] = []

    def on_complete(self) -> str:
        follow_up = FlagOperation(0.5, "follow-up")
        self.spawned.append(follow_up)
        self.purgatory.try_complete_else_watch(follow_up, ["k"])
        self.purgatory.check_and_complete("k")
        return super().on_complete()

    def on_expiration(self) -> None:
        super().on_expiration()
        self.purgatory.cancel_for_key("other")


def test_callbacks_may_re_enter_the_purgatory() -> None:
    clock, p = manual_purgatory(purge_interval=0)
    op = Reentrant(0.2, p)
    bystander = FlagOperation(5)
    p.try_complete_else_watch(op, ["k"])
    p.try_complete_else_watch(bystander, ["other"])
    op.ready = True
    assert p.check_and_complete("k") == 1
    assert op.calls == ["complete"]
    check_invariants(p)
    expiring = Reentrant(0.1, p)
    p.try_complete_else_watch(expiring, ["k"])
    assert clock.advance(0.1) == 1
    assert expiring.calls == ["complete", "expire"]
    assert bystander.is_cancelled
    check_invariants(p)
    assert clock.advance(1) == 2  # the two follow-ups
    assert p.num_delayed() == 0
    assert p.watched() == 0
    check_invariants(p)


class SelfTriggering(FlagOperation):
    """try_complete triggers its own key: the nested attempt must not complete it twice."""

    def __init__(self, purgatory: DelayedOperationPurgatory[FlagOperation]) -> None:
        super().__init__(1)
        self.purgatory = purgatory

    def try_complete(self) -> bool:
        if self.attempts < 3:
            self.attempts += 1
            self.purgatory.check_and_complete("self")
        return super().try_complete()


def test_try_complete_that_triggers_its_own_key_completes_once() -> None:
    _, p = manual_purgatory()
    op = SelfTriggering(p)
    op.ready = False
    p.try_complete_else_watch(op, ["self"])
    op.ready = True
    p.check_and_complete("self")
    assert op.calls == ["complete"]
    assert p.num_delayed() == 0
    check_invariants(p)


@pytest.mark.asyncio
async def test_check_and_complete_from_another_thread() -> None:
    async with DelayedOperationPurgatory[FlagOperation]("threads") as p:
        ops = [FlagOperation(30, f"op{i}") for i in range(50)]
        waiters = [asyncio.ensure_future(p.watch(op, [i % 5])) for i, op in enumerate(ops)]
        await asyncio.sleep(0)

        def producer() -> None:
            for op in ops:
                op.ready = True
            for key in range(5):
                p.check_and_complete_threadsafe(key)

        thread = threading.Thread(target=producer)
        thread.start()
        thread.join()  # the triggers are queued on the loop, which runs them below
        results = await asyncio.wait_for(asyncio.gather(*waiters), 10)
        assert results == [f"op{i} done" for i in range(50)]
        assert all(op.calls == ["complete"] for op in ops)
        assert p.num_delayed() == 0


@pytest.mark.asyncio
async def test_async_try_complete_raising_is_reported_and_the_operation_survives() -> None:
    recorder = loop_errors()
    async with DelayedOperationPurgatory[FailsFirstAttempt]("async") as p:
        op = FailsFirstAttempt(Boom("async attempt"))
        task = asyncio.create_task(p.watch(op, ["k"]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert [str(e) for e in recorder.exceptions] == ["async attempt"]
        assert not op.is_completed
        p.check_and_complete("k")
        assert await asyncio.wait_for(task, 5) == "second time lucky"
        assert op.attempts == 2


def test_try_complete_claiming_success_without_completing_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Liar(FlagOperation):
        def try_complete(self) -> bool:
            self.attempts += 1
            return self.ready

    _, p = manual_purgatory()
    op = Liar(1)
    assert completed_by_a_trigger(p, op, caplog) == 0
    assert "must return self.force_complete()" in caplog.text
    assert not op.is_completed
    assert p.num_delayed() == 1


def test_a_completion_counts_even_if_try_complete_returns_false() -> None:
    """API.md: check_and_complete returns how many completed in the call, whatever they said."""

    class Quiet(FlagOperation):
        def try_complete(self) -> bool:
            if self.ready:
                self.force_complete()
            return False

    _, p = manual_purgatory()
    op, other = Quiet(1), FlagOperation(1)
    p.try_complete_else_watch(op, ["k"])
    p.try_complete_else_watch(other, ["k"])
    op.ready = True
    assert p.check_and_complete("k") == 1
    assert op.is_completed
    assert p.watched() == 1  # only `other` is left
    check_invariants(p)


class HookOp(FlagOperation):
    """Runs `hook` from on_expiration, and `try_hook` (if set) after each attempt."""

    def __init__(
        self,
        timeout: float,
        hook: Callable[[HookOp], object] | None = None,
        try_hook: Callable[[HookOp], None] | None = None,
    ) -> None:
        super().__init__(timeout)
        self.hook = hook
        self.try_hook = try_hook

    def try_complete(self) -> bool:
        done = super().try_complete()
        if self.try_hook is not None:
            self.try_hook(self)
        return done

    def on_expiration(self) -> None:
        super().on_expiration()
        if self.hook is not None:
            self.hook(self)


def test_a_timer_pass_nested_in_an_expiry_callback_loses_no_purge() -> None:
    """The outer pass keeps queueing what it expires for the purge a nested pass ran."""
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("nested", purge_interval=0, clock=clock)
    first = HookOp(1, hook=lambda _: clock.advance(0))
    second = FlagOperation(1)
    p.try_complete_else_watch(first, ["a"])
    p.try_complete_else_watch(second, ["b"])
    clock.advance(1)
    assert first.is_expired
    assert second.is_expired
    check_invariants(p)
    clock.advance(1)
    assert p.watched() == 0


def test_an_expiry_during_try_complete_is_not_counted_as_a_completion() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("expiring", clock=clock)

    def let_time_pass(op: HookOp) -> None:
        if op.attempts == 3:  # the trigger's attempt (the watch made two)
            clock.advance(5)

    op = HookOp(1, try_hook=let_time_pass)
    p.try_complete_else_watch(op, ["k"])
    assert p.check_and_complete("k") == 0
    assert op.is_expired
    check_invariants(p)


def test_an_interrupted_timer_pass_does_not_re_time_what_a_callback_finished() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("interrupted", clock=clock)
    later = FlagOperation(1)
    late_too = FlagOperation(1)

    def finish_one_then_interrupt(_: HookOp) -> None:
        later.force_complete()
        raise KeyboardInterrupt

    first = HookOp(1, hook=finish_one_then_interrupt)
    for op in (first, later, late_too):
        p.try_complete_else_watch(op, ["k"])
    with pytest.raises(KeyboardInterrupt):
        clock.advance(1)
    assert later.is_completed
    assert not later.is_expired
    assert p.num_delayed() == 1  # late_too, still due
    check_invariants(p)
    assert clock.advance(0) == 1
    assert late_too.is_expired


class Claims(FlagOperation):
    def try_complete(self) -> bool:
        super().try_complete()
        return True


class AsyncClaims(AsyncFlag):
    async def try_complete(self) -> bool:
        return True


@pytest.mark.asyncio
async def test_a_false_claim_is_reported_on_every_path() -> None:
    recorder = loop_errors()
    _clock, p = manual_purgatory()
    p.try_complete_else_watch(Claims(30), ["k"])
    assert len(recorder.contexts) == 2  # both tries of the watch
    p.check_and_complete("k")
    assert len(recorder.contexts) == 3
    p.try_complete_else_watch(AsyncClaims(30), ["a"])
    await until(lambda: len(recorder.contexts) == 4)
    assert all("without completing" in c["message"] for c in recorder.contexts)
    await p.shutdown()


# -- event logs that fail -------------------------------------------------------------------------


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


# -- Ported from Kafka's DelayedOperationTest -----------------------------------------------------
# Time is a `ManualClock`, so nothing here sleeps. Kafka's per-operation lock has no counterpart:
# a synchronous ``try_complete`` runs to the end on the loop thread, and an ``async def``
# ``try_complete`` gets the guarantees Kafka's lock and ``tryCompletePending`` flag gave it: at most
# one attempt in flight per operation, and a trigger that arrives during an attempt causes exactly
# one more attempt after it. The lock tests are translated to that model.


AnyPurgatory = DelayedOperationPurgatory[Any]


class MockOp(FlagOperation):
    """Kafka's ``MockDelayedOperation``: completes once `ready` is set (Kafka: ``completable``)."""

    def __init__(self, timeout: float = 100.0, name: str = "op") -> None:
        super().__init__(timeout, name)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def purgatory(clock: ManualClock) -> AnyPurgatory:
    return DelayedOperationPurgatory[Any]("mock", clock=clock)


async def settle(done: Callable[[], bool], max_yields: int = 1000) -> None:
    """Let the loop run other tasks until `done()` holds or `max_yields` steps have passed.

    Deterministic (no sleeping): the caller asserts `done()` afterwards, so a lost wake-up
    fails with a clear message instead of a timeout.
    """
    for _ in range(max_yields):
        if done():
            return
        await asyncio.sleep(0)


# -- satisfaction, expiry, purge -------------------------------------------------------------


def test_request_satisfaction(purgatory: AnyPurgatory) -> None:
    """Kafka ``testRequestSatisfaction``."""
    r1 = MockOp(name="r1")
    r2 = MockOp(name="r2")
    assert purgatory.check_and_complete("test1") == 0, "no waiting requests, nothing satisfied"
    assert not purgatory.try_complete_else_watch(r1, ["test1"]), "r1 not satisfied, watched"
    assert purgatory.check_and_complete("test1") == 0
    assert not purgatory.try_complete_else_watch(r2, ["test2"]), "r2 not satisfied, watched"
    assert purgatory.check_and_complete("test2") == 0
    check_invariants(purgatory)
    r1.ready = True
    assert purgatory.check_and_complete("test1") == 1, "r1 satisfied"
    assert purgatory.check_and_complete("test1") == 0
    check_invariants(purgatory)
    r2.ready = True
    assert purgatory.check_and_complete("test2") == 1, "r2 satisfied"
    assert purgatory.check_and_complete("test2") == 0
    check_invariants(purgatory)
    assert r1.calls == r2.calls == ["complete"]
    assert r1.is_completed
    assert not r1.is_expired
    stats = purgatory.statistics()
    assert (stats.completed, stats.expired, stats.delayed, stats.watched) == (2, 0, 0, 0)


def test_request_expiry(clock: ManualClock, purgatory: AnyPurgatory) -> None:
    """Kafka ``testRequestExpiry`` in virtual time (the real-time version is in test_asyncio.py).

    r1 (20 ms) expires exactly at its deadline, not a tick earlier; r2 (200 s) stays pending.
    """
    r1 = MockOp(0.020, "r1")
    r2 = MockOp(200.0, "r2")
    assert not purgatory.try_complete_else_watch(r1, ["test1"])
    assert not purgatory.try_complete_else_watch(r2, ["test2"])
    assert clock.advance(0.019) == 0
    assert not r1.is_completed
    assert clock.advance(0.001) == 1
    assert r1.is_completed
    assert r1.is_expired
    assert r1.calls == ["complete", "expire"]
    assert not r2.is_completed
    assert purgatory.num_delayed() == 1
    check_invariants(purgatory)


def test_request_purge(purgatory: AnyPurgatory) -> None:
    """Kafka ``testRequestPurge``: completion leaves the timer at once, the lists lazily."""
    r1, r2, r3 = MockOp(name="r1"), MockOp(name="r2"), MockOp(name="r3")
    purgatory.try_complete_else_watch(r1, ["test1"])
    purgatory.try_complete_else_watch(r2, ["test1", "test2"])
    purgatory.try_complete_else_watch(r3, ["test1", "test2", "test3"])
    assert purgatory.num_delayed() == 3
    assert purgatory.watched() == 6

    # Completing an operation takes it out of the timer immediately.
    r2.ready = True
    assert r2.try_complete()
    assert purgatory.num_delayed() == 2
    r3.ready = True
    assert r3.try_complete()
    assert purgatory.num_delayed() == 1
    assert purgatory.watched() == 6  # the watcher lists are cleaned lazily
    check_invariants(purgatory)

    # Checking a key drops the completed operations from that key's list, uncounted.
    assert purgatory.check_and_complete("test1") == 0
    assert purgatory.watched() == 4
    assert purgatory.check_and_complete("test2") == 0
    assert purgatory.watched() == 2
    assert purgatory.check_and_complete("test3") == 0
    assert purgatory.watched() == 1
    assert purgatory.statistics().keys == 1
    check_invariants(purgatory)


@pytest.mark.parametrize(("purge_interval", "watched_after_pass"), [(0, 1), (1000, 6)])
def test_request_purge_on_a_timer_pass(purge_interval: int, watched_after_pass: int) -> None:
    """Ours purges on a timer pass once ``estimated - num_delayed() > purge_interval``."""
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[MockOp](
        "mock", clock=clock, purge_interval=purge_interval
    )
    r1, r2, r3 = MockOp(name="r1"), MockOp(name="r2"), MockOp(name="r3")
    purgatory.try_complete_else_watch(r1, ["test1"])
    purgatory.try_complete_else_watch(r2, ["test1", "test2"])
    purgatory.try_complete_else_watch(r3, ["test1", "test2", "test3"])
    assert r2.force_complete()
    assert r3.force_complete()
    assert purgatory.watched() == 6  # nothing purges before a timer pass
    clock.advance(0)
    assert purgatory.watched() == watched_after_pass
    stats = purgatory.statistics()
    assert stats.purged == 6 - watched_after_pass
    assert stats.keys == (1 if purge_interval == 0 else 3)
    check_invariants(purgatory)


def test_purge_waits_for_more_than_purge_interval_finished_operations() -> None:
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[MockOp]("mock", clock=clock, purge_interval=2)
    ops = [MockOp(name=str(i)) for i in range(4)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, ["all", f"own{i}"])
    assert (purgatory.watched(), purgatory.statistics().keys) == (8, 5)
    assert ops[0].force_complete()
    assert ops[1].force_complete()
    clock.advance(0)  # 4 watched - 2 delayed = 2, not more than 2: no purge
    assert purgatory.watched() == 8
    assert purgatory.statistics().purged == 0
    assert ops[2].force_complete()
    clock.advance(0)  # 4 - 1 = 3 > 2: purge
    assert purgatory.watched() == 2
    assert purgatory.statistics().keys == 2
    assert purgatory.statistics().purged == 6
    check_invariants(purgatory)
    # The count restarted from the one still delayed: one more finished op is not enough.
    extra = MockOp(name="extra")
    purgatory.try_complete_else_watch(extra, ["all"])
    assert extra.force_complete()
    clock.advance(0)  # estimated 2 - delayed 1 = 1
    assert purgatory.watched() == 3
    check_invariants(purgatory)


def test_expired_operations_are_purged_in_the_same_pass() -> None:
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[MockOp]("mock", clock=clock, purge_interval=0)
    op = MockOp(1.0)
    purgatory.try_complete_else_watch(op, ["a", "b"])
    assert clock.advance(1.0) == 1
    assert op.is_expired
    assert (purgatory.watched(), purgatory.statistics().keys) == (0, 0)
    assert purgatory.statistics().purged == 2
    check_invariants(purgatory)


# -- cancel_for_key ------------------------------------------------------------------------


def test_cancel_for_key_returns_the_cancelled_operations(
    clock: ManualClock, purgatory: AnyPurgatory
) -> None:
    """Kafka ``shouldCancelForKeyReturningCancelledOperations``."""
    first, second, other = MockOp(10.0, "first"), MockOp(10.0, "second"), MockOp(10.0, "other")
    purgatory.try_complete_else_watch(first, ["key"])
    purgatory.try_complete_else_watch(second, ["key"])
    purgatory.try_complete_else_watch(other, ["key2"])

    assert purgatory.cancel_for_key("key") == [first, second]
    assert purgatory.num_delayed() == 1
    assert purgatory.watched() == 1
    assert purgatory.statistics().cancelled == 2
    check_invariants(purgatory)
    for op in (first, second):
        assert op.is_cancelled
        assert not op.is_completed
        assert not op.force_complete()  # a cancelled operation cannot complete
    first.ready = True
    assert purgatory.check_and_complete("key") == 0
    assert clock.advance(10.0) == 1
    assert other.is_expired
    assert first.calls == second.calls == []
    assert not first.is_expired
    check_invariants(purgatory)


def test_cancel_for_key_skips_completed_and_already_cancelled_operations(
    purgatory: AnyPurgatory,
) -> None:
    done = MockOp(name="done")
    pending = MockOp(name="pending")
    purgatory.try_complete_else_watch(done, ["key"])
    purgatory.try_complete_else_watch(pending, ["key", "other"])
    assert done.force_complete()  # still on "key"'s list until something drops it
    assert purgatory.cancel_for_key("key") == [pending]
    assert done.calls == ["complete"]
    assert not done.is_cancelled
    # `pending` is still on "other"'s list (lazily); it is cancelled once, not twice.
    assert purgatory.watched() == 1
    assert purgatory.cancel_for_key("other") == []
    assert purgatory.watched() == 0
    assert purgatory.cancel_for_key("key") == []
    assert purgatory.statistics().cancelled == 1
    check_invariants(purgatory)


def test_cancelled_operations_on_other_keys_are_dropped_uncounted(
    purgatory: AnyPurgatory,
) -> None:
    op = MockOp()
    purgatory.try_complete_else_watch(op, ["a", "b"])
    assert purgatory.cancel_for_key("a") == [op]
    op.ready = True
    assert purgatory.check_and_complete("b") == 0
    assert op.attempts == 2  # the two tries of the watch call, none from the check
    assert (purgatory.watched(), purgatory.statistics().keys) == (0, 0)
    check_invariants(purgatory)


def test_cancel_for_unknown_key_returns_nothing(purgatory: AnyPurgatory) -> None:
    """Kafka ``shouldReturnNilOperationsOnCancelForKeyWhenKeyDoesntExist``."""
    assert purgatory.cancel_for_key("key") == []
    assert purgatory.statistics().keys == 0
    assert purgatory.check_and_complete("key") == 0
    assert purgatory.statistics().keys == 0


@pytest.mark.asyncio
async def test_awaiters_of_an_operation_cancelled_for_its_key() -> None:
    purgatory = DelayedOperationPurgatory[MockOp]("mock", clock=ManualClock())
    op = MockOp()
    waiter = asyncio.create_task(purgatory.watch(op, ["key"]))
    await asyncio.sleep(0)
    assert purgatory.cancel_for_key("key") == [op]
    with pytest.raises(OperationCancelled) as raised:
        await waiter
    assert not isinstance(raised.value, PurgatoryClosed)
    assert op.calls == []
    await purgatory.shutdown()


# -- try_complete_else_watch: the first try, the second try, in between ----------------------


class ProbeOp(MockOp):
    """Records what the purgatory looked like at each try; completes on a chosen try."""

    def __init__(self, purgatory: AnyPurgatory, complete_on: int | None) -> None:
        super().__init__()
        self.purgatory = purgatory
        self.complete_on = complete_on
        self.seen: list[tuple[int, int]] = []  # (watched, num_delayed) at each try

    def try_complete(self) -> bool:
        self.seen.append((self.purgatory.watched(), self.purgatory.num_delayed()))
        self.ready = self.complete_on is not None and len(self.seen) >= self.complete_on
        return super().try_complete()


def test_complete_on_the_first_try_registers_nothing(
    clock: ManualClock, purgatory: AnyPurgatory
) -> None:
    """Kafka ``testSafeTryCompleteOrElse`` (true branch): no watch, no timer."""
    op = ProbeOp(purgatory, complete_on=1)
    assert purgatory.try_complete_else_watch(op, ["a", "b"])
    assert op.seen == [(0, 0)]
    assert (purgatory.watched(), purgatory.num_delayed(), purgatory.statistics().keys) == (0, 0, 0)
    assert op.calls == ["complete"]
    clock.advance(1000.0)
    assert op.calls == ["complete"]
    check_invariants(purgatory)


def test_not_complete_on_either_try_is_watched_then_timed(purgatory: AnyPurgatory) -> None:
    """Kafka ``testLockInTryCompleteElseWatch``: two plain tries, registration in between."""
    op = ProbeOp(purgatory, complete_on=None)
    assert not purgatory.try_complete_else_watch(op, ["a", "b"])
    # First try: nothing registered. Second try: on both lists, not yet in the timer.
    assert op.seen == [(0, 0), (2, 0)]
    assert (purgatory.watched(), purgatory.num_delayed()) == (2, 1)
    check_invariants(purgatory)


def test_completed_in_between_the_tries(clock: ManualClock, purgatory: AnyPurgatory) -> None:
    """The condition became true after the first try: the second try completes it.

    It never enters the timer; as in Kafka, it was added to the watcher lists and stays there
    until a check or a purge drops it.
    """
    op = ProbeOp(purgatory, complete_on=2)
    assert purgatory.try_complete_else_watch(op, ["a", "b"])
    assert op.seen == [(0, 0), (2, 0)]
    assert purgatory.num_delayed() == 0
    assert purgatory.watched() == 2
    assert purgatory.check_and_complete("a") == 0
    assert purgatory.watched() == 1
    check_invariants(purgatory)
    clock.advance(1000.0)
    assert op.calls == ["complete"]
    assert not op.is_expired


class TriggerDuringSecondTryOp(MockOp):
    """On its second try, makes itself completable and fires a trigger on its own key."""

    def __init__(self, purgatory: AnyPurgatory, key: Hashable) -> None:
        super().__init__()
        self.purgatory = purgatory
        self.key = key
        self.nested: list[int] = []

    def try_complete(self) -> bool:
        if self.attempts == 1 and not self.nested:
            self.attempts += 1
            self.ready = True
            self.nested.append(self.purgatory.check_and_complete(self.key))
            return self.force_complete()  # somebody else won: False
        return super().try_complete()


def test_completed_by_a_trigger_during_the_second_try(purgatory: AnyPurgatory) -> None:
    """Kafka: "the operation is completed (by another thread) between the two tryComplete()"."""
    op = TriggerDuringSecondTryOp(purgatory, "key")
    assert purgatory.try_complete_else_watch(op, ["key"])
    assert op.nested == [1]  # the nested trigger completed it
    assert op.calls == ["complete"]
    assert (purgatory.watched(), purgatory.num_delayed()) == (0, 0)
    check_invariants(purgatory)


class SilentCompleteOp(MockOp):
    """Completes itself but returns False: the purgatory must look at the state, not the value."""

    def try_complete(self) -> bool:
        self.attempts += 1
        self.force_complete()
        return False


def test_completion_is_read_from_the_operation_not_the_return_value(
    purgatory: AnyPurgatory,
) -> None:
    op = SilentCompleteOp()
    assert purgatory.try_complete_else_watch(op, ["key"])
    assert op.attempts == 1
    assert (purgatory.watched(), purgatory.num_delayed()) == (0, 0)
    assert op.calls == ["complete"]


class FailingOp(MockOp):
    def __init__(self, fail_on: int) -> None:
        super().__init__()
        self.fail_on = fail_on

    def try_complete(self) -> bool:
        if self.attempts + 1 == self.fail_on:
            self.attempts += 1
            raise RuntimeError(f"try {self.fail_on} failed")
        return super().try_complete()


@pytest.mark.parametrize("fail_on", [1, 2])
def test_a_raising_try_propagates_and_leaves_nothing_registered(
    purgatory: AnyPurgatory, fail_on: int
) -> None:
    op = FailingOp(fail_on)
    with pytest.raises(RuntimeError, match=f"try {fail_on} failed"):
        purgatory.try_complete_else_watch(op, ["a", "b"])
    assert op.attempts == fail_on
    assert (purgatory.watched(), purgatory.num_delayed(), purgatory.statistics().keys) == (0, 0, 0)
    check_invariants(purgatory)


# -- the operation lock, translated ----------------------------------------------------------


def test_completable_operations_on_one_key_all_complete(purgatory: AnyPurgatory) -> None:
    """Kafka ``verifyDelayedOperationLock``: "if locks are free all completable ops complete"."""
    ops = [MockOp(name=str(i)) for i in range(2)]
    for op in ops:
        assert not purgatory.try_complete_else_watch(op, ["key"])
    for op in ops:
        op.ready = True
    assert purgatory.check_and_complete("key") == 2
    assert all(op.calls == ["complete"] for op in ops)
    # "Immediately completable operations should complete without locking."
    for op in (MockOp(name="now1"), MockOp(name="now2")):
        op.ready = True
        assert purgatory.try_complete_else_watch(op, ["key"])
        assert op.is_completed
    check_invariants(purgatory)


class ReentrantOp(MockOp):
    """Its ``on_complete`` triggers its own key again (Kafka: the lock held by this thread)."""

    def __init__(self, purgatory: AnyPurgatory, key: Hashable) -> None:
        super().__init__(name="reentrant")
        self.purgatory = purgatory
        self.key = key
        self.nested: list[int] = []

    def on_complete(self) -> str:
        result = super().on_complete()
        self.nested.append(self.purgatory.check_and_complete(self.key))
        return result


def test_check_and_complete_reentered_from_on_complete(purgatory: AnyPurgatory) -> None:
    """Kafka: "lock held by current thread, completable operations should complete"."""
    first = ReentrantOp(purgatory, "key")
    second = MockOp(name="second")
    purgatory.try_complete_else_watch(first, ["key"])
    purgatory.try_complete_else_watch(second, ["key"])
    first.ready = second.ready = True
    # `first` completes in the outer call; its on_complete re-enters and completes `second`,
    # which the outer call then finds completed and does not count again.
    assert purgatory.check_and_complete("key") == 1
    assert first.nested == [1]
    assert first.calls == second.calls == ["complete"]
    assert purgatory.statistics().completed == 2
    assert (purgatory.watched(), purgatory.statistics().keys) == (0, 0)
    check_invariants(purgatory)


class AsyncFlagOp(DelayedOperation[str]):
    """An ``async def try_complete`` that reads `ready`, then waits on `gate`."""

    def __init__(self, gate: asyncio.Event, timeout: float = 100.0) -> None:
        super().__init__(timeout)
        self.gate = gate
        self.ready = False
        self.attempts = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls: list[str] = []

    async def try_complete(self) -> bool:
        self.attempts += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        should_complete = self.ready
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        if should_complete:
            return self.force_complete()
        return False

    def on_complete(self) -> str:
        self.calls.append("complete")
        return "async done"

    def on_expiration(self) -> None:
        self.calls.append("expire")


@pytest.mark.asyncio
async def test_try_complete_lock_contention() -> None:
    """Kafka ``testTryCompleteLockContention``, with an async attempt in place of the lock.

    A trigger arriving while an attempt is suspended neither blocks nor starts a second attempt;
    when the attempt ends, exactly one more runs, and completes the operation.
    """
    errors = loop_errors().contexts
    purgatory = DelayedOperationPurgatory[AsyncFlagOp]("mock", clock=ManualClock())
    gate = asyncio.Event()
    gate.set()
    op = AsyncFlagOp(gate)
    assert not purgatory.try_complete_else_watch(op, ["key"])
    assert op.attempts == 0  # the attempt is a task of its own, not run in the caller's
    await settle(lambda: op.attempts == 1 and not op.in_flight)
    assert op.attempts == 1

    gate.clear()
    assert purgatory.check_and_complete("key") == 0  # attempt 2 starts, sees "not yet", waits
    await settle(lambda: op.attempts == 2)
    assert op.attempts == 2
    op.ready = True
    for _ in range(3):  # these must not block, and must not pile up
        assert purgatory.check_and_complete("key") == 0
    assert op.attempts == 2
    assert not op.is_completed
    await asyncio.sleep(0)
    assert op.attempts == 2

    gate.set()
    await settle(lambda: op.is_completed)
    assert op.is_completed, "the trigger that arrived during the attempt was lost"
    assert await op == "async done"
    assert op.attempts == 3
    assert op.max_in_flight == 1
    assert op.calls == ["complete"]
    assert purgatory.num_delayed() == 0
    check_invariants(purgatory)
    assert errors == []
    await purgatory.shutdown()


@pytest.mark.asyncio
async def test_an_attempt_in_flight_does_not_hold_up_the_other_operations() -> None:
    """Kafka: "lock held by another thread, should not block, only operations that can be locked
    without blocking complete" - and the held-up one completes once its attempt ends."""
    errors = loop_errors().contexts
    purgatory = DelayedOperationPurgatory[Any]("mock", clock=ManualClock())
    gate = asyncio.Event()
    busy = AsyncFlagOp(gate)
    free = MockOp(name="free")
    assert not purgatory.try_complete_else_watch(busy, ["key"])
    assert not purgatory.try_complete_else_watch(free, ["key"])
    await settle(lambda: busy.attempts == 1)  # its attempt's task is suspended on the gate
    assert busy.attempts == 1
    busy.ready = free.ready = True
    assert purgatory.check_and_complete("key") == 1
    assert free.calls == ["complete"]
    assert not busy.is_completed
    gate.set()
    await settle(lambda: busy.is_completed)
    assert busy.is_completed, "the trigger that arrived during the attempt was lost"
    assert busy.attempts == 2  # the pending re-run, with no further trigger
    assert busy.calls == ["complete"]
    check_invariants(purgatory)
    assert errors == []
    await purgatory.shutdown()


# -- testTryCompleteWithMultipleThreads ------------------------------------------------------


OPERATIONS = 100


TRIGGERS = 20  # Kafka's completionAttempts: 100 x 20 = 2000 triggers


class StressOp(DelayedOperation[int]):
    """Kafka's ``TestDelayOperation`` as an async attempt, instrumented against the contract.

    Each attempt reads `ready`, then yields a random number of times (Kafka sleeps a random
    0-10 ms), then completes if it had read True. `note_trigger` is called right before each
    trigger and keeps the count of attempts the contract calls for: one for the watch, one per
    trigger that finds no attempt in flight, and one per attempt that saw a trigger arrive while
    it ran and ended without completing.
    """

    # The state and the counts start at these class values; each operation keeps its own.
    ready = False
    in_flight = False
    # An attempt is queued (its task started by the watch or a trigger, or a re-run owed by an
    # attempt that saw a trigger) and has not begun: a trigger now is folded into it.
    owed = True
    triggered_during = False
    expected_attempts = 1
    attempts = coalesced = overlaps = unexpected = completions = expirations = 0

    def __init__(self, index: int, rng: random.Random, max_yields: int) -> None:
        super().__init__(100.0)
        self.index = index
        self.key = f"key{index}"
        self.rng = rng
        self.max_yields = max_yields
        self.remaining = TRIGGERS

    async def try_complete(self) -> bool:
        if self.in_flight:
            self.overlaps += 1
        self.in_flight = True
        self.owed = False
        self.triggered_during = False
        self.attempts += 1
        if self.attempts > self.expected_attempts:
            self.unexpected += 1
        should_complete = self.ready
        for _ in range(self.rng.randrange(self.max_yields + 1)):
            await asyncio.sleep(0)
        self.in_flight = False
        if should_complete:
            return self.force_complete()
        if self.triggered_during:
            self.owed = True
            self.expected_attempts += 1
        return False

    def note_trigger(self) -> None:
        if self.is_completed:
            return
        if self.in_flight:
            self.triggered_during = True
            self.coalesced += 1
        elif not self.owed:
            self.expected_attempts += 1
            self.owed = True

    def on_complete(self) -> int:
        self.completions += 1
        return self.index

    def on_expiration(self) -> None:
        self.expirations += 1


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_try_complete_with_many_concurrent_triggers(seed: int) -> None:
    """Kafka ``testTryCompleteWithMultipleThreads``: 100 operations, 2000 triggers as tasks.

    Every operation completes exactly once; no two attempts of one operation overlap; the number
    of attempts is exactly what the contract calls for (no lost wake-up, no pile-up).
    """
    errors = loop_errors().contexts
    rng = random.Random(seed)
    purgatory = DelayedOperationPurgatory[StressOp]("mock", clock=ManualClock())
    ops = [StressOp(i, rng, max_yields=10) for i in range(OPERATIONS)]
    for op in ops:
        assert not purgatory.try_complete_else_watch(op, [op.key])
    check_invariants(purgatory)

    async def trigger(op: StressOp, delay: int) -> None:
        for _ in range(delay):
            await asyncio.sleep(0)
        op.remaining -= 1
        if op.remaining == 0:
            op.ready = True
        op.note_trigger()
        purgatory.check_and_complete(op.key)

    await asyncio.gather(*(trigger(op, rng.randrange(20)) for _ in range(TRIGGERS) for op in ops))
    # Every trigger has run; at most an attempt and its re-run are left per operation.
    await settle(lambda: all(op.is_completed for op in ops))
    for op in ops:
        assert op.is_completed, f"{op.key}: a wake-up was lost"
    assert [await op for op in ops] == list(range(OPERATIONS))
    for op in ops:
        assert (op.completions, op.expirations) == (1, 0), op.key
        assert op.overlaps == 0, op.key
        assert op.unexpected == 0, op.key
        assert op.attempts == op.expected_attempts, op.key
        assert op.remaining == 0
    # The schedule did exercise the interesting path: triggers during attempts.
    assert sum(op.coalesced for op in ops) > 0
    assert sum(op.attempts for op in ops) < OPERATIONS * (TRIGGERS + 1)
    assert purgatory.statistics().completed == OPERATIONS
    assert purgatory.num_delayed() == 0
    for op in ops:
        purgatory.check_and_complete(op.key)
    assert (purgatory.watched(), purgatory.statistics().keys) == (0, 0)
    check_invariants(purgatory)
    assert errors == []
    await purgatory.shutdown()


class ThreadedOp(StressOp):
    """Kafka's ``TestDelayOperation`` for triggers that come from other threads: a `StressOp`
    whose `remaining` triggers the threads count down under `lock`, and which must not expire.

    The contract's count of attempts (`note_trigger`) is not kept here: a thread cannot note a
    trigger in step with the attempts on the loop. The rng is used on the loop thread only.
    """

    def __init__(self, index: int, rng: random.Random) -> None:
        super().__init__(index, rng, max_yields=5)
        self.lock = threading.Lock()

    def on_expiration(self) -> None:
        raise AssertionError("must not expire")


@pytest.mark.asyncio
async def test_try_complete_with_triggers_from_other_threads() -> None:
    """The closest port of Kafka's threaded test: triggers via `check_and_complete_threadsafe`."""
    errors = loop_errors().contexts
    rng = random.Random(42)
    purgatory = DelayedOperationPurgatory[ThreadedOp]("mock", clock=ManualClock())
    ops = [ThreadedOp(i, rng) for i in range(OPERATIONS)]
    for op in ops:
        assert not purgatory.try_complete_else_watch(op, [op.key])

    def trigger(op: ThreadedOp, delay: float) -> None:
        time.sleep(delay)
        with op.lock:
            op.remaining -= 1
            last = op.remaining == 0
        if last:
            op.ready = True
        purgatory.check_and_complete_threadsafe(op.key)

    delays = [0.0, 0.0, 0.0005, 0.001]
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [
            pool.submit(trigger, op, rng.choice(delays)) for _ in range(TRIGGERS) for op in ops
        ]
        # No timer while the threads trigger: the loop waits for them and runs the attempts.
        await asyncio.gather(*(asyncio.wrap_future(future) for future in futures))
        async with asyncio.timeout(60):  # every trigger is queued: what is left is the loop's
            results = [await op for op in ops]
    assert results == list(range(OPERATIONS))
    for op in ops:
        assert op.completions == 1
        assert op.overlaps == 0
        assert 1 <= op.attempts <= TRIGGERS + 1
    check_invariants(purgatory)
    assert errors == []
    await purgatory.shutdown()


# -- testDelayedFuture -----------------------------------------------------------------------


def watch_futures(
    purgatory: DelayedOperationPurgatory[DelayedFuture],
    timeout: float,
    futures: list[asyncio.Future[int]],
) -> DelayedFuture:
    """Kafka's ``DelayedFuturePurgatory.tryCompleteElseWatch``: watch, and let each future's
    completion trigger a check."""
    op = DelayedFuture(timeout, futures)
    key = ("futures", id(op))
    completed = purgatory.try_complete_else_watch(op, [key])
    assert completed == op.is_completed

    def trigger(_: asyncio.Future[int]) -> None:
        purgatory.check_and_complete(key)

    for future in futures:
        future.add_done_callback(trigger)
    return op


@pytest.mark.asyncio
async def test_delayed_future() -> None:
    """Kafka ``testDelayedFuture``, in virtual time."""
    loop = asyncio.get_running_loop()
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[DelayedFuture]("testDelayedFuture", clock=clock)

    def done(value: int) -> asyncio.Future[int]:
        future = loop.create_future()
        future.set_result(value)
        return future

    # Two completed futures: completes at once, in the watch call.
    r1 = watch_futures(purgatory, 100.0, [done(10), done(11)])
    assert r1.is_completed
    assert await r1 == 21

    # Two pending futures: waits for both.
    futures2: list[asyncio.Future[int]] = [loop.create_future(), loop.create_future()]
    r2 = watch_futures(purgatory, 100.0, futures2)
    assert not r2.is_completed
    futures2[0].set_result(20)
    await asyncio.sleep(0)
    assert not r2.is_completed
    futures2[1].set_result(21)
    async with asyncio.timeout(5):
        assert await r2 == 41

    # One pending, one completed: waits for the pending one.
    futures3: list[asyncio.Future[int]] = [loop.create_future(), done(31)]
    r3 = watch_futures(purgatory, 100.0, futures3)
    assert not r3.is_completed
    futures3[0].set_result(30)
    async with asyncio.timeout(5):
        assert await r3 == 61

    # One never completes: the operation expires at its deadline; that future times out.
    futures4: list[asyncio.Future[int]] = [loop.create_future(), loop.create_future()]
    r4 = watch_futures(purgatory, 2.0, futures4)
    futures4[0].set_result(40)
    await asyncio.sleep(0)
    assert not r4.is_completed
    clock.advance(1.999)
    assert not r4.is_completed
    clock.advance(0.001)
    assert r4.is_expired
    assert await r4 == 40
    assert isinstance(futures4[1].exception(), TimeoutError)
    check_invariants(purgatory)
    await purgatory.shutdown()


# -- Ported from Kafka's TimerTest (SystemTimer) --------------------------------------------------
# Kafka tests its timer directly; ours is reached through `DelayedOperationPurgatory`, with a
# `ManualClock` standing in for Kafka's polling ``advanceClock`` loop, so every expiry happens at a
# known virtual time and can be compared exactly. Kafka's ``tickMs = 1`` becomes ``tick=1.0``
# (seconds) where exact float arithmetic matters, and the default one-millisecond tick elsewhere.


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


def timer_scene(
    start: float = 0.0, **options: Any
) -> tuple[ManualClock, DelayedOperationPurgatory[TimerOp], list[int]]:
    """The setting of Kafka's timer tests: a purgatory of `TimerOp` on a `ManualClock` of its
    own from `start` (`options`: its other arguments), and the log its operations expire into."""
    clock = ManualClock(start)
    return clock, DelayedOperationPurgatory[TimerOp]("timer", clock=clock, **options), []


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
    clock, purgatory, log = timer_scene(start, wheel_size=wheel_size)
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
    clock, purgatory, log = timer_scene(tick=1.0, wheel_size=wheel_size)
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
    clock, purgatory, log = timer_scene(tick=1.0, wheel_size=wheel_size)
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
    clock, purgatory, log = timer_scene(wheel_size=wheel_size)
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
    clock, purgatory, log = timer_scene(tick=1.0, wheel_size=wheel_size)
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
    clock, purgatory, log = timer_scene()
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
    clock, purgatory, log = timer_scene(tick=1.0)
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
    clock, purgatory, log = timer_scene(tick=tick, wheel_size=wheel_size)
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
    clock, purgatory, log = timer_scene()
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
    clock, purgatory, log = timer_scene()
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


# -- drain: answer every parked operation now -------------------------------------------------


def test_drain_expires_every_pending_operation_now_in_deadline_order() -> None:
    _clock, p = manual_purgatory()
    order: list[str] = []

    class Noted(FlagOperation):
        def on_expiration(self) -> None:
            order.append(self.name)

    ops = [Noted(timeout, name) for timeout, name in [(30.0, "late"), (5.0, "soon"), (9.0, "mid")]]
    for i, op in enumerate(ops):
        p.try_complete_else_watch(op, [i, "shared"])
    done = FlagOperation(30.0, "done")
    p.try_complete_else_watch(done, ["shared"])
    done.ready = True
    assert p.check_and_complete("shared") == 1
    assert p.drain() == 3
    assert order == ["soon", "mid", "late"]
    assert all(op.is_expired and op.calls == ["complete"] for op in ops)
    stats = p.statistics()
    assert (p.num_delayed(), stats.drained, stats.expired, stats.completed) == (0, 3, 0, 1)
    assert p.draining
    assert not p.closed
    assert "draining" in repr(p)
    check_invariants(p)


def test_drain_lets_the_application_answer_first_and_expires_the_rest() -> None:
    _clock, p = manual_purgatory()
    ops = [FlagOperation(30.0, name) for name in "abc"]
    for op in ops:
        p.try_complete_else_watch(op, [op.name])

    def answer(op: FlagOperation) -> None:
        if op.name != "b":
            op.ready = True
            op.force_complete()

    assert p.drain(answer) == 3
    assert [(op.is_completed, op.is_expired) for op in ops] == [
        (True, False),
        (True, True),
        (True, False),
    ]
    check_invariants(p)


@pytest.mark.asyncio
async def test_an_answer_that_raises_is_reported_and_the_drain_goes_on() -> None:
    """Every operation is answered: the raising answer's operation expires as at its deadline,
    and the error goes to the loop's exception handler."""
    errors = loop_errors()
    _clock, p = manual_purgatory()
    ops = [FlagOperation(30.0, name) for name in "abcd"]
    for op in ops:
        p.try_complete_else_watch(op, [op.name])

    def answer(op: FlagOperation) -> None:
        if op.name == "b":
            raise Boom("cannot answer b")
        op.ready = True
        op.force_complete()

    assert p.drain(answer) == 4
    assert [(op.is_completed, op.is_expired) for op in ops] == [
        (True, False),
        (True, True),
        (True, False),
        (True, False),
    ]
    assert [type(exc) for exc in errors.exceptions] == [Boom]
    assert "drain's answer raised for FlagOperation" in errors.contexts[0]["message"]
    assert errors.contexts[0]["operation"] is ops[1]
    assert p.num_delayed() == 0
    check_invariants(p)


class Ends:
    """An event log that keeps each operation's outcome (the `EventLog` protocol's calls)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def record_watch(self, *args: Any) -> None:
        pass

    def record_end(
        self, purgatory: str, op: DelayedOperation[Any], outcome: str, ended_at: float
    ) -> None:
        assert isinstance(op, FlagOperation)
        self.outcomes[op.name] = outcome

    def flush(self) -> None:
        pass


def test_drained_operations_have_an_outcome_of_their_own() -> None:
    """A drain's answers are not expiries: ``statistics().drained`` and the event log's
    ``"drained"`` count them (those the drain expires and those watched while draining),
    apart from the operations that expired at their deadline before it."""
    ends = Ends()
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("drained", clock=clock, event_log=ends)
    early, parked, answered = (FlagOperation(t, n) for t, n in [(1, "early"), (30, "p"), (30, "a")])
    for op in (early, parked, answered):
        p.try_complete_else_watch(op, [op.name])
    clock.advance(1.0)  # `early` expires at its deadline

    def answer(op: FlagOperation) -> None:
        if op is answered:
            op.ready = True
            op.force_complete()

    assert p.drain(answer) == 2
    late = FlagOperation(30, "late")
    p.try_complete_else_watch(late, ["k"])
    clock.advance(0.0)  # the next pass answers it
    assert all(op.is_expired for op in (early, parked, late))  # as at their deadline
    stats = p.statistics()
    assert (stats.expired, stats.drained, stats.completed) == (1, 2, 1)
    asyncio.run(p.shutdown())
    assert ends.outcomes == {
        "early": "expired",
        "p": "drained",
        "a": "completed",
        "late": "drained",
    }


def test_after_a_drain_new_operations_are_answered_at_the_next_pass() -> None:
    clock, p = manual_purgatory()
    p.drain()
    ready = FlagOperation(30.0, "ready")
    ready.ready = True
    assert p.try_complete_else_watch(ready, ["k"]) is True  # tried as usual
    parked = FlagOperation(30.0, "parked")
    assert p.try_complete_else_watch(parked, ["k"]) is False
    assert not parked.is_completed  # never inside the watch call
    assert clock.advance(0.0) == 1  # the next pass, not its 30 s timeout
    assert parked.is_expired
    check_invariants(p)


def test_drain_of_a_shut_down_purgatory_is_refused() -> None:
    _clock, p = manual_purgatory()
    asyncio.run(p.shutdown())
    with pytest.raises(PurgatoryClosed):
        p.drain()


@pytest.mark.asyncio
async def test_awaiting_watchers_get_their_answer_from_a_drain() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("drain", clock=clock)
    ops = [FlagOperation(30.0, str(i)) for i in range(3)]
    waiting = [asyncio.create_task(p.watch(op, [i])) for i, op in enumerate(ops)]
    await asyncio.sleep(0)
    assert p.drain() == 3
    assert await asyncio.gather(*waiting) == ["0 done", "1 done", "2 done"]
    await p.shutdown()
