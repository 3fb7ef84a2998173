"""`purgatory.testing`'s invariant checks: one per owner of state, and one for everything.

Each check must pass on a consistent purgatory and fail, with `AssertionError`, when its own
owner's state is broken (here by hand), while the other owner's check still passes.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import FlagOperation

from purgatory import DelayedOperationPurgatory
from purgatory.testing import ManualClock, check_invariants, check_watchers, check_wheel


def watching() -> tuple[DelayedOperationPurgatory[FlagOperation], FlagOperation]:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("checked", clock=clock)
    op = FlagOperation(5.0)
    p.try_complete_else_watch(op, ["a", "b"])
    p.try_complete_else_watch(FlagOperation(0.5), {"a": 3})
    clock.advance(0.1)
    return p, op


def test_every_check_passes_on_a_consistent_purgatory() -> None:
    p, _op = watching()
    check_wheel(p)
    check_watchers(p)
    check_invariants(p)


def test_check_wheel_finds_an_entry_outside_its_buckets_span() -> None:
    p, op = watching()
    op._deadline += 10**6  # the wheel's timer entry protocol, broken by hand
    with pytest.raises(AssertionError, match="outside"):
        check_wheel(p)
    with pytest.raises(AssertionError):
        check_invariants(p)
    check_watchers(p)  # the lists do not look at deadlines


def test_check_watchers_finds_a_wrong_count_of_lists() -> None:
    p, op = watching()
    op._listed += 1
    with pytest.raises(AssertionError, match="counts 3 lists, is on 2"):
        check_watchers(p)
    with pytest.raises(AssertionError):
        check_invariants(p)
    check_wheel(p)  # the wheel does not count lists


@pytest.mark.parametrize("check", [check_invariants, check_wheel, check_watchers])
def test_a_check_given_something_else_than_a_purgatory_says_so(check: Any) -> None:
    with pytest.raises(TypeError, match=r"takes a DelayedOperationPurgatory, got 'p'"):
        check("p")
