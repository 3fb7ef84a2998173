"""The reaper and the loop binding: how a purgatory lives on an asyncio event loop.

`LoopBinding` is the event loop and thread a purgatory belongs to; for a purgatory on the loop's
clock it starts, on first use, the `Reaper`: one coroutine per purgatory that runs its timer's
passes (through the public `purgatory.Timer` protocol, as any driver does) and sleeps until the
next one. Both reach asyncio only through `purgatory._asyncio`, the one module that imports it;
the sans-IO core (the timer, the wheel, the lists, the operation) imports neither of them, so the
layers form no circle: the core, then this driver, then the purgatory that composes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, final

from ._asyncio import (
    CancelledError,
    EventLoop,
    Future,
    Task,
    TimerHandle,
    current_task,
    get_ident,
    loop_time_function,
    no_running_loop_reason,
    report_exception,
    running_loop,
)

if TYPE_CHECKING:
    from ._timer import SystemTimer

__all__ = ("PASS_BUDGET", "LoopBinding", "Reaper")


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
        self.loop: EventLoop | None = None if driven else _UNBOUND
        #: The thread of the bound loop; ``None`` until bound.
        self.thread: int | None = None
        #: The reaper of a purgatory on the loop's clock, once bound.
        self.reaper: Reaper | None = None

    @property
    def driven(self) -> bool:
        """Whether the purgatory's clock is a driven one (no reaper)."""
        return self._driven

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
        loop = running_loop()
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

    def check_caller(self) -> None:
        """Refuse a call (a cancel, a purge, a drain) from outside the thread of the bound loop.

        Raises:
            RuntimeError: Another thread's running loop owns the purgatory.
        """
        if self.thread is not None and get_ident() != self.thread:
            self.bind()  # refuses a foreign thread while the purgatory's loop runs

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
        loop: EventLoop,
        now: Callable[[], float],
    ) -> None:
        self._timer = timer
        self._name = name
        self._loop = loop
        self._tick = timer.tick
        self._now = now
        self._handle: TimerHandle | None = None
        self._waiter: Future[None] | None = None
        self._stopping = False
        #: Tasks started after one ended unexpectedly.
        self.restarts = 0
        # The tick the reaper will next run at; anything due earlier must call wake_by().
        self.wake_tick: float = -math.inf  # running now: nothing needs to wake it
        self._task = self._start()

    def _start(self) -> Task[None]:
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

    def _ended(self, task: Task[None]) -> None:
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
            CancelledError("the reaper task was cancelled from outside")
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
        if task.get_loop() is running_loop() and task is not current_task():
            try:
                await task
            except CancelledError:
                current = current_task()
                if current is not None and current.cancelling():
                    raise
