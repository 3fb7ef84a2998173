"""`SystemTimer`: the timing wheel's owner, between the purgatory and its driver.

Kafka's purgatory never touches its wheel: it calls ``timeoutTimer.add(operation)`` and
``advanceClock``, and ``SystemTimer`` owns the wheel, the count of what it holds and the turning
of times into ticks. So here: the purgatory hands a pending operation to `SystemTimer.add` and
takes a settled one back with `SystemTimer.discard`; a *driver* (the reaper on the event loop,
`purgatory.testing.ManualClock`, a trace replay's clock, a user's own) runs the timer's passes
through its public face, the `purgatory.Timer` protocol: `run_pass`, `next_pass_at`, `tick`, and
the `purgatory.Alarm` the driver gives back, through which the timer says when work falls due
earlier than the driver planned.

A pass expires what is due (the expiry loop itself is the operation module's `expire_due`,
which the purgatory hands in bound to its watcher lists and event log), then lets the purgatory
do its housekeeping (Kafka's purge rule): that is all the timer knows of the purge, a callback
that says whether work is still owed now, and `request_pass` when work falls due between passes.

An interrupted pass (a callback raised ``KeyboardInterrupt``) puts what it had not expired yet
back in the wheel, so that nothing taken from it is lost; a shutdown in the middle of a pass
finds those operations through `close`, which returns everything the timer still held.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, final

from ._impl import native, twin
from ._operation import EXPIRED, FINISHED
from ._wheel import TimingWheel, _PyTimingWheel

if TYPE_CHECKING:
    from ._clock import Alarm
    from ._operation import DelayedOperation

__all__ = ("MAX_TIMEOUT_TICKS", "SystemTimer")

Op = TypeVar("Op", bound="DelayedOperation[Any]")

# Deadlines are rounded up and the current time down, each with this slack in ticks, so that
# float noise on a tick boundary neither delays an expiry by a tick nor fires one early.
_TICK_SLACK: Final = 1e-6
_ceil = math.ceil
# Floats `time_of` steps over at most, either way, from its first estimate (a few ulps off).
_NUDGES: Final = 64
_floor = math.floor
# An alarm's `wake_tick` while nothing needs to wake it: its driver is in a pass, or has not
# learned yet when the next one is due and will ask.
_RUNNING: Final = -math.inf

#: Deadlines at most this many ticks ahead: 2**53 one-millisecond ticks are 285,000 years, and a
#: wheel of 1024 slots reaches them with 6 levels (1e300 seconds would have built 112).
MAX_TIMEOUT_TICKS: Final = 2**53
#: The latest time, in ticks, a timer counts to (a driven clock refuses to move past it): far
#: beyond any deadline, and far from where seconds divided by the tick stop being finite.
MAX_TIME_TICKS: Final = 2**62
#: How finely float seconds must resolve a tick at every time a timer counts to: a thousandth
#: (2**-10) of it. Later, a float's spacing grows past that and timeouts shorter than it round
#: away (at 2**52 s the spacing is a second): a driven clock refuses those times.
TICK_RESOLUTION: Final = 2**-10


def time_limit(tick: float) -> float:
    """The latest time (seconds) a timer of `tick` counts to: the first power of two at which a
    float's spacing exceeds `TICK_RESOLUTION` of the tick (2**33 s for 1 ms ticks), or
    `MAX_TIME_TICKS` ticks if that comes first."""
    _, exponent = math.frexp(tick * TICK_RESOLUTION)  # tick * 2**-10 in [2**(e-1), 2**e)
    # Below 2**(e + 52) a float's spacing is at most 2**(e - 1), which is within the bound.
    return min(math.ldexp(1.0, exponent + 52), MAX_TIME_TICKS * tick)


class _TimerCore:
    """A timer's fields (the native class has them as a C layout: `purgatory._impl`)."""

    __slots__ = (
        "__weakref__",
        "_closed",
        "_due_at",
        "_due_now",
        "_expire",
        "_housekeeping",
        "_in_flight",
        "_outcome",
        "alarm",
        "delayed",
        "drained",
        "expired",
        "max_timeout",
        "now",
        "passes",
        "tick",
        "time_limit",
        "wheel",
    )


