"""Everything that touches asyncio: the loop clock, futures, tasks and background attempts.

The rest of the package is sans-IO: it takes the time as an argument and never sleeps. This module
is the one that imports asyncio: it reads a loop's clock, reports errors the way asyncio does,
lets operations be awaited without costing anything until somebody actually awaits, and runs the
attempts of async ``try_complete`` methods. The reaper and the binding of a purgatory to its loop
(`purgatory._reaper`) build on it, and reach asyncio only through the names it exports, so the
core's modules import nothing that leads back to them.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from _thread import get_ident
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias, final

__all__ = (
    "AttemptRunner",
    "CancelledError",
    "EventLoop",
    "Future",
    "Task",
    "TimerHandle",
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

EventLoop: TypeAlias = asyncio.AbstractEventLoop
Future: TypeAlias = asyncio.Future
Task: TypeAlias = asyncio.Task
TimerHandle: TypeAlias = asyncio.TimerHandle

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
