"""`ManualClock`: virtual time that moves only when told to."""

from __future__ import annotations

import math
import weakref
from typing import Final, final

from .._clock import Alarm, Timer

__all__ = ("ManualClock",)

# Timer passes `advance_to` runs at one moment before it calls the work due there a runaway.
_MAX_PASSES_AT_ONCE = 1000


@final
class ManualClock:
    """A clock that moves only in `advance`, which runs the expirations that became due.

    Give it to any number of purgatories (``clock=``); they start no reaper and need no event
    loop. Each `advance` expires, synchronously and in deadline order, everything now due in
    every attached purgatory, then runs their purge check. Time never goes backwards, not even
    when a callback moves the clock during a move.

    The clock is a driver of the public `purgatory.Timer` protocol: each purgatory hands it its
    timer as it is created, and gets back an alarm through which it says when work falls due
    earlier than the clock last learned.

    Args:
        start: The initial time in seconds (finite).
    """

    __slots__ = ("_alarms", "_limit", "_now", "_wake_at")

    def __init__(self, start: float = 0.0) -> None:
        if isinstance(start, bool) or not isinstance(start, int | float):
            raise TypeError(f"start must be a number of seconds, got {start!r}")
        if not math.isfinite(start):
            raise ValueError(f"start must be a finite number of seconds, got {start!r}")
        self._now = float(start)
        # One alarm per attached timer, in attach order.
        self._alarms: list[_Alarm] = []
        # The latest time every attached timer counts to (seconds).
        self._limit = math.inf
        # Seconds before which no attached purgatory has work: `advance_to` a time earlier than
        # this only moves the clock. Never later than the truth (nor than `_limit`): lowered by
        # the alarms as work falls due earlier, set exactly after every pass, -inf while unknown.
        self._wake_at = -math.inf

    def __repr__(self) -> str:
        return f"ManualClock(now={self._now!r})"

    def now(self) -> float:
        """The current virtual time in seconds."""
        return self._now

    def current_time(self) -> float:
        """The current virtual time in seconds (the `Clock` protocol)."""
        return self._now

    def attach(self, timer: Timer) -> Alarm:
        """Let `advance` run `timer`'s passes; held weakly, in attach order.

        Args:
            timer: A purgatory's timer (the purgatory calls this as it is created).

        Returns:
            The alarm through which `timer` says when work falls due earlier than the clock
            last learned (the `purgatory.DrivenClock` protocol).

        Raises:
            ValueError: The clock's time is past what `timer` counts to (its ``time_limit``).
        """
        if self._now > timer.time_limit:
            raise ValueError(
                f"the clock is at {self._now!r} s, past what a timer with a tick of "
                f"{timer.tick!r} s counts to ({timer.time_limit:.3g} s)"
            )
        alarm = _Alarm(self, timer)
        self._alarms.append(alarm)
        self._limit = min(self._limit, timer.time_limit)
        self._wake_at = -math.inf
        return alarm

    def advance_to(self, when: float) -> int:
        """Move time to `when`, with a timer pass at each tick where a purgatory has work.

        Where `advance` runs one timer pass at the end, this one visits, in time order, every
        moment between now and `when` at which an attached purgatory has something due (an
        expiry, a cascade, a purge) and runs that purgatory's pass there, as a reaper would wake
        up: each operation expires at its own deadline tick, with ``now()`` reading that time,
        and nothing runs at the ticks in between. The clock ends at `when`. This is how a trace
        replay moves time: from one request to the next without a pass per request, and, while
        nothing is due before `when`, at the cost of one comparison.

        Args:
            when: The time to move to, in seconds: at least `now()`, finite, and within what
                every attached timer counts to (``Timer.time_limit``).

        Returns:
            How many operations expired.

        If a callback moves the clock further during the move (``advance`` from an expiry, say),
        the clock stays where the callback left it: time never goes back.

        Raises:
            ValueError: `when` is earlier than `now()`, NaN, infinite, or past what an attached
                timer counts to.
            TypeError: `when` is not a number.
            RuntimeError: A purgatory keeps having work at the same moment (a callback that
                watches an operation with a timeout of 0 whenever one expires, say).
        """
        if type(when) is float and self._now <= when < self._wake_at:
            self._now = when  # nothing is due before `when`
            return 0
        if isinstance(when, bool) or not isinstance(when, int | float):
            raise TypeError(f"when must be a number of seconds, got {when!r}")
        if not (when >= self._now and math.isfinite(when)):
            raise ValueError(
                f"when must be a finite time >= now() = {self._now!r} (time never goes "
                f"backwards), got {when!r}"
            )
        self._check_limit(when)
        self._wake_at = -math.inf  # unknown until the passes below have run without error
        expired = 0
        repeats = 0
        # The live alarms, listed again only when a purgatory is attached during a pass.
        alarms = self._live()
        attached = len(self._alarms)
        while True:
            if len(self._alarms) != attached:
                alarms = self._live()
                attached = len(self._alarms)
            due_at = self._learn(alarms)
            if due_at > when:
                break
            # Where the pass runs: at the due tick's own time (``tick * tick``, unless the
            # timer's rounding reaches the tick only a float later), or at `when` if earlier.
            stop = min(self._stop(alarms), when)
            if stop <= self._now:
                repeats += 1
                if repeats > _MAX_PASSES_AT_ONCE:
                    raise RuntimeError(
                        f"the timer keeps having work at {self._now!r} after "
                        f"{_MAX_PASSES_AT_ONCE} passes: a callback that keeps adding work due "
                        "at once?"
                    )
            else:
                repeats = 0
                self._now = stop
            now = self._now
            for alarm, timer in alarms:
                if alarm.wake_at <= now:
                    expired += timer.run_pass(now)
        if self._now < when:  # (a callback may have moved the clock past `when`)
            self._now = float(when)
        self._wake_at = min(due_at, self._limit)  # (past the limit: refused by the slow path)
        return expired

    def _wake_by(self, at: float) -> None:
        """An alarm's call: a purgatory has work at `at` seconds (or earlier than it said)."""
        self._wake_at = min(self._wake_at, at)

    def _live(self) -> list[tuple[_Alarm, Timer]]:
        """The alarms of the timers still alive, with them (forgetting the others)."""
        live = []
        for alarm in self._alarms:
            timer = alarm.timer()
            if timer is not None:
                live.append((alarm, timer))
        self._alarms[:] = [alarm for alarm, _ in live]
        self._limit = min((timer.time_limit for _, timer in live), default=math.inf)
        return live

    def _learn(self, alarms: list[tuple[_Alarm, Timer]]) -> float:
        """Ask each timer when it next has work; set its alarm; return the earliest (s).

        Times come from the timer (`Timer.time_of`), never from a tick times the tick: the
        float product may lie after the earliest time at which the timer's own rounding reaches
        it, and a move to a time between the two would miss the work due there.
        """
        earliest = math.inf
        for alarm, timer in alarms:
            tick = timer.next_pass_tick()
            if tick != alarm.wake_tick:  # (`wake_at` goes with `wake_tick`, always)
                alarm.wake_tick = tick
                alarm.wake_at = timer.time_of(tick)
            earliest = min(earliest, alarm.wake_at)
        return earliest

    @staticmethod
    def _stop(alarms: list[tuple[_Alarm, Timer]]) -> float:
        """The earliest time a pass is due, read as a reader expects it: a due tick's time in
        seconds (``tick * tick``), or the earliest time that reaches it when that is later."""
        stop = math.inf
        for alarm, _ in alarms:  # (a loop: a generator costs more for the usual one alarm)
            at = alarm.wake_tick * alarm.tick
            at = max(at, alarm.wake_at)
            stop = min(stop, at)
        return stop

    def _check_limit(self, when: float) -> None:
        if when > self._limit:
            raise ValueError(
                f"the clock cannot move to {when!r} s: an attached purgatory's timer counts to "
                f"{self._limit:.3g} s (beyond it float seconds cannot resolve a thousandth of "
                "its tick, and short timeouts would round away)"
            )

    def advance(self, seconds: float = 0.0) -> int:
        """Move time forward by `seconds` and expire what became due; return how many expired.

        ``advance(0)`` runs due expirations and the purge check without moving time.

        Args:
            seconds: How far to move, >= 0 and finite.

        Raises:
            ValueError: `seconds` is negative or NaN (or infinite), or the time it leads to is
                infinite or past what an attached timer counts to.
            TypeError: `seconds` is not a number.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"seconds must be a number, got {seconds!r}")
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(
                f"seconds must be a finite number >= 0 (time never goes backwards), got {seconds!r}"
            )
        now = self._now + seconds
        if not math.isfinite(now):
            raise ValueError(f"advancing {self._now!r} s by {seconds!r} s leaves finite time")
        self._check_limit(now)
        self._now = now
        # Unknown until an `advance_to` asks: a test that moves by `advance` alone never needs it.
        self._wake_at = -math.inf
        expired = 0
        dead = False
        for alarm in self._alarms:  # (a replay may call this at every event: no list built)
            timer = alarm.timer()
            if timer is None:
                dead = True
            else:
                expired += timer.run_pass(now)
        if dead:
            self._live()
        return expired


@final
class _Alarm:
    """A timer's alarm on a `ManualClock` (the `purgatory.Alarm` protocol): the timer lowers
    it when work falls due earlier, the clock sets it whenever it asks."""

    __slots__ = ("_clock", "tick", "timer", "wake_at", "wake_tick")

    #: A driven clock always gets to a pass it has been told of.
    alive: Final = True

    def __init__(self, clock: ManualClock, timer: Timer) -> None:
        self._clock = clock
        self.tick = timer.tick
        self.timer = weakref.ref(timer)
        self.wake_tick = -math.inf  # unknown until the clock asks
        #: `wake_tick` as the clock's time (the timer's `time_of` it).
        self.wake_at = -math.inf

    def wake_by(self, tick: float) -> None:
        """Make sure the clock stops at `tick` (of this purgatory) or earlier."""
        if tick < self.wake_tick:
            self.wake_tick = tick
            timer = self.timer()
            at = self.wake_at = -math.inf if timer is None else timer.time_of(tick)
            self._clock._wake_by(at)