@final
class SystemTimer(_TimerCore, Generic[Op]):
    """The wheel, the count of operations in it, ticks, and the passes that expire them.

    Kafka: ``SystemTimer``. Its public face for drivers is the `purgatory.Timer` protocol.

    Args:
        tick: Seconds per tick.
        wheel_size: Slots per wheel level.
        now: Reads the clock (seconds); replaced by `use_clock` when a purgatory binds to a loop.
        expire: Expires the pending operations of a due list, in order, at a time, with an
            outcome (``"expired"``, or ``"drained"`` once draining); returns how many.
        housekeeping: Called after every pass with the number of operations the pass took from
            the wheel and the pass's budget; returns whether work is still owed at once.
    """

    __slots__ = ()

    #: The class of the timer's wheel (the native timer's is the native `TimingWheel`).
    _Wheel: type[TimingWheel] = _PyTimingWheel

    def __init__(
        self,
        tick: float,
        wheel_size: int,
        now: Callable[[], float],
        expire: Callable[[list[Op], float, str], int],
        housekeeping: Callable[[int, int | None], bool],
    ) -> None:
        #: Seconds per tick (the `purgatory.Timer` protocol).
        self.tick = tick
        #: The longest timeout the timer takes, in seconds.
        self.max_timeout = MAX_TIMEOUT_TICKS * tick
        #: The latest time (seconds) the timer counts to (the `purgatory.Timer` protocol): the
        #: last where float seconds still resolve a tick (`time_limit`).
        self.time_limit = time_limit(tick)
        #: Reads the clock (seconds): the recorders' reads, with no call of the timer's.
        self.now = now
        self._expire = expire
        self._housekeeping = housekeeping
        #: Operations held (Kafka ``numDelayed``); the wheel keeps no count of its own.
        self.delayed = 0
        #: Operations expired by the passes, at their deadline.
        self.expired = 0
        #: Operations expired early by a drain (`drain`, and the passes once draining).
        self.drained = 0
        # The outcome of what the passes expire: "drained" once `drain` has been called.
        self._outcome = "expired"
        #: Passes run.
        self.passes = 0
        #: Who runs the passes, told when one falls due earlier than it planned (``None``: a
        #: driver that asks `next_pass_at` whenever it needs to know).
        self.alarm: Alarm | None = None
        self._closed = False
        # Housekeeping is owed at once (the next pass is now, whatever the wheel holds).
        self._due_now = False
        # The tick by which housekeeping is owed (`request_pass_at`); math.inf: none.
        self._due_at: float = math.inf
        # Due lists of the passes under way, so that a shutdown inside one finds them.
        self._in_flight: list[list[Op]] = []
        self.wheel = self._Wheel(wheel_size, 0)

    def __len__(self) -> int:
        """Operations held."""
        return self.delayed

    # -- the purgatory's side -----------------------------------------------------------------

    def expire_with(self, expire: Callable[[list[Op], float, str], int]) -> None:
        """Expire the passes' due operations with `expire` from here on (a purgatory whose event
        sink changed: its expiries' ends go to the new one)."""
        self._expire = expire

    def use_clock(self, now: Callable[[], float]) -> None:
        """Read time from `now` from here on, and start counting ticks at its current time.

        Raises:
            ValueError: The clock's time is not a finite number of seconds.
        """
        self.now = now
        start = now()
        _check_time(start, "the clock's time")
        self.wheel.advance(self.ticks(start))

    def check_clock(self) -> None:
        """Raise if the clock reads something that is not a finite number of seconds: the slow
        path of a watch that failed, which may have failed on the clock's value."""
        _check_time(self.now(), "the clock's time")

    def current_time(self) -> float:
        """The clock's time in seconds."""
        return self.now()

    def ticks(self, now: float) -> int:
        """The tick of the time `now` (seconds): every deadline at or before it is due."""
        return _floor(now / self.tick + _TICK_SLACK)

    def add(self, op: Op) -> None:
        """Hold `op` until its deadline: now plus its timeout, rounded up to the tick. O(1).

        The operation's timeout must be within `max_timeout` (the purgatory checks it first).
        """
        deadline = _ceil((self.now() + op._timeout) / self.tick - _TICK_SLACK)
        wheel = self.wheel
        if deadline < wheel.memo_high and deadline >= wheel.memo_low:  # the wheel's memo, inline
            op._deadline = deadline
            bucket = wheel.memo_bucket
            bucket[id(op)] = op
            op._bucket = bucket
            due = wheel.memo_due
        else:
            due = wheel.add(op, deadline)
        if op._state & FINISHED or self._closed:
            self._not_held(op)
            return
        self.delayed += 1
        if self.alarm is not None and due < self.alarm.wake_tick:
            self.alarm.wake_by(due)

    def add_due(self, op: Op) -> None:
        """Hold `op` due at once: the next pass expires it (a draining purgatory's watch)."""
        due = self.wheel.add(op, self.wheel.current_tick)
        if op._state & FINISHED or self._closed:
            self._not_held(op)
            return
        self.delayed += 1
        alarm = self.alarm
        if alarm is not None and due < alarm.wake_tick:
            alarm.wake_by(due)

    @staticmethod
    def _not_held(op: Op) -> None:
        """Undo the add of `op`, which was settled, or whose purgatory was shut down, while the
        wheel took it: the wheel calls none of the operation's code (buckets hold entries by
        identity), but a new level's buckets and the queue's items are allocations, and a
        collection there runs whatever ``__del__`` it finds. The settle found `op` in no bucket
        yet, so it is taken out here and never counted."""
        op._bucket.remove(op)

    def discard(self, op: Op) -> None:
        """Stop holding the settled `op` (held: its ``_bucket`` is set). O(1).

        The removal protocol: this is two steps, the wheel's timer-entry protocol's one
        (``op._bucket.remove(op)``, `Bucket.remove`) and ``timer.delayed -= 1``; the
        purgatory's settle, which runs once per operation and cannot afford the call, takes
        them inline, and nothing else does.
        """
        op._bucket.remove(op)
        self.delayed -= 1

    def request_pass(self) -> None:
        """Housekeeping fell due between passes: have the driver run a pass now.

        A reaper whose task ended is not brought back for housekeeping alone (it comes back when
        an operation falls due): during a loop's wind-down that would start a task on a closing
        loop.
        """
        self._due_now = True
        alarm = self.alarm
        if alarm is None:
            return
        wake = alarm.wake_tick
        if wake == _RUNNING:  # a pass is under way, or the driver will ask before its next one
            return
        tick = self.wheel.current_tick
        if tick < wake and alarm.alive:
            alarm.wake_by(tick)

    def request_pass_at(self, tick: int) -> None:
        """Housekeeping falls due at `tick` (a purge of what finished meanwhile): have the
        driver run a pass then, even if nothing else is due. Like `request_pass`, a reaper
        whose task ended is not brought back for it."""
        if tick >= self._due_at:
            return
        self._due_at = tick
        alarm = self.alarm
        if alarm is not None and tick < alarm.wake_tick and alarm.alive:
            alarm.wake_by(tick)  # (not while a pass is under way: wake_tick is -inf then)

    def in_flight(self) -> int:
        """Operations the passes under way took from the wheel and have not expired yet."""
        return sum(map(len, self._in_flight))

    def held(self) -> list[Op]:
        """The operations held, in deadline order (in watch order within a tick)."""
        return sorted(self.wheel, key=_deadline_of)

    def drain(self, answer: Callable[[Op], object] | None) -> int:
        """Hand every operation held to `answer`, in deadline order, then expire those still
        pending (a purgatory's drain); return how many `answer` completed or expired.

        From then on what the passes expire is *drained* (counted in `drained`, not `expired`,
        and told to the event log as such): only operations watched while draining, due at
        once, are left to expire.
        """
        self._outcome = "drained"
        answered = 0
        if answer is not None:
            for op in self.held():
                if not op._state & FINISHED:
                    answer(op)
                    answered += bool(op._state & FINISHED)
        return answered + self.expire_all()

    def expire_all(self) -> int:
        """Expire every operation held now, in deadline order (a drain: `drain` first); return
        how many."""
        if self._closed:
            return 0
        due = self.held()
        for op in due:  # out of the wheel by the timer-entry protocol's step
            op._bucket.remove(op)
        self.delayed -= len(due)
        expired = self._expire_taken(due, self.now()) if due else 0
        self._due_now = self._housekeeping(len(due), None) or self._due_now
        return expired

    def close(self) -> list[Op]:
        """Stop (a shutdown): no pass has work from now on; return every operation held,
        those of a pass under way included."""
        self._closed = True
        self._due_now = False
        self._due_at = math.inf
        held = list(self.wheel)
        for bucket in self.wheel.buckets():  # the whole wheel goes: its buckets let go of all
            bucket.clear()
        for op in held:  # ... and no entry names a bucket of it any more
            op._bucket = None
        for due in self._in_flight:
            held.extend(due)
        # A fresh wheel: a cascade under way would otherwise keep its entries referenced.
        self.wheel = self._Wheel(self.wheel.wheel_size, self.wheel.current_tick)
        self.delayed = 0
        return held

    # -- the driver's side: the `purgatory.Timer` protocol ------------------------------------

    def run_pass(self, now: float, budget: int | None = None) -> int:
        """Expire what is due at `now` (seconds), then the housekeeping; return how many expired.

        Args:
            now: The clock's time, never earlier than at the last pass.
            budget: At most about this many entries are cascaded, and purged, in this pass (the
                rest at the next passes, which `next_pass_at` then says are due at once), so
                that a driver on an event loop never stalls it; ``None``: all of it.

        Raises:
            ValueError: `now` is NaN or infinite, or `budget` is negative.
            TypeError: `now` is not a number, or `budget` is not an int (nor ``None``).

        A refused call changes nothing and is not counted as a pass.
        """
        if self._closed:
            return 0
        if budget is not None and not (type(budget) is int and budget >= 0):
            raise _budget_error(budget)
        if not (type(now) is float and now - now == 0.0):  # (NaN and inf give NaN)
            _check_time(now, "now")
        due = self.wheel.advance(self.ticks(now), budget)
        self.passes += 1
        if self._due_at <= self.wheel.current_tick:  # the housekeeping asked for is this pass's
            self._due_at = math.inf
        expired = 0
        taken = len(due)
        if due:
            self.delayed -= taken
            expired = self._expire_taken(due, now)
        self._due_now = self._housekeeping(taken, budget)
        return expired

    def next_pass_tick(self) -> float:
        """The tick at which a pass next has work; ``math.inf`` if none."""
        if self._closed:
            return math.inf
        if self._due_now:
            return self.wheel.current_tick
        deadline = self.wheel.next_deadline()
        return self._due_at if self._due_at < deadline else deadline

    def next_pass_at(self) -> float:
        """The time (seconds) at which a pass next has work; ``math.inf`` if none.

        The due tick's own time, ``tick * self.tick`` (or the next float after it, if the
        timer's rounding reaches the tick only there); a pass may find that work a hair
        earlier, within the rounding the timer tolerates: `time_of` says from when.
        """
        tick = self.next_pass_tick()
        if tick == math.inf:
            return tick
        at = tick * self.tick
        for _ in range(_NUDGES):
            if self.ticks(at) >= tick:
                break
            at = math.nextafter(at, math.inf)
        return at

    def time_of(self, tick: float) -> float:
        """The earliest time (seconds) at which a pass reaches `tick` (``+-math.inf`` as given).

        About ``tick * self.tick``, but exact against the timer's own rounding: a pass at the
        answer has the work due at `tick`, and a pass a float earlier has not (``9 * 0.001`` is
        ``0.009000000000000001``, after ``0.009``, which reaches tick 9).
        """
        if tick in (math.inf, -math.inf):
            return tick
        length = self.tick
        at = (tick - _TICK_SLACK) * length  # a float or two from the answer
        nextafter = math.nextafter
        for _ in range(_NUDGES):  # up to the first time that reaches the tick (`ticks`, inline)
            if _floor(at / length + _TICK_SLACK) >= tick:
                break
            at = nextafter(at, math.inf)
        for _ in range(_NUDGES):  # ... and down to the earliest one
            earlier = nextafter(at, -math.inf)
            if _floor(earlier / length + _TICK_SLACK) < tick:
                break
            at = earlier
        return at

    def next_deadline_in(self) -> float:
        """Seconds until an operation held next needs a pass (``math.inf`` if none), reading
        only: a gauge may ask from another thread."""
        tick = math.inf if self._closed else self.wheel.peek_next_deadline()
        return math.inf if tick == math.inf else max(0.0, tick * self.tick - self.now())

    def next_deadline_tick(self) -> float:
        """The tick at which an operation held next needs a pass (housekeeping aside)."""
        return math.inf if self._closed else self.wheel.next_deadline()

    # -- internals ----------------------------------------------------------------------------

    def _expire_taken(self, due: list[Op], now: float) -> int:
        """Expire the pending operations of `due`; if a callback interrupts the pass, what was
        not expired yet goes back into the wheel, due at the next pass."""
        in_flight = self._in_flight
        in_flight.append(due)
        outcome = self._outcome
        expired = 0
        try:
            expired = self._expire(due, now, outcome)
        except BaseException:
            expired = sum(1 for op in due if op._state & EXPIRED)
            if not self._closed:
                wheel = self.wheel
                for op in due:
                    if not op._state & FINISHED:
                        wheel.add(op, op._deadline)
                        self.delayed += 1
            raise
        finally:
            in_flight.pop()
            if outcome == "expired":
                self.expired += expired
            else:
                self.drained += expired
        return expired

    def _check(self, now: float | None, driven: bool) -> None:
        """Raise ``AssertionError`` if the timer and its wheel disagree.

        Checked beside the wheel's own invariants: the count is the wheel's size; the wheel is
        not ahead of the clock (`now`, when known); a driven clock's alarm is not later than the
        next pass that has work (or that pass would be skipped; a reaper whose task ended comes
        back for deadlines only).
        """
        self.wheel._check()
        assert self.delayed == len(self.wheel), f"{self.delayed} delayed, {len(self.wheel)} held"
        if now is not None:
            assert self.wheel.current_tick <= self.ticks(now), (
                f"the wheel is at tick {self.wheel.current_tick}, ahead of the clock at {now!r} s"
            )
        alarm = self.alarm
        if driven and alarm is not None and not self._in_flight:
            assert alarm.wake_tick <= self.next_pass_tick(), (
                f"alarm at tick {alarm.wake_tick!r}, work due at {self.next_pass_tick()!r}"
            )


