"""The clock protocol: the one place time enters the purgatory.

The core never reads a clock itself; the driver passes the time in. A purgatory is given either
nothing (the running event loop's clock, driven by a reaper coroutine) or a `DrivenClock` such as
`purgatory.testing.ManualClock`, which runs the passes of every purgatory's `Timer` attached to it
when its time moves.

The driver protocol, public methods only (as trio's ``Clock``): a driver is handed a purgatory's
`Timer` (``attach``), runs its passes (`Timer.run_pass`) no later than `Timer.next_pass_at` says,
and may give back an `Alarm` through which the timer says when a pass falls due earlier than the
driver last learned. The reaper on the event loop is such a driver, and so is a user's own.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ("Alarm", "Clock", "DrivenClock", "Timer")


@runtime_checkable
class Clock(Protocol):
    """A monotonic source of time in seconds."""

    def current_time(self) -> float:
        """Return the current time in seconds; never smaller than an earlier answer."""
        ...


class Timer(Protocol):
    """A purgatory's timer as its driver sees it (Kafka's ``Timer``: ``advanceClock``).

    A *pass* expires every operation whose deadline has come (in deadline order, ``on_complete``
    and ``on_expiration`` included), then does the purgatory's housekeeping (the purge of its
    watcher lists, when Kafka's rule says so). A driver runs a pass no later than
    `next_pass_at`, and at any other time it likes: a pass with nothing due costs little.
    """

    @property
    def tick(self) -> float:
        """The length of the timer's tick in seconds (an `Alarm`'s unit)."""
        ...

    @property
    def time_limit(self) -> float:
        """The latest clock time (seconds) the timer can count to: a driven clock refuses to
        move past it. Beyond it, float seconds no longer resolve a thousandth of a tick
        (2**33 s for 1 ms ticks), and short timeouts would round away."""
        ...

    def run_pass(self, now: float, budget: int | None = None) -> int:
        """Run a pass at the clock time `now`; return how many operations expired.

        Args:
            now: The clock's time in seconds, never earlier than the last pass's.
            budget: The entries one pass cascades down the wheel and purges at most (the rest
                wait for the next passes, which `next_pass_at` then says are due at once): a
                driver on an event loop passes one so that a burst never stalls the loop;
                ``None`` does all of it.

        Raises:
            ValueError: `now` is NaN or infinite, or `budget` is negative.
            TypeError: `now` is not a number, or `budget` is neither an int nor ``None``.

        A refused call changes nothing and does not count as a pass.
        """
        ...

    def next_pass_at(self) -> float:
        """The clock time (seconds) at which a pass next has work; ``math.inf`` if none: the
        due tick's time (a pass may find that work a hair earlier: `time_of`)."""
        ...

    def next_pass_tick(self) -> float:
        """`next_pass_at` in ticks (the unit of `Alarm.wake_tick`); ``math.inf`` if none."""
        ...

    def time_of(self, tick: float) -> float:
        """The earliest clock time (seconds) at which a pass reaches `tick`: ``tick * self.tick``
        give or take the float rounding the timer tolerates, which a driver comparing times
        with an `Alarm.wake_tick` must not guess.

        Args:
            tick: A tick of the timer (an `Alarm.wake_tick`); ``+-math.inf`` is returned as is.
        """
        ...


class Alarm(Protocol):
    """Who runs a timer's passes, told when one falls due earlier than it planned.

    The timer calls `wake_by` only when a new deadline or housekeeping owed comes before
    `wake_tick`, so the common watch costs one comparison. The reaper is one (it moves its loop
    timer); a driven clock may give one per timer from ``attach`` and then move time at the cost
    of one comparison while nothing is due, instead of asking every timer at every move. The
    driver writes `wake_tick` (from `Timer.next_pass_tick` as it plans); the timer only reads it.
    """

    #: The tick (in the timer's ticks) of the next pass planned; nothing is due before it.
    #: ``-math.inf``: nothing needs to wake it (a pass is under way, or the driven clock has not
    #: learned yet and will ask at its next move); ``math.inf``: no pass planned.
    wake_tick: float

    @property
    def alive(self) -> bool:
        """Whether a pass will run at `wake_tick` (a reaper whose task ended comes back only for
        an operation falling due, not for a purge)."""
        ...

    def wake_by(self, tick: float) -> None:
        """Make sure a timer pass runs at `tick` or earlier.

        Args:
            tick: The tick (of the timer's, as `wake_tick`) by which a pass must run.
        """
        ...


@runtime_checkable
class DrivenClock(Clock, Protocol):
    """A clock that moves only when told to, and then runs the timer pass of its purgatories.

    A purgatory given such a clock starts no reaper: expirations happen inside the clock's own
    ``advance``, synchronously, which is what makes tests and trace replays deterministic.
    """

    def attach(self, timer: Timer) -> Alarm | None:
        """Drive `timer` from now on: run ``timer.run_pass(now)`` as this clock moves, no later
        than ``timer.next_pass_at()``. A purgatory calls this once, as it is created.

        Args:
            timer: The purgatory's timer (hold it weakly: the purgatory may be dropped).

        Returns:
            An `Alarm` the timer calls when a pass falls due earlier than the clock last learned,
            or ``None``: the clock asks `Timer.next_pass_at` itself whenever it needs to know.

        Raises:
            ValueError: The clock's time is beyond ``timer.time_limit``.
        """
        ...
