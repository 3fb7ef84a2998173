"""`PurgeRule`: *when* the watcher lists are purged (Kafka's rule, and a bound in time), apart from
what a purge does.

Kafka purges a purgatory's watcher lists once ``estimated - numDelayed > purgeInterval``, where
``estimated`` counts the operations registered since the last purge. `PurgeRule.owed` is that
difference, kept as it changes: a registered operation adds one as it leaves the timer (a timer
pass says how many it took) or finishes without entering it, so a watch pays nothing for it. The
purge itself (`WatcherLists.purge`) runs in timer passes, a slice of the pass's budget each.

Kafka's rule counts completions, so a quiet server never reaches it: the finished operations
left on the lists (and all they reference: a request, a response) stay, and the gauges read as a
leak. So a second rule bounds the time: a purge runs at most `LINGER` seconds after the first
operation finished since the lists were last clean, whatever the traffic. It costs the hot path
nothing: the settle's one comparison, ``owed > trip``, is the same as Kafka's (`trip` is
`interval` while a purge is scheduled, and `owed` itself once the lists are clean, so that the
next settlement calls `due`, which schedules the purge and raises `trip` again). A timer pass
that expires operations schedules it too, off the hot path. On an idle loop this is one wake-up
a second after the last request, and none after. The bound is the reaper's (a purgatory on the
event loop's clock): a driven clock (a test's `ManualClock`, a trace replay) runs only Kafka's
rule, so that its passes are Kafka's and stay where a test or a replay expects them.

`owed` is the one field code elsewhere writes, by the purge-queue protocol (`purgatory._watchers`):
whoever takes a settled operation out of the timer, or settles one that never entered it, adds
one and, once ``owed > trip``, asks `due` whether to request a timer pass. The purgatory's
settle does the addition inline, since it runs once per operation and cannot afford a call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, final

from ._impl import native, twin

if TYPE_CHECKING:
    from ._events import EventSink
    from ._timer import SystemTimer
    from ._watchers import WatcherLists

__all__ = ("LINGER", "PurgeRule")

#: Seconds a finished operation may wait on the watcher lists before a purge takes it (rounded
#: up to the tick), whatever the traffic.
LINGER: Final = 1.0
#: A count no purgatory reaches (2**63 - 1, a C ``Py_ssize_t``'s largest).
_NEVER: Final = 2**63 - 1


class _RuleCore:
    """A purge rule's fields (the native class has them as a C layout: `purgatory._impl`)."""

    __slots__ = (
        "_armed",
        "_bounded",
        "_idle_at",
        "_lists",
        "_purging",
        "_requested",
        "_timer",
        "interval",
        "linger",
        "owed",
        "purges",
        "trip",
    )


@final
class PurgeRule(_RuleCore):
    """Kafka's purge rule over one purgatory's watcher lists, the time bound, and the slices."""

    __slots__ = ()

    def __init__(
        self, lists: WatcherLists[Any], interval: int, timer: SystemTimer[Any], bounded: bool
    ) -> None:
        self._lists = lists
        self._timer = timer
        #: Kafka's ``purgeInterval``: one beyond any count of operations (2**63) never trips,
        #: as `_NEVER` does not, which a C integer holds.
        self.interval = min(interval, _NEVER)
        #: `LINGER` in the timer's ticks (as many as a C integer holds, for a tiny tick).
        self.linger = min(max(1, math.ceil(LINGER / timer.tick)), _NEVER)
        #: Kafka's ``estimated - numDelayed`` (see the module docstring).
        self.owed = 0
        #: What a settle compares `owed` with before it calls `due`: `interval`, or `owed`
        #: itself while the lists are clean (armed: the next settlement schedules a purge).
        self.trip = 0 if bounded else self.interval
        #: Timer passes that purged (on the loop a purge runs in slices, one per pass).
        self.purges = 0
        # A purge is under way in slices, or a pass was asked for to start one.
        self._purging = False
        self._requested = False
        # The tick of the purge scheduled by the time bound; math.inf: none.
        self._idle_at: float = math.inf
        # The lists are clean: the next settlement schedules the time bound's purge (never,
        # for a driven clock: `bounded` is False).
        self._armed = bounded
        self._bounded = bounded

    def due(self) -> bool:
        """Whether the rule says purge and no pass was asked for yet (``True`` once: the caller
        asks a timer pass for it). The first settlement since the lists were clean schedules the
        time bound's purge instead (a pass `linger` ticks from now)."""
        if self._requested:  # (first: while a purge pass is asked for, every settle asks)
            return False
        if self.owed > self.interval:
            self._requested = True
            return True
        if self._armed:
            self._armed = False
            self.trip = self.interval
            timer = self._timer
            self._schedule(timer.ticks(timer.now()))
        return False

    def after_pass(
        self,
        taken: int,
        budget: int | None,
        in_flight: Callable[[], int],
        sink: EventSink | None,
    ) -> bool:
        """After each timer pass (which took `taken` operations from the timer): a purge slice of
        `budget` entries if a rule says so (``None``: all); whether more is owed at once.

        `in_flight` counts the operations a pass under way took and has not expired yet: they
        finish after a purge that starts now, so the next one must see them. The purgatory's
        event `sink` holds finished operations too: its batch is taken once full, after every
        pass if it says so, and at the time bound's pass (which it schedules if need be).
        """
        self.owed += taken
        tick = self._timer.wheel.current_tick
        idle = tick >= self._idle_at
        holding = sink is not None and bool(sink.ends)
        if holding and (len(sink.ends) >= sink.limit or sink.each_pass or idle):  # type: ignore[union-attr]
            sink.take()  # type: ignore[union-attr]
            holding = False
        if idle:
            self._idle_at = math.inf
        if self._purging or self.owed > self.interval or (idle and self._lists.queue):
            if not self._purging:
                self.start(in_flight())
                self._purging = True
            if self._lists.purge(budget):
                self.purges += 1
            self._purging = bool(self._lists.queue)
        if self._bounded and not self._purging and self._idle_at == math.inf:
            if self._lists.queue or holding:  # an expiry's, or a batch: within the bound too
                self._schedule(tick)
            elif not self._armed:  # clean: the next settlement schedules
                self._armed = True
                self.trip = min(self.owed, self.interval)
        return self._purging or self.owed > self.interval

    def hold(self) -> None:
        """A finished operation is kept outside the lists (an event-log batch): a pass of the
        time bound takes it, scheduled unless one is."""
        if self._armed:
            timer = self._timer
            self._schedule(timer.ticks(timer.now()))

    def start(self, in_flight: int) -> None:
        """Kafka's ``estimated = numDelayed`` as a purge starts (see `after_pass`)."""
        self.owed = in_flight
        self._purging = False
        self._requested = False
        if self._armed:
            self.trip = min(self.owed, self.interval)

    def _schedule(self, tick: int) -> None:
        """The time bound's purge, `linger` ticks after `tick`."""
        self._idle_at = at = tick + self.linger
        self._timer.request_pass_at(at)
        self._armed = False
        self.trip = self.interval


_PyPurgeRule = PurgeRule
"""The reference, whole in every process; `PurgeRule` is the native class where the core is
built (its `due` a C body), this one otherwise."""

if not TYPE_CHECKING and native is not None:
    PurgeRule = twin(_PyPurgeRule, native.RuleCore, hot=("due",))
