"""Callbacks that raise or re-enter, triggers from other threads: nothing lost, nothing twice."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from helpers import FlagOperation, Recorder

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory.testing import ManualClock, check_invariants


class Boom(Exception):
    pass


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


class RaisingComplete(FlagOperation):
    def on_complete(self) -> str:
        super().on_complete()
        raise Boom("on_complete")


class RaisingExpiration(FlagOperation):
    def on_expiration(self) -> None:
        super().on_expiration()
        raise Boom("on_expiration")


def manual(**kwargs: Any) -> tuple[ManualClock, DelayedOperationPurgatory[FlagOperation]]:
    clock = ManualClock()
    return clock, DelayedOperationPurgatory("failures", clock=clock, **kwargs)


@pytest.mark.parametrize("attempt", [1, 2])
def test_try_complete_raising_inside_the_watch_leaves_nothing_registered(attempt: int) -> None:
    clock, p = manual()
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
    _, p = manual()
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


def test_on_complete_raising_without_awaiter_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, p = manual()
    op = RaisingComplete(1)
    p.try_complete_else_watch(op, ["k"])
    op.ready = True
    with caplog.at_level(logging.ERROR, logger="purgatory"):
        assert p.check_and_complete("k") == 1
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
    clock, p = manual()
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
    clock, p = manual()
    op = RaisingComplete(0.1)
    p.try_complete_else_watch(op, ["k"])
    clock.advance(0.1)
    assert op.calls == ["complete", "expire"]
    assert op.is_expired


@pytest.mark.asyncio
async def test_await_re_raises_what_on_complete_raised() -> None:
    recorder = Recorder()
    asyncio.get_running_loop().set_exception_handler(recorder)
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


@pytest.mark.asyncio
async def test_reaper_survives_raising_callbacks() -> None:
    recorder = Recorder()
    asyncio.get_running_loop().set_exception_handler(recorder)
    async with DelayedOperationPurgatory[FlagOperation]("survivor") as p:
        first = RaisingExpiration(0.01)
        p.try_complete_else_watch(first, ["k"])
        second = RaisingComplete(0.03)
        with pytest.raises(Boom):
            await p.watch(second, ["k"])
        assert first.is_expired
        third = FlagOperation(0.01)
        assert await p.watch(third, ["k"]) == "op done"
        assert third.is_expired
    assert [str(e) for e in recorder.exceptions] == ["on_expiration"]


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
    clock, p = manual(purge_interval=0)
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
    _, p = manual()
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
        results = await asyncio.wait_for(asyncio.gather(*waiters), 10)
        thread.join()
        assert results == [f"op{i} done" for i in range(50)]
        assert all(op.calls == ["complete"] for op in ops)
        assert p.num_delayed() == 0


class AsyncRaising(DelayedOperation[str]):
    def __init__(self) -> None:
        super().__init__(30)
        self.attempts = 0

    async def try_complete(self) -> bool:
        self.attempts += 1
        await asyncio.sleep(0)
        if self.attempts == 1:
            raise Boom("async attempt")
        return self.force_complete()

    def on_complete(self) -> str:
        return "async done"

    def on_expiration(self) -> None:
        pass


@pytest.mark.asyncio
async def test_async_try_complete_raising_is_reported_and_the_operation_survives() -> None:
    recorder = Recorder()
    asyncio.get_running_loop().set_exception_handler(recorder)
    async with DelayedOperationPurgatory[AsyncRaising]("async") as p:
        op = AsyncRaising()
        task = asyncio.create_task(p.watch(op, ["k"]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert [str(e) for e in recorder.exceptions] == ["async attempt"]
        assert not op.is_completed
        p.check_and_complete("k")
        assert await asyncio.wait_for(task, 5) == "async done"
        assert op.attempts == 2


def test_try_complete_claiming_success_without_completing_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Liar(FlagOperation):
        def try_complete(self) -> bool:
            self.attempts += 1
            return self.ready

    _, p = manual()
    op = Liar(1)
    p.try_complete_else_watch(op, ["k"])
    op.ready = True
    with caplog.at_level(logging.ERROR, logger="purgatory"):
        assert p.check_and_complete("k") == 0
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

    _, p = manual()
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
