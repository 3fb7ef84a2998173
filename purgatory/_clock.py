"""The clock protocol: the one place time enters the purgatory.

The core never reads a clock itself; the driver passes the time in. A purgatory is given either
nothing (the running event loop's clock, driven by a reaper coroutine) or a `DrivenClock` such as
`purgatory.testing.ManualClock`, which calls back into every purgatory attached to it when its
time moves.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ("Clock", "DrivenClock", "Expirable")


@runtime_checkable
class Clock(Protocol):
    """A monotonic source of time in seconds."""

    def current_time(self) -> float:
        """Return the current time in seconds; never smaller than an earlier answer."""
        ...


class Expirable(Protocol):
    """What a driven clock calls back: a purgatory's timer pass, and when it next has work."""

    def _run_timer_pass(self, now: float) -> int: ...

    def _next_timer_pass_at(self) -> float:
        """Seconds of the clock at which a timer pass next has work; ``math.inf`` if none."""
        ...


@runtime_checkable
class DrivenClock(Clock, Protocol):
    """A clock that moves only when told to, and then runs the timer pass of its purgatories.

    A purgatory given such a clock starts no reaper: expirations happen inside the clock's own
    ``advance``, synchronously, which is what makes tests and trace replays deterministic.
    """

    def attach(self, purgatory: Expirable) -> None:
        """Run ``purgatory._run_timer_pass(now)`` whenever this clock moves (or is told to tick)."""
        ...
