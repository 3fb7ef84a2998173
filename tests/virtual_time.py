"""Event loops in virtual time: asyncio and uvloop whose clock jumps whenever they would sleep.

trio's ``MockClock(autojump_threshold=0)`` is the model: when nothing is ready to run, the clock
jumps to the earliest timer instead of the loop sleeping until it. A test whose tasks sleep, time
out and expire then takes no wall time, and what it asserts about time is exact: the loop's clock
reads what the timers say, however slow or loaded the machine is.

- `VirtualTimeLoop` is the stock selector loop with its own timers: only the selector's wait
  changes. It polls for I/O first (without waiting); with nothing ready and a timer pending, it
  moves the clock by the timeout instead of sleeping (the approach of aiotools' ``VirtualClock``
  and of looptime). With no timer at all it really waits, since only I/O or another thread can
  wake it then.
- `VirtualTimeUVLoop` is uvloop's loop, whose timers live in libuv on libuv's clock, out of
  Python's reach. So this subclass keeps the timers itself (`call_at` / `call_later`) and runs
  them from a callback that re-queues itself while any is pending: when one whole loop iteration
  went by in which nothing was scheduled (no ``call_soon``, ``call_soon_threadsafe`` or ``stop``),
  nothing is ready, and the clock jumps to the earliest timer. Everything else (the ready queue,
  futures, tasks, I/O) is uvloop's own.

Both read their time through ``loop.time()``, which `purgatory` honours (a loop whose ``time``
is overridden is read through it), so the purgatory's deadlines and its reaper follow the
virtual clock.

The price, as with trio's autojump: a timer pending while the loop waits for something outside it
(a socket, a thread) fires at once, since the loop cannot know the outside is about to answer.
Join the thread before awaiting what it triggers, and run real network I/O on a real clock. And
time passes only when the loop is idle: a callback or task that re-queues itself for as long as
some deadline has not passed (a busy wait) stops the clock for good; poll with a sleep instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import math
import selectors
from collections.abc import Callable
from typing import TypeVarTuple, Unpack

import pytest
import uvloop

__all__ = ("DEFAULT_START", "EACH_LOOP", "NewLoop", "VirtualTimeLoop", "VirtualTimeUVLoop")

#: Where virtual time starts: a magnitude like a real monotonic clock's after a day of uptime,
#: so that float rounding at real magnitudes is exercised, not hidden by times near zero.
DEFAULT_START = 100_000.0

_Ts = TypeVarTuple("_Ts")


def _checked_start(start: object) -> None:
    if isinstance(start, bool) or not isinstance(start, int | float):
        raise TypeError(f"start must be a number of seconds, got {start!r}")
    if not math.isfinite(start):
        raise ValueError(f"start must be a finite number of seconds, got {start!r}")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """The stock asyncio loop, in virtual time.

    Args:
        start: The loop's time when it is created, in seconds.
    """

    def __new__(cls, start: float = DEFAULT_START) -> VirtualTimeLoop:
        _checked_start(start)  # here, before there is a loop object to finalise
        return super().__new__(cls)

    def __init__(self, start: float = DEFAULT_START) -> None:
        self._virtual_now = float(start)
        super().__init__(_VirtualSelector(self))

    def time(self) -> float:
        """The virtual time: it moves only when the loop would otherwise sleep."""
        return self._virtual_now

    def _jump(self, seconds: float) -> None:
        # `seconds` is the timer's `when` minus now, floats within a factor of two of each other
        # (the clock stays under twice its start): the difference is exact, so the sum lands on
        # `when` exactly and the timer is due.
        self._virtual_now += seconds


class _VirtualSelector(selectors.DefaultSelector):
    """The loop's selector: a wait for I/O with a timer pending becomes a jump of the clock."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer: only I/O or another thread can wake the loop
            return super().select(None)
        self._loop._jump(timeout)
        return []


