"""The clock protocol: the one place time enters the purgatory.

The core never reads a clock itself; the driver passes the time in. A purgatory is given either
nothing (the running event loop's clock, driven by a reaper coroutine) or a `DrivenClock` such as
`purgatory.testing.ManualClock`, which calls back into every purgatory attached to it when its
time moves.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ("Alarm", "Clock", "DrivenClock", "Expirable")


@runtime_checkable
class Clock(Protocol):
    """A monotonic source of time in seconds."""

    def current_time(self) -> float:
        """Return the current time in seconds; never smaller than an earlier answer."""
        ...


class Expirable(Protocol):
    """What a driven clock calls back: a purgatory's timer pass, and when it next has work."""

    #: The length of the purgatory's tick in seconds (an `Alarm`'s unit).
    _tick: float

    def _run_timer_pass(self, now: float) -> int: ...

    def _next_timer_pass(self) -> float:
        """The tick at which a timer pass next has work; ``math.inf`` if none."""
        ...

    def _next_timer_pass_at(self) -> float:
        """Seconds of the clock at which a timer pass next has work; ``math.inf`` if none."""
        ...


class Alarm(Protocol):
    """Who runs a purgatory's timer passes, told when one falls due earlier than it planned.

    The purgatory calls `wake_by` only when a new deadline or a purge owed comes before
    `wake_tick`, so the common watch costs one comparison. The reaper is one (it moves its loop
    timer); a driven clock may give one per purgatory from ``attach`` and then move time at the
    cost of one comparison while nothing is due, instead of asking every purgatory at every
    move.
    """

    #: The tick (in the purgatory's ticks) of the next pass planned; nothing is due before it.
    #: ``-math.inf``: nothing needs to wake it (a pass is under way, or the driven clock has not
    #: learned yet and will ask at its next move); ``math.inf``: no pass planned.
    wake_tick: float

    @property
    def alive(self) -> bool:
        """Whether a pass will run at `wake_tick` (a reaper whose task ended comes back only for
        an operation falling due, not for a purge)."""
        ...

    def wake_by(self, tick: float) -> None:
        """Make sure a timer pass runs at `tick` or earlier."""
        ...


@runtime_checkable
class DrivenClock(Clock, Protocol):
    """A clock that moves only when told to, and then runs the timer pass of its purgatories.

    A purgatory given such a clock starts no reaper: expirations happen inside the clock's own
    ``advance``, synchronously, which is what makes tests and trace replays deterministic.
    """

    def attach(self, purgatory: Expirable) -> Alarm | None:
        """Run ``purgatory._run_timer_pass(now)`` whenever this clock moves (or is told to tick).

        Returns:
            An `Alarm` the purgatory calls when a pass falls due earlier than it last said, or
            ``None``: the clock asks ``_next_timer_pass`` itself whenever it needs to know.
        """
        ...
