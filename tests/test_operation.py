"""`DelayedOperation` (`purgatory._operation`): its timeout, completing outside a purgatory, and
what its awaiters get, whatever `on_complete` raises."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest
from helpers import Custom, FlagOperation, Raises, loop_errors, manual_purgatory

from purgatory import (
    DelayedOperation,
    DelayedOperationPurgatory,
)
from purgatory.testing import check_invariants

#: The event loops run in virtual time (conftest.py): an expiry costs no wall time.
pytestmark = pytest.mark.virtualclock


@pytest.mark.parametrize("timeout", [-0.001, math.nan, math.inf, -math.inf])
def test_operation_rejects_bad_timeouts(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        FlagOperation(timeout)


@pytest.mark.parametrize("timeout", ["1", None, True])
def test_operation_rejects_non_numbers(timeout: object) -> None:
    with pytest.raises(TypeError, match="timeout"):
        FlagOperation(timeout)  # type: ignore[arg-type]


def test_zero_and_integer_timeouts_are_fine() -> None:
    assert FlagOperation(0).timeout == 0.0
    assert FlagOperation(3).timeout == 3.0


def test_force_complete_outside_a_purgatory_runs_on_complete_once() -> None:
    op = FlagOperation(1)
    assert op.force_complete()
    assert not op.force_complete()
    assert op.calls == ["complete"]
    assert op.is_completed
    assert not op.is_expired
    assert not op.is_cancelled


# -- awaiting an operation ------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["check", "threadsafe", "force", "expiry"])
async def test_a_base_exception_in_on_complete_reaches_every_awaiter(path: str) -> None:
    loop_errors()  # the loop's reports of the raise: recorded, not logged
    error = Custom("from on_complete")
    async with DelayedOperationPurgatory[FlagOperation]("awaiters") as p:
        op = Raises(0.02 if path == "expiry" else 30, "on_complete", error)
        first = asyncio.create_task(p.watch(op, ["k"]))
        await asyncio.sleep(0)
        second = asyncio.create_task(outcome_of(op))
        await asyncio.sleep(0)
        op.ready = True
        if path == "check":
            p.check_and_complete("k")
        elif path == "threadsafe":
            thread = threading.Thread(target=p.check_and_complete_threadsafe, args=("k",))
            thread.start()
            thread.join()
        elif path == "force":
            assert op.force_complete() is True
        results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 5)
        assert list(results) == [error, error]
        with pytest.raises(Custom):
            await op


def test_a_base_exception_in_on_complete_under_the_manual_clock() -> None:
    clock, p = manual_purgatory()
    error = Custom("manual")
    op = Raises(0.01, "on_complete", error)
    p.try_complete_else_watch(op, ["k"])
    clock.advance(0.01)
    assert op.is_expired
    assert op._result is error
    check_invariants(p)


async def outcome_of(op: DelayedOperation[Any]) -> Any:
    return await op


@pytest.mark.asyncio
async def test_awaiting_an_operation_never_watched_raises() -> None:
    op = FlagOperation(1)
    with pytest.raises(RuntimeError, match="never watched"):
        await asyncio.wait_for(outcome_of(op), 5.0)


def test_on_expiration_needs_no_override() -> None:
    """Only try_complete and on_complete are abstract: on_complete already sees is_expired."""

    class Minimal(DelayedOperation[str]):
        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> str:
            return "expired" if self.is_expired else "done"

    clock, p = manual_purgatory()
    op = Minimal(0.5)
    p.try_complete_else_watch(op, ["k"])
    clock.advance(0.5)
    assert op.is_expired
    assert op._result == "expired"

    class Incomplete(DelayedOperation[None]):  # on_complete stays abstract
        def try_complete(self) -> bool:
            return False

    with pytest.raises(TypeError, match="on_complete"):
        Incomplete(1.0)  # type: ignore[abstract]
    check_invariants(p)
