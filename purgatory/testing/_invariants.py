"""Invariant checks: what must hold inside a purgatory between any two calls.

Each owner of state checks its own (``_check``, as sortedcontainers' lists do): the timing
wheel its buckets, the watcher lists their keys, counts and purge queue, one key's threshold
watchers their cells, and the purgatory what ties them together. These functions are the
public way to call them from tests.
"""

from __future__ import annotations

from typing import Any

from .._purgatory import DelayedOperationPurgatory
from .._thresholds import ThresholdWatchers
from .._wheel import TimingWheel

__all__ = ("check_invariants", "check_threshold_watchers", "check_wheel")


def check_invariants(purgatory: DelayedOperationPurgatory[Any]) -> None:
    """Raise ``AssertionError`` if `purgatory`'s wheel, watcher lists or their ties disagree.

    Checked: every timed entry sits in the bucket it points to, inside that bucket's span, and is
    pending; the size counter matches; bucket heap entries agree with bucket expirations; no
    watcher list is empty; the entry count is right; every pending watched operation is timed;
    every finished operation still on a watcher list is queued for the purge, and the purge queue
    holds nothing that has left every list; each operation counts the lists that hold it;
    threshold watchers are in their run or heap, once, and dead cells are counted.
    """
    purgatory._check()


def check_threshold_watchers(watchers: ThresholdWatchers[Any]) -> None:
    """Raise ``AssertionError`` if one key's threshold watchers are inconsistent."""
    watchers._check()


def check_wheel(wheel: TimingWheel) -> None:
    """Raise ``AssertionError`` if `wheel` is inconsistent, whatever its entries are."""
    wheel._check()
