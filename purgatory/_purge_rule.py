"""`PurgeRule`: *when* the watcher lists are purged (Kafka's rule), apart from what a purge does.

Kafka purges a purgatory's watcher lists once ``estimated - numDelayed > purgeInterval``, where
``estimated`` counts the operations registered since the last purge. `PurgeRule.owed` is that
difference, kept as it changes: a registered operation adds one as it leaves the timer (a timer
pass says how many it took) or finishes without entering it, so a watch pays nothing for it. The
purge itself (`WatcherLists.purge`) runs in timer passes, a slice of the pass's budget each.

`owed` is the one field code elsewhere writes, by the purge-queue protocol (`purgatory._watchers`):
whoever takes a settled operation out of the timer, or settles one that never entered it, adds
one and, once ``owed > interval``, asks `due` whether to request a timer pass. The purgatory's
settle does the addition inline, since it runs once per operation and cannot afford a call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

from ._impl import install, native

if TYPE_CHECKING:
    from ._watchers import WatcherLists

__all__ = ("PurgeRule",)


if TYPE_CHECKING or native is None:

    class _RuleCore:
        """A purge rule's fields (the native core gives them a C layout: `purgatory._impl`)."""

        __slots__ = (
            "_lists",
            "_purging",
            "_requested",
            "interval",
            "owed",
            "purges",
        )

else:
    _RuleCore = native.RuleCore


@final
class PurgeRule(_RuleCore):
    """Kafka's purge rule over one purgatory's watcher lists, and the purge's slices."""

    __slots__ = ()

    def __init__(self, lists: WatcherLists[Any], interval: int) -> None:
        self._lists = lists
        #: Kafka's ``purgeInterval``.
        self.interval = interval
        #: Kafka's ``estimated - numDelayed`` (see the module docstring).
        self.owed = 0
        #: Timer passes that purged (on the loop a purge runs in slices, one per pass).
        self.purges = 0
        # A purge is under way in slices, or a pass was asked for to start one.
        self._purging = False
        self._requested = False

    def due(self) -> bool:
        """Whether the rule says purge and no pass was asked for yet (``True`` once: the caller
        asks a timer pass for it)."""
        if self._requested or self.owed <= self.interval:
            return False
        self._requested = True
        return True

    def after_pass(self, taken: int, budget: int | None, in_flight: Callable[[], int]) -> bool:
        """After each timer pass (which took `taken` operations from the timer): a purge slice of
        `budget` entries if the rule says so (``None``: all); whether more is owed at once.

        `in_flight` counts the operations a pass under way took and has not expired yet: they
        finish after a purge that starts now, so the next one must see them.
        """
        self.owed += taken
        if self._purging or self.owed > self.interval:
            if not self._purging:
                self.start(in_flight())
                self._purging = True
            if self._lists.purge(budget):
                self.purges += 1
            self._purging = bool(self._lists.queue)
        return self._purging or self.owed > self.interval

    def start(self, in_flight: int) -> None:
        """Kafka's ``estimated = numDelayed`` as a purge starts (see `after_pass`)."""
        self.owed = in_flight
        self._purging = False
        self._requested = False


install(PurgeRule, "due")
