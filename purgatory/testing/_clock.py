"""`ManualClock`: virtual time that moves only when told to."""

from __future__ import annotations

import math
import weakref
from typing import final

from .._clock import Expirable

__all__ = ("ManualClock",)


@final
class ManualClock:
    """A clock that moves only in `advance`, which runs the expirations that became due.

    Give it to any number of purgatories (``clock=``); they start no reaper and need no event
    loop. Each `advance` expires, synchronously and in deadline order, everything now due in
    every attached purgatory, then runs their purge check. Time never goes backwards.

    Args:
        start: The initial time in seconds (finite).
    """

    __slots__ = ("_now", "_purgatories")

    def __init__(self, start: float = 0.0) -> None:
        if isinstance(start, bool) or not isinstance(start, int | float):
            raise TypeError(f"start must be a number of seconds, got {start!r}")
        if not math.isfinite(start):
            raise ValueError(f"start must be a finite number of seconds, got {start!r}")
        self._now = float(start)
        self._purgatories: list[weakref.ref[Expirable]] = []

    def __repr__(self) -> str:
        return f"ManualClock(now={self._now!r})"

    def now(self) -> float:
        """The current virtual time in seconds."""
        return self._now

    def current_time(self) -> float:
        """The current virtual time in seconds (the `Clock` protocol)."""
        return self._now

    def attach(self, purgatory: Expirable) -> None:
        """Let `advance` run `purgatory`'s timer passes; held weakly, in attach order."""
        self._purgatories.append(weakref.ref(purgatory))

    def advance(self, seconds: float = 0.0) -> int:
        """Move time forward by `seconds` and expire what became due; return how many expired.

        ``advance(0)`` runs due expirations and the purge check without moving time.

        Raises:
            ValueError: `seconds` is negative or NaN (or infinite).
            TypeError: `seconds` is not a number.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"seconds must be a number, got {seconds!r}")
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(
                f"seconds must be a finite number >= 0 (time never goes backwards), got {seconds!r}"
            )
        self._now += seconds
        expired = 0
        alive = []
        for ref in self._purgatories:
            purgatory = ref()
            if purgatory is not None:
                alive.append(ref)
                expired += purgatory._run_timer_pass(self._now)
        self._purgatories[:] = alive
        return expired
