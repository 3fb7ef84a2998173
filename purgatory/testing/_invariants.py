"""`check_invariants`: what must hold inside a purgatory between any two calls."""

from __future__ import annotations

from typing import Any

from .._operation import DONE, EXPIRED, FINISHED
from .._purgatory import DelayedOperationPurgatory

__all__ = ("check_invariants",)


def check_invariants(purgatory: DelayedOperationPurgatory[Any]) -> None:
    """Raise ``AssertionError`` if `purgatory`'s wheel or watcher lists are inconsistent.

    Checked: every timed entry sits in the bucket it points to, inside that bucket's span, and is
    pending; the size counter matches; bucket heap entries agree with bucket expirations; no
    watcher list is empty; every pending watched operation is timed; every finished operation
    still on a watcher list is queued for the purge.
    """
    wheel = purgatory._wheel
    held = 0
    current = wheel.current_tick
    for level, slots in enumerate(wheel._levels):
        for bucket in slots:
            parts = [bucket] if bucket.older is None else [bucket.older, bucket]
            for part in parts:
                assert part.level == level
                assert part.wheel is wheel
                for op in part:
                    held += 1
                    assert op._bucket is part, f"{op!r} is in a bucket it does not point to"
                    assert not op._state & FINISHED, f"finished {op!r} is still timed"
                    span = wheel.span(level)
                    assert bucket.expiration <= op._deadline < bucket.expiration + span, (
                        f"{op!r} deadline {op._deadline} outside {bucket!r}"
                    )
                    assert op._deadline > current, f"{op!r} is due but still held"
            if bucket or bucket.older:
                assert bucket.expiration > current, f"{bucket!r} is due but not flushed"
                assert bucket is wheel.cascading or any(
                    entry[3] is bucket and entry[0] == wheel.due_tick(bucket)
                    for entry in wheel._heap
                ), f"{bucket!r} not in the heap"
    for op in wheel._overdue:
        held += 1
        assert op._bucket is wheel._overdue
        assert op._deadline <= current, f"overdue {op!r} is not due"
    assert held == len(wheel), f"size counter {len(wheel)} != {held} entries held"
    garbage = set(purgatory._garbage)
    for key, watching in purgatory._watchers.items():
        if type(watching) is dict:
            assert watching, f"empty watcher list for {key!r}"
            ops = list(watching)
        else:
            ops = [watching]
        for op in ops:
            if op._state & FINISHED:
                assert op in garbage, f"finished {op!r} on {key!r}'s list, but no purge will see it"
            assert op._purgatory is purgatory, f"{op!r} watched by another purgatory"
            assert op._keys is not None, f"{op!r} has no keys"
            assert key in op._keys, f"{op!r} not watching {key!r}"
            if not op._state & FINISHED:
                assert op._bucket is not None, f"pending watched {op!r} is not timed"
            assert not (op._state & EXPIRED and not op._state & DONE)
    for op in purgatory._garbage:
        assert op._state & FINISHED, f"{op!r} queued for the purge but not finished"
