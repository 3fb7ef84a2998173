"""Tools for testing code that uses a purgatory, and for replaying traces in virtual time.

`ManualClock` drives every purgatory attached to it deterministically (Kafka's ``MockTimer``);
`check_invariants` asserts the internal consistency of a purgatory after any step.
"""

from __future__ import annotations

from ._clock import ManualClock as ManualClock
from ._invariants import check_invariants as check_invariants

__all__ = ("ManualClock", "check_invariants")

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
