"""`check_invariants`: what must hold inside a purgatory between any two calls."""

from __future__ import annotations

from typing import Any

from .._operation import DONE, EXPIRED, FINISHED
from .._purgatory import DelayedOperationPurgatory
from .._watchers import ThresholdWatchers
from .._wheel import TimingWheel

__all__ = ("check_invariants", "check_threshold_watchers", "check_wheel")


def check_invariants(purgatory: DelayedOperationPurgatory[Any]) -> None:
    """Raise ``AssertionError`` if `purgatory`'s wheel or watcher lists are inconsistent.

    Checked: every timed entry sits in the bucket it points to, inside that bucket's span, and is
    pending; the size counter matches; bucket heap entries agree with bucket expirations; no
    watcher list is empty; every pending watched operation is timed; every finished operation
    still on a watcher list is queued for the purge, and the purge queue holds nothing that has
    left every list; each operation counts the lists that hold it; threshold watchers are in
    their heap, once, and the heap's dead cells are counted.
    """
    wheel = purgatory._wheel
    check_wheel(wheel)
    for op in wheel:
        assert not op._state & FINISHED, f"finished {op!r} is still timed"
    garbage = purgatory._garbage
    held: dict[int, int] = {}
    ops_by_id: dict[int, Any] = {}
    for key, watching in purgatory._watchers.items():
        if type(watching) is ThresholdWatchers:
            check_threshold_watchers(watching)
            ops = list(watching)
        elif type(watching) is dict:
            ops = list(watching)
        else:
            ops = [watching]
        assert ops, f"empty watcher list for {key!r}"
        for op in ops:
            held[id(op)] = held.get(id(op), 0) + 1
            ops_by_id[id(op)] = op
            if op._state & FINISHED:
                assert op in garbage, f"finished {op!r} on {key!r}'s list, but no purge will see it"
            assert op._purgatory is purgatory, f"{op!r} watched by another purgatory"
            assert op._keys is not None, f"{op!r} has no keys"
            assert key in op._keys, f"{op!r} not watching {key!r}"
            if not op._state & FINISHED:
                assert op._bucket is not None, f"pending watched {op!r} is not timed"
            assert not (op._state & EXPIRED and not op._state & DONE)
    for ident, count in held.items():
        op = ops_by_id[ident]
        if len(set(op._keys)) == len(op._keys):
            assert op._listed == count, f"{op!r} counts {op._listed} lists, is on {count}"
    for op in garbage:
        assert op._state & FINISHED, f"{op!r} queued for the purge but not finished"
        if len(set(op._keys)) == len(op._keys):  # a key given twice is forgotten by the purge
            assert id(op) in held, f"{op!r} has left every list but is still referenced"


def check_threshold_watchers(watchers: ThresholdWatchers[Any]) -> None:
    """Raise ``AssertionError`` if one key's threshold watchers are inconsistent."""
    heap = watchers.heap
    assert not set(watchers.plain) & set(watchers.cells), "an operation both plain and at a mark"
    live = [cell for cell in heap if cell[2] is not None]
    assert len(heap) - len(live) == watchers.dead, "dead cells miscounted"
    assert len(live) == len(watchers.cells), "threshold cells and heap disagree"
    for cell in live:
        assert watchers.cells[cell[2]] is cell, f"{cell[2]!r} points at another cell"
    for index in range(1, len(heap)):
        assert not heap[index] < heap[(index - 1) // 2], "threshold heap out of order"


def check_wheel(wheel: TimingWheel) -> None:
    """Raise ``AssertionError`` if `wheel` is inconsistent, whatever its entries are.

    Checked: every entry sits in the bucket (or older part) it points to, once, inside that
    bucket's span, and is not yet due (overdue ones excepted); the size counter matches; every
    non-empty bucket is in the heap at its due tick or is the cascade under way.
    """
    held = 0
    current = wheel.current_tick
    seen: set[int] = set()
    for level, slots in enumerate(wheel._levels):
        span = wheel.span(level)
        for bucket in slots:
            parts = [bucket] if bucket.older is None else [bucket.older, bucket]
            for part in parts:
                assert part.level == level
                assert part.wheel is wheel
                for entry in part:
                    held += 1
                    assert id(entry) not in seen, f"{entry!r} held twice"
                    seen.add(id(entry))
                    assert entry._bucket is part, f"{entry!r} is in a bucket it does not point to"
                    assert bucket.expiration <= entry._deadline < bucket.expiration + span, (
                        f"{entry!r} deadline {entry._deadline} outside {bucket!r}"
                    )
                    assert entry._deadline > current, f"{entry!r} is due but still held"
            if bucket or bucket.older:
                assert bucket.expiration > current, f"{bucket!r} is due but not flushed"
                assert bucket is wheel.cascading or any(
                    item[3] is bucket and item[0] == wheel.due_tick(bucket) for item in wheel._heap
                ), f"{bucket!r} not in the heap"
    for entry in wheel._overdue:
        held += 1
        assert entry._bucket is wheel._overdue
        assert entry._deadline <= current, f"overdue {entry!r} is not due"
    assert held == len(wheel), f"size counter {len(wheel)} != {held} entries held"
