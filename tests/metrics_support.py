"""A scene for the metrics exporters' tests: two purgatories on a `ManualClock`, one busy.

``produce`` ends with one operation parked on two keys, one completed, one expired and one
cancelled, with nothing purged; ``fetch`` has never been used. The figures the exporters must
show are then exactly what `statistics()` says, read directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers import FlagOperation

from purgatory import DelayedOperationPurgatory
from purgatory.testing import ManualClock

Purgatory = DelayedOperationPurgatory[FlagOperation]


@dataclass
class Scene:
    clock: ManualClock
    produce: Purgatory
    fetch: Purgatory
    parked: FlagOperation


def scene() -> Scene:
    clock = ManualClock()
    produce = Purgatory("produce", clock=clock)
    fetch = Purgatory("fetch", clock=clock)
    parked = FlagOperation(10)
    produce.try_complete_else_watch(parked, ["a", "b"])  # one operation, two entries
    done = FlagOperation(10)
    produce.try_complete_else_watch(done, ["a"])
    done.ready = True
    assert produce.check_and_complete("a") == 1
    expiring = FlagOperation(1)
    produce.try_complete_else_watch(expiring, ["c"])  # its entry stays until a purge
    cancelled = FlagOperation(10)
    produce.try_complete_else_watch(cancelled, ["d"])
    assert produce.cancel_for_key("d") == [cancelled]
    clock.advance(1)
    assert expiring.is_expired
    stats = produce.statistics()
    assert (stats.delayed, stats.completed, stats.expired, stats.cancelled) == (1, 1, 1, 1)
    assert stats.watched > stats.delayed  # what the docs explain
    return Scene(clock, produce, fetch, parked)
