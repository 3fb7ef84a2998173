"""`PurgatoryStatistics`: the snapshot `DelayedOperationPurgatory.statistics` returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

if TYPE_CHECKING:
    from ._purge_rule import PurgeRule
    from ._timer import SystemTimer
    from ._watchers import WatcherLists

__all__ = ("PurgatoryStatistics", "read_statistics")


@final
@dataclass(frozen=True, slots=True)
class PurgatoryStatistics:
    """A snapshot of a purgatory's gauges and counters (counters count since creation).

    Two gauges answer two questions. `delayed` is how many operations are parked now (Kafka's
    ``NumDelayedOperations``): the one to graph and alert on. `watched` is how many entries the
    watcher lists hold (Kafka's ``PurgatorySize``): an operation on 3 keys counts 3, and an
    operation that finished stays counted until a trigger of its key or a purge drops it, so it
    is higher than `delayed` and may stay above zero with nothing parked; it measures memory.
    """

    watched: int
    """Entries over all watcher lists, completed ones not yet purged included."""
    delayed: int
    """Operations in the timer: parked now."""
    keys: int
    """Keys with a watcher list."""
    completed: int
    """Operations completed by their condition or `force_complete` (expiries not included)."""
    expired: int
    """Operations completed by their deadline (`drain`'s not included: see `drained`)."""
    drained: int
    """Operations answered by `drain` before their deadline, as at it (``is_expired`` is set and
    ``on_expiration`` ran): a shutdown's answers, apart from the expiries a dashboard alerts on.
    """
    cancelled: int
    """Operations cancelled (`cancel_for_key`, `shutdown`, a cancelled `watch`)."""
    purged: int
    """Watcher-list entries removed by purges."""
    timer_passes: int
    """Timer passes run: reaper wake-ups on the loop, passes a driven clock ran."""
    purges: int
    """Timer passes that removed entries from the watcher lists (on the loop a purge runs in
    slices, one per pass; `purge` calls are not counted)."""
    next_deadline_in: float
    """Seconds until the timer next has work (``math.inf`` when nothing is timed)."""


def read_statistics(
    timer: SystemTimer[Any],
    lists: WatcherLists[Any],
    rule: PurgeRule,
    completed: int,
    cancelled: int,
) -> PurgatoryStatistics:
    """A purgatory's statistics, read from its parts (only read: see `PurgatoryStatistics`)."""
    return PurgatoryStatistics(
        watched=lists.entries,
        delayed=timer.delayed,
        keys=len(lists),
        completed=completed,
        expired=timer.expired,
        drained=timer.drained,
        cancelled=cancelled,
        purged=lists.purged,
        timer_passes=timer.passes,
        purges=rule.purges,
        next_deadline_in=timer.next_deadline_in(),
    )
