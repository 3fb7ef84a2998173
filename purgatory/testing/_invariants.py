"""Invariant checks: what must hold inside a purgatory between any two calls.

Each owner of state checks its own (``_check``, as sortedcontainers' lists do): the timing
wheel its buckets, the timer its count and its clock, the watcher lists their keys, counts and
purge queue, one key's threshold watchers their thresholds; `check_invariants` then checks what
ties them together. These functions are the way
tests call them: one per owner, each reached through the purgatory, and one for everything.

`check_timing_wheel` and `check_threshold_watchers` take the internal object itself, for the
project's own tests of those classes alone; they are not exported.
"""

from __future__ import annotations

from typing import Any

from .._operation import FINISHED
from .._purgatory import PURGATORY_TYPES, DelayedOperationPurgatory
from .._thresholds import ThresholdWatchers
from .._wheel import TimingWheel

__all__ = (
    "check_invariants",
    "check_threshold_watchers",
    "check_timing_wheel",
    "check_watchers",
    "check_wheel",
)


def check_invariants(purgatory: DelayedOperationPurgatory[Any]) -> None:
    """Raise ``AssertionError`` if `purgatory`'s wheel, watcher lists or their ties disagree.

    Runs `check_wheel` and `check_watchers`, then checks what ties the two together: every
    timed operation is pending and this purgatory's, every pending operation on a watcher list
    is timed, and the count of delayed operations is the wheel's size.

    Args:
        purgatory: The purgatory to check (after any step of a test).
    """
    p = _purgatory(purgatory, "check_invariants")
    timer = p._timer
    binding = p._binding
    timer._check(timer.current_time() if binding.bound else None, binding.reaper is None)
    p._lists._check()
    # What ties the parts together: every timed operation is pending and this purgatory's;
    # every pending operation on a list is this purgatory's and timed (or its watch is under
    # way, or a pass took it and has not expired it yet).
    for op in timer.wheel:
        assert not op._state & FINISHED, f"finished {op!r} is still timed"
        assert op._owner is p, f"timed {op!r} is not this purgatory's"
    in_pass = timer.in_flight() > 0
    for key, ops in p._lists:
        for op in ops:
            assert op._owner is p, f"{op!r} on {key!r}'s list is not this purgatory's"
            if not op._state & FINISHED and not in_pass:
                assert op._bucket is not None, f"pending watched {op!r} is not timed"


def check_wheel(purgatory: DelayedOperationPurgatory[Any]) -> None:
    """Raise ``AssertionError`` if `purgatory`'s timing wheel is inconsistent.

    Checked: every timed entry sits, once, in the bucket it points to, inside that bucket's
    span, and is not yet due (overdue ones excepted); the size counter matches; every non-empty
    bucket is in the heap at its due tick, or is the cascade under way.

    Args:
        purgatory: The purgatory whose wheel to check.
    """
    _purgatory(purgatory, "check_wheel")._timer.wheel._check()


def check_watchers(purgatory: DelayedOperationPurgatory[Any]) -> None:
    """Raise ``AssertionError`` if `purgatory`'s watcher lists are inconsistent.

    Checked: no key has an empty list; each operation on a list watches that key and counts the
    lists that hold it; the entry count is right; every finished operation still on a list is
    queued for the purge, once, and what else the purge queue holds has left every list (and is
    not its last entry); each key's threshold watchers are in their run or their heap, once, and
    dead cells are counted.

    Args:
        purgatory: The purgatory whose watcher lists to check.
    """
    _purgatory(purgatory, "check_watchers")._lists._check()


def check_timing_wheel(wheel: TimingWheel) -> None:
    """`check_wheel` for a `TimingWheel` on its own, whatever its entries are."""
    wheel._check()


def check_threshold_watchers(watchers: ThresholdWatchers[Any]) -> None:
    """Raise ``AssertionError`` if one key's threshold watchers (on their own) are inconsistent."""
    watchers._check()


def _purgatory(obj: object, check: str) -> DelayedOperationPurgatory[Any]:
    """`obj` if it is a purgatory; a clear error if a test passed something else."""
    if not isinstance(obj, PURGATORY_TYPES):
        raise TypeError(f"{check}() takes a DelayedOperationPurgatory, got {obj!r}")
    return obj
