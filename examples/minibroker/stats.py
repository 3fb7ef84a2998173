"""The leader's figures: counters, the purgatories' gauges and their peaks (Kafka's metrics).

Each part of the leader counts into one `BrokerStats`; the purgatories are registered once, and
their gauges (``watched()``, ``num_delayed()``) are sampled for peaks on every request read and
reported by `snapshot` (the ``stats`` admin command, the demo's progress line and summary).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from purgatory import DelayedOperationPurgatory

__all__ = ("BrokerStats",)


class BrokerStats:
    """Counters by name, and the gauges and peaks of every registered purgatory."""

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.peaks: dict[str, int] = {}
        self._purgatories: list[DelayedOperationPurgatory[Any]] = []

    def register(self, *purgatories: DelayedOperationPurgatory[Any]) -> None:
        """Report these purgatories' gauges (in this order)."""
        self._purgatories.extend(purgatories)

    @property
    def purgatories(self) -> tuple[DelayedOperationPurgatory[Any], ...]:
        """The purgatories registered, in order (what ``/metrics`` exports)."""
        return tuple(self._purgatories)

    def sample_peaks(self) -> None:
        """Remember the highest ``watched()`` and ``num_delayed()`` seen per purgatory."""
        peaks = self.peaks
        for purgatory in self._purgatories:
            for gauge, value in (
                ("watched", purgatory.watched()),
                ("delayed", purgatory.num_delayed()),
            ):
                name = f"{purgatory.name}.{gauge}"
                if value > peaks.get(name, 0):
                    peaks[name] = value

    def purgatory_gauges(self, *, purge: bool) -> dict[str, dict[str, int]]:
        """Per purgatory: ``watched``, ``delayed``, ``completed``, ``expired``, ``cancelled``.

        With `purge`, finished entries are purged first (``purge()``), so that ``watched()``
        counts only what really still waits, not what Kafka's lazy purge has yet to remove.
        """
        self.sample_peaks()
        gauges: dict[str, dict[str, int]] = {}
        for purgatory in self._purgatories:
            if purge:
                purgatory.purge()
            stats = purgatory.statistics()
            gauges[purgatory.name] = {
                "watched": purgatory.watched(),
                "delayed": purgatory.num_delayed(),
                "completed": stats.completed,
                "expired": stats.expired,
                "cancelled": stats.cancelled,
            }
        return gauges
