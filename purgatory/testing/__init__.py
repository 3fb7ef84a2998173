"""Tools for testing code that uses a purgatory, and for replaying traces in virtual time.

`ManualClock` drives every purgatory attached to it deterministically (Kafka's ``MockTimer``);
`check_invariants` asserts the internal consistency of a purgatory after any step, and
`check_wheel` and `check_watchers` that of one of its parts: the timing wheel, the watcher
lists.
"""

from __future__ import annotations

from ._clock import ManualClock as ManualClock
from ._invariants import check_invariants as check_invariants
from ._invariants import check_watchers as check_watchers
from ._invariants import check_wheel as check_wheel

__all__ = ("ManualClock", "check_invariants", "check_watchers", "check_wheel")

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