def _check_time(now: object, what: str) -> None:
    """Refuse `now` (`what` names it) unless it is a time: a finite number of seconds (an int
    or a float, not a bool), before anything moves."""
    if isinstance(now, bool) or not isinstance(now, int | float):
        raise TypeError(f"{what} must be a finite number of seconds, got {now!r}")
    try:
        finite = math.isfinite(now)
    except OverflowError:  # an int beyond every float
        finite = False
    if not finite:
        raise ValueError(f"{what} must be a finite number of seconds, got {now!r}")


def _budget_error(budget: object) -> Exception:
    kind = ValueError if type(budget) is int else TypeError
    return kind(f"budget must be an int >= 0 (entries per pass) or None (all), got {budget!r}")


def _deadline_of(op: Any) -> int:
    deadline: int = op._deadline
    return deadline


_PySystemTimer = SystemTimer
"""The reference, whole in every process (its wheel a `_PyTimingWheel`); `SystemTimer` is the
native class where the core is built (made by `purgatory._impl.twin`), this one otherwise."""

if not TYPE_CHECKING and native is not None:
    SystemTimer = twin(
        _PySystemTimer,
        native.TimerCore,
        hot=("add", "add_due", "run_pass", "next_pass_tick"),
        _Wheel=TimingWheel,
    )
