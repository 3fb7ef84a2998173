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
import sys
import time
from _thread import get_ident
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, final

__all__ = (
    "AttemptTasks",
    "CancelledError",
    "EventLoop",
    "FunctionClock",
    "Reaper",
    "cancelled_here",
    "current_task",
    "current_task_cancelling",
    "get_ident",
    "loop_time_function",
    "new_future",
    "no_running_loop_reason",
    "report_exception",
    "running_loop",
    "spawn",
)

CancelledError = asyncio.CancelledError

logger = logging.getLogger("purgatory")

EventLoop = asyncio.AbstractEventLoop
AttemptTasks = set[asyncio.Task[None]]

running_loop: Callable[[], asyncio.AbstractEventLoop | None] = asyncio._get_running_loop


def loop_time_function(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The one callable that reads `loop`'s clock, for deadlines and the reaper alike.

    The stock loop's ``time()`` is ``time.monotonic()`` behind a Python frame, and uvloop's is
    the same monotonic clock cached once per loop iteration (it lags by up to a millisecond, so
    deadlines computed from it fired early by the real clock). For both, ``time.monotonic`` itself
    is read: exact, and a frame cheaper. A loop whose clock was replaced (a subclass overriding
    ``time()``, or ``loop.time`` patched on the instance, as test helpers with virtual time do) is
    read through its own ``time()``, so the deadlines and the reaper never read two clocks.
    """
    if "time" not in getattr(loop, "__dict__", ()):
        method = type(loop).time
        if method is asyncio.BaseEventLoop.time:
            return time.monotonic
        uvloop = sys.modules.get("uvloop")
        if uvloop is not None and method is getattr(uvloop.Loop, "time", None):
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
        raise RuntimeError(
            f"awaiting a delayed operation needs a running event loop: {no_running_loop_reason()}"
        )
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


def no_running_loop_reason() -> str:
    """Why there is no asyncio loop here, in words a user can act on."""
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass
        else:
            return (
                "this code runs under trio (anyio's trio backend, say), and the purgatory needs "
                "an asyncio event loop: run it on asyncio (anyio.run(..., backend='asyncio'))"
            )
    return "no asyncio event loop is running in this thread"


def current_task() -> asyncio.Task[Any] | None:
    """The running task, or ``None`` (also outside a running loop)."""
    return asyncio.current_task() if asyncio._get_running_loop() is not None else None


def current_task_cancelling() -> bool:
    """Whether the running task has been asked to cancel (not just hit by a CancelledError)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def spawn(coro: Coroutine[Any, Any, None], tasks: set[asyncio.Task[None]], name: str) -> None:
    """Run `coro` as a Task of its own (in a copy of the current context), held in `tasks`.

    Raises:
        RuntimeError: No event loop is running here.
    """
    loop = asyncio._get_running_loop()
    if loop is None:
        coro.close()
        reason = no_running_loop_reason()
        raise RuntimeError(f"an async try_complete runs as a task on the event loop, and {reason}")
    task = loop.create_task(coro, name=name)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


@final
class FunctionClock:
    """A `Clock` made of a function that reads the time (the loop's, see `loop_time_function`)."""

    __slots__ = ("current_time",)

    def __init__(self, read: Callable[[], float]) -> None:
        self.current_time = read


def _others_alive(loop: asyncio.AbstractEventLoop, ended: asyncio.Task[Any]) -> bool:
    """Whether some other task goes on, not being cancelled.

    When none does, the loop is being wound down (``asyncio.run`` cancels every task as it
    ends): the reaper then comes back only if something is watched again, instead of starting a
    task that the closing loop would destroy.
    """
    return any(
        task is not ended and not task.done() and not task.cancelling()
        for task in asyncio.all_tasks(loop)
    )


class _TimerPass(Protocol):
    _name: str

    def _run_timer_pass(self, now: float) -> int: ...

    def _next_timer_pass(self) -> float: ...


@final
class Reaper:
    """The one coroutine that expires a purgatory's operations on the loop's clock.

    It sleeps until the earliest non-empty bucket of the wheel (however many operations are
    pending, one loop timer handle at a time) and is moved earlier by `wake_by` when an earlier
    deadline arrives or a purge falls due. Nothing pending: it sleeps without any timer handle.

    It cannot be killed by accident. A callback that raises anything inside a timer pass is that
    operation's failure (the purgatory reports it); ``KeyboardInterrupt`` and ``SystemExit``
    propagate as asyncio lets them, and code that cancels "every other task" may cancel the
    reaper. Either way its task ends, and the reaper reports it and starts a new task at once if
    operations are pending, else on the next `wake_by`: expirations never stop silently.
    """

    __slots__ = (
        "_handle",
        "_loop",
        "_now",
        "_purgatory",
        "_stopping",
        "_task",
        "_tick",
        "_waiter",
        "restarts",
        "wake_tick",
    )

    def __init__(
        self,
        purgatory: _TimerPass,
        loop: asyncio.AbstractEventLoop,
        tick: float,
        now: Callable[[], float],
    ) -> None:
        self._purgatory = purgatory
        self._loop = loop
        self._tick = tick
        self._now = now
        self._handle: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._stopping = False
        #: Tasks started after one ended unexpectedly.
        self.restarts = 0
        # The tick the reaper will next run at; anything due earlier must call wake_by().
        self.wake_tick: float = -math.inf  # running now: nothing needs to wake it
        self._task = self._start()

    def _start(self) -> asyncio.Task[None]:
        task = self._loop.create_task(
            self._run(), name=f"purgatory-reaper[{self._purgatory._name}]"
        )
        task.add_done_callback(self._ended)
        return task

    def wake_by(self, tick: float) -> None:
        """Make sure a timer pass runs at tick `tick` (seconds = tick * tick length) or earlier."""
        if tick >= self.wake_tick:
            return
        self.wake_tick = tick
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._task.done():
            self._revive()
            return
        # uvloop rounds a timer to the millisecond, so it may fire a little early: the pass then
        # finds nothing due and sets the alarm again (the pass reads the exact clock).
        self._handle = self._loop.call_at(tick * self._tick, self._wake)

    def _wake(self) -> None:
        self._handle = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The task ended: fine if `stop` ended it, else say so and come back."""
        if self._stopping or task is not self._task:
            return
        self.wake_tick = math.inf  # the next wake_by starts a new task
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._purgatory._next_timer_pass() < math.inf and _others_alive(self._loop, task):
            self._revive()

    def _revive(self) -> None:
        ended = self._task
        error: BaseException = (
            asyncio.CancelledError("the reaper task was cancelled from outside")
            if ended.cancelled()
            else ended.exception() or RuntimeError("the reaper task returned")
        )
        if self._loop.is_closed():
            return
        self.restarts += 1
        self.wake_tick = -math.inf
        self._task = self._start()
        self._loop.call_exception_handler(
            {
                "message": (
                    f"the reaper of purgatory {self._purgatory._name!r} ended unexpectedly "
                    f"({type(error).__name__}); a new one was started so that expirations go "
                    "on. Stop a purgatory with `await purgatory.shutdown()`, not by cancelling "
                    "its reaper task"
                ),
                "exception": error,
                "task": ended,
            }
        )

    async def _run(self) -> None:
        loop = self._loop
        purgatory = self._purgatory
        now = self._now
        while True:
            self.wake_tick = -math.inf
            try:
                purgatory._run_timer_pass(now())
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
        self._stopping = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        task = self._task
        if task.done():
            return
        task.cancel()
        if task.get_loop() is asyncio._get_running_loop() and task is not asyncio.current_task():
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
