"""`check_invariants`: what must hold inside a purgatory between any two calls."""

from __future__ import annotations

from typing import Any

from .._operation import DONE, EXPIRED, FINISHED
from .._purgatory import DelayedOperationPurgatory
from .._wheel import TimingWheel

__all__ = ("check_invariants", "check_wheel")


def check_invariants(purgatory: DelayedOperationPurgatory[Any]) -> None:
    """Raise ``AssertionError`` if `purgatory`'s wheel or watcher lists are inconsistent.

    Checked: every timed entry sits in the bucket it points to, inside that bucket's span, and is
    pending; the size counter matches; bucket heap entries agree with bucket expirations; no
    watcher list is empty; every pending watched operation is timed; every finished operation
    still on a watcher list is queued for the purge.
    """
    wheel = purgatory._wheel
    check_wheel(wheel)
    for op in wheel:
        assert not op._state & FINISHED, f"finished {op!r} is still timed"
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
