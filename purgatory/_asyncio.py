"""Everything that touches asyncio: the loop clock, the reaper, futures and background attempts.

The rest of the package is sans-IO: it takes the time as an argument and never sleeps. This module
is the thin driver that turns it into something an event loop runs: the binding of a purgatory to
the loop (and thread) it is first used in, one reaper coroutine per purgatory that runs its
timer's passes (through the public `purgatory.Timer` protocol, as any driver does) and sleeps
until the next one, and helpers that let operations be awaited without costing anything until
somebody actually awaits.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from _thread import get_ident
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol, final

if TYPE_CHECKING:
    from ._timer import SystemTimer

__all__ = (
    "AttemptRunner",
    "CancelledError",
    "EventLoop",
    "LoopBinding",
    "Reaper",
    "cancelled_here",
    "current_task",
    "current_task_cancelling",
    "get_ident",
    "loop_time_function",
    "new_future",
    "no_running_loop_reason",
    "report_exception",
    "report_false_claim",
    "running_loop",
)

CancelledError = asyncio.CancelledError

logger = logging.getLogger("purgatory")

EventLoop = asyncio.AbstractEventLoop

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


def report_false_claim(op: object, claimed: object) -> None:
    """Say that `op`'s try_complete returned a truthy value without completing `op`."""
    report_exception(
        f"{type(op).__qualname__}.try_complete returned {claimed!r} without completing; it "
        "must return self.force_complete()",
        TypeError("try_complete claimed a completion that did not happen"),
        operation=op,
    )


class _Attempted(Protocol):
    """What the runner needs of an operation with an async ``try_complete``."""

    @property
    def is_completed(self) -> bool: ...

    @property
    def is_cancelled(self) -> bool: ...

    def try_complete(self) -> Any: ...


@final
class AttemptRunner:
    """Runs the attempts of async ``try_complete`` methods, for one purgatory.

    Every attempt runs in a Task of its own, in a copy of the caller's context, as asyncio runs
    any callback: a timeout or a context variable inside ``try_complete`` is the attempt's,
    never the caller's. At most one attempt runs per operation; triggers that arrive while it
    runs are remembered, and the attempt that ends runs one more (Kafka's
    ``maybeTryComplete``): no trigger is lost and none piles up.
    """

    __slots__ = ("_rerun", "closed", "tasks")

    def __init__(self) -> None:
        # The operations with an attempt in flight, each with "a trigger came in meanwhile".
        self._rerun: dict[Any, bool] = {}
        #: The attempts' tasks, so that a shutdown can cancel them.
        self.tasks: set[asyncio.Task[None]] = set()
        #: Set by the purgatory's shutdown: cancelled attempts are not started again.
        self.closed = False

    def running(self, op: object) -> bool:
        """Whether an attempt of `op` is in flight."""
        return op in self._rerun

    def attempt(self, op: _Attempted) -> None:
        """Start an attempt of `op`, or have the one in flight followed by one more.

        Raises:
            RuntimeError: No event loop is running here.
        """
        if op.is_completed or op.is_cancelled:
            return
        rerun = self._rerun
        if op in rerun:
            rerun[op] = True
            return
        loop = asyncio._get_running_loop()
        if loop is None:
            reason = no_running_loop_reason()
            raise RuntimeError(
                f"an async try_complete runs as a task on the event loop, and {reason}"
            )
        rerun[op] = False
        task = loop.create_task(self._run(op), name=f"{type(op).__qualname__}.try_complete")
        task.add_done_callback(lambda task: self._ended(op, task))
        self.tasks.add(task)

    async def _run(self, op: _Attempted) -> None:
        """Attempts, one at a time, until one ends with no trigger having come in meanwhile."""
        name = type(op).__qualname__
        rerun = self._rerun
        while True:
            rerun[op] = False
            try:
                claimed = await op.try_complete()
            except asyncio.CancelledError:
                if current_task_cancelling():
                    raise  # the task was cancelled: `_ended` sorts it out
                report_exception(
                    f"{name}.try_complete raised CancelledError without being cancelled",
                    asyncio.CancelledError(),
                    operation=op,
                )
            except (KeyboardInterrupt, SystemExit):
                rerun.pop(op, None)
                raise
            except BaseException as exc:  # noqa: BLE001 - reported; the operation goes on
                report_exception(f"{name}.try_complete raised", exc, operation=op)
            else:
                if claimed and not op.is_completed:
                    report_false_claim(op, claimed)
            if not rerun.get(op) or op.is_completed or op.is_cancelled:
                rerun.pop(op, None)
                return

    def _ended(self, op: _Attempted, task: asyncio.Task[None]) -> None:
        """An attempt's task ended; if it was cancelled from outside, attempt again.

        A shutdown cancels attempts on purpose. Anyone else (code that cancels "all other
        tasks", say) may have cancelled it before it even started, or with a trigger pending:
        the operation must neither stay "running" for good nor lose that trigger.
        """
        self.tasks.discard(task)
        # Only a cancelled task ends with its operation still marked running (every other way
        # out clears it), and no other attempt can have started since.
        if not task.cancelled() or op not in self._rerun:
            return
        del self._rerun[op]
        if op.is_completed or op.is_cancelled or self.closed:
            return
        report_exception(
            f"the task of {type(op).__qualname__}.try_complete was cancelled from outside; "
            "the attempt runs again",
            asyncio.CancelledError(),
            operation=op,
        )
        self.attempt(op)

    def close(self) -> None:
        """Cancel every attempt in flight (but the running task's own) and start no more."""
        self.closed = True
        current = current_task()
        for task in list(self.tasks):
            if task is not current:
                task.cancel()