class VirtualTimeUVLoop(uvloop.Loop):
    """uvloop's loop, in virtual time: its timers kept here, run when the loop goes idle.

    Args:
        start: The loop's time when it is created, in seconds.
    """

    def __new__(cls, start: float = DEFAULT_START) -> VirtualTimeUVLoop:
        _checked_start(start)  # here, before there is a loop object to finalise
        return super().__new__(cls)

    def __init__(self, start: float = DEFAULT_START) -> None:
        super().__init__()
        self._virtual_now = float(start)
        # (when, order of scheduling, handle): equal deadlines run in the order they were set.
        self._timers: list[tuple[float, int, asyncio.TimerHandle]] = []
        self._order = itertools.count()
        self._cancelled_timers = 0
        # Callbacks scheduled so far, and the count when the pump last looked: equal means a
        # whole iteration went by with nothing new queued.
        self._queued = 0
        self._seen = -1
        self._pumping = False

    def time(self) -> float:
        """The virtual time: it moves only when the loop would otherwise sleep."""
        return self._virtual_now

    def call_soon(
        self,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        self._queued += 1
        return super().call_soon(callback, *args, context=context)

    def call_soon_threadsafe(
        self,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        self._queued += 1
        return super().call_soon_threadsafe(callback, *args, context=context)

    def stop(self) -> None:
        self._queued += 1  # uvloop queues its stop callback past call_soon
        super().stop()

    def call_later(
        self,
        delay: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        return self.call_at(self._virtual_now + delay, callback, *args, context=context)

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        if self.is_closed():
            raise RuntimeError("Event loop is closed")
        handle = asyncio.TimerHandle(when, callback, args, self, context)
        handle._scheduled = True  # type: ignore[attr-defined]
        heapq.heappush(self._timers, (when, next(self._order), handle))
        if not self._pumping:
            self._pumping = True
            super().call_soon(self._pump)
        return handle

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        # Dropped lazily; the heap is rebuilt once most of it is cancelled handles.
        if not handle._scheduled:  # type: ignore[attr-defined]
            return  # it ran already
        self._cancelled_timers += 1
        if self._cancelled_timers > 100 and self._cancelled_timers * 2 > len(self._timers):
            self._timers = [
                entry
                for entry in self._timers
                if not entry[2].cancelled() and entry[2] is not handle  # (it is being cancelled)
            ]
            heapq.heapify(self._timers)
            self._cancelled_timers = 0

    def _pump(self) -> None:
        """Run while timers are pending: jump to the earliest one once the loop is idle."""
        timers = self._timers
        while timers and timers[0][2].cancelled():
            heapq.heappop(timers)
            self._cancelled_timers -= 1
        if not timers:
            self._pumping = False
            return
        if self._queued != self._seen:
            self._seen = self._queued  # busy: run only what is due, as any loop does
        else:
            self._virtual_now = max(self._virtual_now, timers[0][0])  # idle: jump
        while timers and timers[0][0] <= self._virtual_now:
            handle = heapq.heappop(timers)[2]
            if handle.cancelled():
                self._cancelled_timers -= 1
            else:
                handle._scheduled = False  # type: ignore[attr-defined]
                super().call_soon(self._run_timer, handle)
        super().call_soon(self._pump)

    @staticmethod
    def _run_timer(handle: asyncio.TimerHandle) -> None:
        # A timer due with others may be cancelled by one of them that runs first.
        if not handle.cancelled():
            handle._run()

    def close(self) -> None:
        self._timers.clear()
        super().close()


NewLoop = Callable[[], asyncio.AbstractEventLoop]
"""A loop factory: either class above, called with the default start."""

#: Runs a test that makes its own loops (argument ``new_loop``, a `NewLoop`) on both loops.
EACH_LOOP = pytest.mark.parametrize(
    "new_loop", [VirtualTimeLoop, VirtualTimeUVLoop], ids=["asyncio", "uvloop"]
)
