"""`ManualClock`: virtual time that moves only when told to."""

from __future__ import annotations

import math
import weakref
from typing import final

from .._clock import Expirable

__all__ = ("ManualClock",)

# Timer passes `advance_to` runs at one moment before it calls the work due there a runaway.
_MAX_PASSES_AT_ONCE = 1000


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

    def advance_to(self, when: float) -> int:
        """Move time to `when`, with a timer pass at each tick where a purgatory has work.

        Where `advance` runs one timer pass at the end, this one visits, in time order, every
        moment between now and `when` at which an attached purgatory has something due (an
        expiry, a cascade, a purge) and runs that purgatory's pass there, as a reaper would wake
        up: each operation expires at its own deadline tick, with ``now()`` reading that time,
        and nothing runs at the ticks in between. The clock ends at `when`. This is how a trace
        replay moves time: from one request to the next without a pass per request.

        Returns:
            How many operations expired.

        Raises:
            ValueError: `when` is earlier than `now()`, NaN or infinite.
            TypeError: `when` is not a number.
            RuntimeError: A purgatory keeps having work at the same moment (a callback that
                watches an operation with a timeout of 0 whenever one expires, say).
        """
        if isinstance(when, bool) or not isinstance(when, int | float):
            raise TypeError(f"when must be a number of seconds, got {when!r}")
        if not (when >= self._now and math.isfinite(when)):
            raise ValueError(
                f"when must be a finite time >= now() = {self._now!r} (time never goes "
                f"backwards), got {when!r}"
            )
        expired = 0
        repeats = 0
        # The attached purgatories, listed again only when one is attached during a pass (a
        # replay calls this at every event: no list is built per timer pass).
        purgatories = self._alive()
        attached = len(self._purgatories)
        while True:
            if len(self._purgatories) != attached:
                purgatories = self._alive()
                attached = len(self._purgatories)
            if len(purgatories) == 1:
                due_at = purgatories[0]._next_timer_pass_at()
            else:
                due_at = min((p._next_timer_pass_at() for p in purgatories), default=math.inf)
            if due_at > when:
                break
            if due_at <= self._now:
                repeats += 1
                if repeats > _MAX_PASSES_AT_ONCE:
                    raise RuntimeError(
                        f"the timer keeps having work at {self._now!r} after "
                        f"{_MAX_PASSES_AT_ONCE} passes: a callback that keeps adding work due "
                        "at once?"
                    )
            else:
                repeats = 0
                self._now = due_at
            now = self._now
            for purgatory in purgatories:
                if purgatory._next_timer_pass_at() <= now:
                    expired += purgatory._run_timer_pass(now)
        self._now = float(when)
        return expired

    def _alive(self) -> list[Expirable]:
        """The attached purgatories still alive, in attach order (forgetting the others)."""
        alive = []
        refs = []
        for ref in self._purgatories:
            purgatory = ref()
            if purgatory is not None:
                alive.append(purgatory)
                refs.append(ref)
        self._purgatories[:] = refs
        return alive

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
        now = self._now = self._now + seconds
        expired = 0
        dead = False
        for ref in self._purgatories:  # (a replay calls this at every event: no list built)
            purgatory = ref()
            if purgatory is None:
                dead = True
            else:
                expired += purgatory._run_timer_pass(now)
        if dead:
            self._alive()
        return expired