#: Entries one reaper pass cascades down the wheel, and purges, before the loop gets a turn
#: (about a millisecond of work); the rest goes to the next passes, due at once.
PASS_BUDGET: Final = 4096

# Never a running loop: the binding of a purgatory on the loop's clock starts at it, so that its
# first use binds (the hot paths compare the bound loop with the running one, nothing else).
_UNBOUND: Any = object()


@final
class LoopBinding:
    """The event loop and thread a purgatory belongs to; for one on the loop's clock, its reaper.

    A purgatory on the loop's clock stays with the first loop it is used in (its reaper and its
    awaiters live there) and reads that loop's clock. One with a driven clock follows whichever
    loop (or none) uses it, one after the other (a loop only serves its threadsafe triggers and
    async attempts there): it refuses only a call from another thread while its loop still runs.
    """

    __slots__ = ("_driven", "_name", "_timer", "loop", "reaper", "thread")

    def __init__(self, name: str, timer: SystemTimer[Any], driven: bool) -> None:
        self._name = name
        self._timer = timer
        self._driven = driven
        #: The bound loop; ``None`` for a driven purgatory used outside any loop.
        self.loop: asyncio.AbstractEventLoop | None = None if driven else _UNBOUND
        #: The thread of the bound loop; ``None`` until bound.
        self.thread: int | None = None
        #: The reaper of a purgatory on the loop's clock, once bound.
        self.reaper: Reaper | None = None

    @property
    def bound(self) -> bool:
        """Whether the purgatory has a clock to read: a driven one always, one on the loop's
        clock once bound to its loop."""
        return self._driven or self.reaper is not None

    def bind(self) -> None:
        """Bind to the running loop on first use; refuse another loop or another thread.

        Raises:
            RuntimeError: Another thread's running loop owns the purgatory, a loop-clock
                purgatory is used in another loop or outside any.
        """
        loop = asyncio._get_running_loop()
        bound = self.loop
        if self._driven:
            if (
                loop is not bound
                and bound is not None
                and bound.is_running()
                and get_ident() != self.thread
            ):
                raise RuntimeError(
                    f"purgatory {self._name!r} belongs to the event loop of another thread "
                    "while that loop runs; call it from that loop (from other threads: "
                    "check_and_complete_threadsafe or loop.call_soon_threadsafe)"
                )
            self.loop = loop
            self.thread = get_ident()
            return
        if bound is not _UNBOUND and loop is not bound:
            if loop is None and get_ident() != self.thread:
                raise RuntimeError(
                    f"purgatory {self._name!r} belongs to the event loop of another thread; "
                    "call it from that loop (from other threads: check_and_complete_threadsafe "
                    "or loop.call_soon_threadsafe)"
                )
            raise RuntimeError(
                f"purgatory {self._name!r} is bound to another event loop (its reaper and its "
                "awaiters live there); create one purgatory per loop"
            )
        if loop is None:
            raise RuntimeError(
                f"purgatory {self._name!r} follows the event loop's clock, so it must be used "
                f"inside a running asyncio loop, and {no_running_loop_reason()} (for tests "
                "without a loop, pass clock=purgatory.testing.ManualClock())"
            )
        if self.reaper is not None:
            return
        self.loop = loop
        self.thread = get_ident()
        now = loop_time_function(loop)
        timer = self._timer
        timer.use_clock(now)
        self.reaper = Reaper(timer, self._name, loop, now)
        timer.alarm = self.reaper

    def check_thread(self) -> None:
        """The slow path of a trigger's thread check: bind, or refuse another thread."""
        if self.thread is None or self._driven:
            self.bind()
        elif get_ident() != self.thread:
            raise RuntimeError(
                f"purgatory {self._name!r} belongs to the event loop of another thread; from "
                f"this thread call check_and_complete_threadsafe(key) instead"
            )

    def call_soon_threadsafe(
        self, what: str, callback: Callable[..., object], *args: object
    ) -> None:
        """Run `callback` on the bound loop, from any thread (`what` names it in errors).

        Raises:
            RuntimeError: Never used inside a running loop, or that loop is closed.
        """
        loop = self.loop
        if loop is None or loop is _UNBOUND:
            raise RuntimeError(
                f"purgatory {self._name!r} is not bound to an event loop yet: it binds to the "
                "running loop the first time it is called from inside one (watch, "
                "try_complete_else_watch, check_and_complete)"
            )
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError as exc:
            if not loop.is_closed():
                raise
            raise RuntimeError(
                f"purgatory {self._name!r} is bound to an event loop that is closed; {what} "
                "was not delivered"
            ) from exc

    async def stop(self) -> None:
        """Stop the reaper, if any, and wait until it has stopped."""
        if self.reaper is not None:
            await self.reaper.stop()


