"""Everything that touches asyncio: the loop clock, the reaper, futures and background attempts.

The rest of the package is sans-IO: it takes the time as an argument and never sleeps. This module
is the thin driver that turns it into something an event loop runs: one reaper coroutine per
purgatory that sleeps until the earliest non-empty bucket of the timing wheel, and helpers that
let operations be awaited without costing anything until somebody actually awaits.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Protocol, final

__all__ = (
    "AttemptTasks",
    "CancelledError",
    "EventLoop",
    "LoopClock",
    "Reaper",
    "cancelled_here",
    "loop_time_function",
    "new_future",
    "report_exception",
    "running_loop",
    "spawn_continuation",
)

CancelledError = asyncio.CancelledError

logger = logging.getLogger("purgatory")

EventLoop = asyncio.AbstractEventLoop
AttemptTasks = set[asyncio.Task[None]]

running_loop: Callable[[], asyncio.AbstractEventLoop | None] = asyncio._get_running_loop


def loop_time_function(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The cheapest callable that reads `loop`'s clock.

    The stock loop's ``time()`` is a Python method around ``time.monotonic``; calling the
    latter directly saves a Python frame on every watch. A loop that overrides ``time()`` (uvloop,
    a test loop with virtual time) keeps its own.
    """
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


def report_exception(message: str, exc: BaseException, **context: Any) -> None:
    """Report an error that has no caller to propagate to, the way asyncio reports its own.

    Inside a running loop it goes to the loop's exception handler (so an application's handler
    sees it); without one, to the ``purgatory`` logger.
    """
    loop = asyncio._get_running_loop()
    if loop is not None:
        loop.call_exception_handler({"message": message, "exception": exc, **context})
    else:
        logger.error("%s", message, exc_info=exc)


def new_future() -> asyncio.Future[None]:
    """A future on the running loop; a clear error when awaited outside one."""
    loop = asyncio._get_running_loop()
    if loop is None:
        raise RuntimeError("awaiting a delayed operation needs a running event loop")
    return loop.create_future()


def cancelled_here(future: asyncio.Future[None]) -> bool:
    """Whether the `CancelledError` just raised by awaiting `future` is meant for this task.

    Several tasks await one shared future. Cancelling one of them cancels the future itself, so
    the others wake with `CancelledError` too; for them it is spurious (their task was not
    cancelled: ``cancelling()`` is 0) and they should wait again.
    """
    if not future.cancelled():
        return True
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


@final
class LoopClock:
    """The running event loop's clock (``loop.time()``), the default clock of a purgatory."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def current_time(self) -> float:
        """The loop's monotonic time in seconds."""
        return self._loop.time()


class _Resume:
    """Hand a coroutine that was already stepped once over to a Task, which drives the rest.

    An async ``try_complete`` is first stepped synchronously, so that one that never suspends
    completes inside the trigger that started it (as a sync one would). If it does suspend, the
    future it yielded must reach the Task exactly as yielded; this awaitable forwards it and every
    later step, send and throw alike.
    """

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self._coro, self._first
        while True:
            try:
                sent = yield value
            except BaseException as exc:  # noqa: BLE001 - forwarded, cancellation included
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


def spawn_continuation(
    coro: Coroutine[Any, Any, Any],
    first: Any,
    on_done: Callable[[BaseException | None], None],
    tasks: set[asyncio.Task[None]],
) -> None:
    """Finish the half-run `coro` in a Task held in `tasks`; call `on_done(error)` after it."""
    loop = asyncio._get_running_loop()
    if loop is None:
        coro.close()
        raise RuntimeError(
            "an async try_complete suspended, and finishing it needs a running event loop"
        )

    async def finish() -> None:
        try:
            await _Resume(coro, first)
        except asyncio.CancelledError:
            on_done(None)
            raise
        except Exception as exc:  # noqa: BLE001 - reported by on_done
            on_done(exc)
        else:
            on_done(None)

    task = loop.create_task(finish())
    tasks.add(task)
    task.add_done_callback(tasks.discard)


class _TimerPass(Protocol):
    def _run_timer_pass(self, now: float) -> int: ...

    def _next_timer_pass(self) -> float: ...


@final
class Reaper:
    """The one coroutine that expires a purgatory's operations on the loop's clock.

    It sleeps until the earliest non-empty bucket of the wheel (however many operations are
    pending, one loop timer handle at a time) and is moved earlier by `wake_by` when an earlier
    deadline arrives or a purge falls due. Nothing pending: it sleeps without any timer handle.
    """

    __slots__ = ("_handle", "_loop", "_purgatory", "_task", "_tick", "_waiter", "wake_tick")

    def __init__(
        self, purgatory: _TimerPass, loop: asyncio.AbstractEventLoop, tick: float, name: str
    ) -> None:
        self._purgatory = purgatory
        self._loop = loop
        self._tick = tick
        self._handle: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Future[None] | None = None
        # The tick the reaper will next run at; anything due earlier must call wake_by().
        self.wake_tick: float = -math.inf  # running now: nothing needs to wake it
        self._task = loop.create_task(self._run(), name=f"purgatory-reaper[{name}]")

    def wake_by(self, tick: float) -> None:
        """Make sure a timer pass runs at tick `tick` (seconds = tick * tick length) or earlier."""
        if tick >= self.wake_tick:
            return
        self.wake_tick = tick
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_at(tick * self._tick, self._wake)

    def _wake(self) -> None:
        self._handle = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _run(self) -> None:
        loop = self._loop
        purgatory = self._purgatory
        while True:
            self.wake_tick = -math.inf
            try:
                purgatory._run_timer_pass(loop.time())
            except Exception as exc:  # noqa: BLE001 - a bug, reported; expiries must go on
                report_exception("purgatory timer pass failed", exc)
            waiter = self._waiter = loop.create_future()
            self.wake_tick = math.inf
            next_tick = purgatory._next_timer_pass()
            if next_tick < math.inf:
                self.wake_by(next_tick)
            await waiter

    async def stop(self) -> None:
        """Cancel the reaper and wait until it has stopped; idempotent."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        task = self._task
        if task.done():
            return
        task.cancel()
        if task.get_loop() is asyncio._get_running_loop():
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