@final
class Reaper:
    """The one coroutine that runs a timer's passes on the loop's clock: a `purgatory.Timer`
    driver, and its `purgatory.Alarm`.

    It sleeps until the timer's next pass (however many operations are pending, one loop timer
    handle at a time) and is moved earlier by `wake_by` when an earlier deadline arrives or a
    purge falls due. Nothing pending: it sleeps without any timer handle.

    It cannot be killed by accident. A callback that raises anything inside a pass is that
    operation's failure (the purgatory reports it); ``KeyboardInterrupt`` and ``SystemExit``
    propagate as asyncio lets them, and code that cancels "every other task" may cancel the
    reaper. Either way its task ends, and a new one starts, reported to the loop's exception
    handler, when the next operation falls due: expirations never stop silently.
    """

    __slots__ = (
        "_handle",
        "_loop",
        "_name",
        "_now",
        "_stopping",
        "_task",
        "_tick",
        "_timer",
        "_waiter",
        "restarts",
        "wake_tick",
    )

    def __init__(
        self,
        timer: SystemTimer[Any],
        name: str,
        loop: asyncio.AbstractEventLoop,
        now: Callable[[], float],
    ) -> None:
        self._timer = timer
        self._name = name
        self._loop = loop
        self._tick = timer.tick
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
        task = self._loop.create_task(self._run(), name=f"purgatory-reaper[{self._name}]")
        task.add_done_callback(self._ended)
        return task

    @property
    def alive(self) -> bool:
        """Whether the reaper's task is running (it may have ended, to come back on `wake_by`)."""
        return not self._task.done()

    def wake_by(self, tick: float) -> None:
        """Make sure a timer pass runs at tick `tick` (seconds = tick * tick length) or earlier."""
        if tick >= self.wake_tick:
            return
        self.wake_tick = tick
        if self._handle is not None:
            self._handle.cancel()
        # uvloop rounds a timer to the millisecond, so it may fire a little early: the pass then
        # finds nothing due and sets the alarm again (the pass reads the exact clock). A reaper
        # whose task ended comes back at that time, by a plain timer handle.
        callback = self._revive if self._task.done() else self._wake
        self._handle = self._loop.call_at(tick * self._tick, callback)

    def _wake(self) -> None:
        self._handle = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The task ended: fine if `stop` ended it, else come back when there is work.

        The new task is started by a timer handle at the next deadline (`wake_by`), not at
        once: a loop being wound down (``asyncio.run`` cancels every task as it ends) never gets
        there, so it neither hears of it nor is left with a task it would destroy; a loop that
        goes on gets its expirations on time, and the report.
        """
        if self._stopping or task is not self._task:
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.wake_tick = math.inf
        next_tick = self._timer.next_deadline_tick()
        if next_tick < math.inf:
            self.wake_by(next_tick)

    def _revive(self) -> None:
        self._handle = None
        ended = self._task
        if self._stopping or not ended.done() or self._loop.is_closed():
            return
        error: BaseException = (
            asyncio.CancelledError("the reaper task was cancelled from outside")
            if ended.cancelled()
            else ended.exception() or RuntimeError("the reaper task returned")
        )
        self.restarts += 1
        self.wake_tick = -math.inf
        self._task = self._start()
        self._loop.call_exception_handler(
            {
                "message": (
                    f"the reaper of purgatory {self._name!r} ended unexpectedly "
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
        timer = self._timer
        now = self._now
        while True:
            self.wake_tick = -math.inf
            try:
                timer.run_pass(now(), PASS_BUDGET)
            except Exception as exc:  # noqa: BLE001 - a bug, reported; expiries must go on
                report_exception("purgatory timer pass failed", exc)
            waiter = self._waiter = loop.create_future()
            self.wake_tick = math.inf
            next_tick = timer.next_pass_tick()
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
