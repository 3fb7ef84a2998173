"""`DelayedOperation`: the one class users subclass.

An operation is a single slotted object that is at the same time the timing wheel's entry, the
watcher lists' element and, once somebody awaits it, the owner of a lazily created future. That is
the whole per-operation cost: no Task, no coroutine, no loop handle (each of those costs more than
the operation itself: see the benchmarks' analysis).

State is one small int of bit flags, so the hot loops test a single attribute: zero means
"pending, synchronous try_complete", anything else needs a closer look.
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._asyncio import (
    CancelledError,
    cancelled_here,
    current_task_cancelling,
    new_future,
    report_exception,
    spawn,
)
from ._errors import OperationCancelled, PurgatoryClosed

if TYPE_CHECKING:
    from ._purgatory import DelayedOperationPurgatory
    from ._wheel import Bucket

__all__ = ("DelayedOperation",)


def _checked_timeout(timeout: object) -> float:
    """The slow path of the timeout check: anything but a finite float >= 0."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not 0 <= timeout < math.inf:
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
    return float(timeout)


T_co = TypeVar("T_co", covariant=True)

# Bit flags of DelayedOperation._state.
ASYNC = 1  # try_complete is a coroutine function (set at construction, never cleared)
DONE = 2  # completed: by its condition, by force_complete, or by its deadline
EXPIRED = 4  # completed because its deadline passed
CANCELLED = 8  # cancelled: will never complete
FAILED = 16  # on_complete raised; _result holds the exception
CLOSED = 32  # cancelled by the purgatory's shutdown
RUNNING = 64  # an async attempt is in flight
RERUN = 128  # a trigger arrived while an attempt was in flight: run one more after it
FINISHED = DONE | CANCELLED


class DelayedOperation(ABC, Generic[T_co]):
    """A request parked until its condition holds (`try_complete`) or its deadline passes.

    Subclass it and implement `try_complete`, `on_complete` and `on_expiration`; hand instances
    to `DelayedOperationPurgatory.watch` (or `try_complete_else_watch`). Kafka:
    ``DelayedOperation``.

    Operations are hashed and compared by identity: subclasses must not define ``__eq__`` or
    ``__hash__`` (a ``@dataclass`` needs ``eq=False``); the purgatory refuses such a class.

    Args:
        timeout: Seconds from the moment the operation is first watched to its deadline; >= 0
            and finite.

    Raises:
        ValueError: `timeout` is negative, NaN or infinite.
        TypeError: `timeout` is not a real number.
    """

    __slots__ = (
        "_bucket",
        "_deadline",
        "_future",
        "_keys",
        "_listed",
        "_marks",
        "_purgatory",
        "_result",
        "_state",
        "_timeout",
    )

    # ASYNC when the subclass's try_complete is a coroutine function, else 0.
    _initial_state: int = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._initial_state = ASYNC if inspect.iscoroutinefunction(cls.try_complete) else 0

    def __init__(self, timeout: float) -> None:
        if not (type(timeout) is float and 0.0 <= timeout < math.inf):
            timeout = _checked_timeout(timeout)
        self._timeout = timeout
        self._state = self._initial_state
        self._bucket: Bucket | None = None
        self._purgatory: DelayedOperationPurgatory[Any] | None = None
        self._keys: tuple[Any, ...] | None = None
        # How many watcher lists hold the operation: at 0 the purgatory forgets it.
        self._listed = 0
        # Its thresholds by key when it watches at any (see purgatory._watchers).
        self._marks: dict[Any, Any] | None = None
        self._future: Any = None
        # _deadline is written by the timing wheel and _result by completion, before any read.
        self._deadline: int
        self._result: Any

    # -- the three methods to implement -------------------------------------------------------

    @abstractmethod
    def try_complete(self) -> bool | Coroutine[Any, Any, bool]:
        """Check the condition; if it holds, ``return self.force_complete()``, else ``False``.

        May be ``async def``: then at most one attempt runs at a time, and a trigger that arrives
        during an attempt causes exactly one more attempt after it. Kafka: ``tryComplete``.
        """

    @abstractmethod
    def on_complete(self) -> T_co:
        """Produce the operation's result; runs exactly once, on completion or on expiry.

        What it returns is what ``await op`` returns; what it raises, ``await op`` raises.
        Kafka: ``onComplete``.
        """

    @abstractmethod
    def on_expiration(self) -> None:
        """React to the deadline passing; runs once, right after `on_complete`, only on expiry.

        Kafka: ``onExpiration``.
        """

    # -- completion ---------------------------------------------------------------------------

    def force_complete(self) -> bool:
        """Complete the operation now, unless something already did; ``True`` if this call did.

        The first caller takes the operation out of the timer (O(1)), runs `on_complete` and
        wakes the awaiters; every later call returns ``False`` and runs nothing. A cancelled
        operation cannot be completed. Kafka: ``forceComplete``.

        Runtime complexity: O(1) plus `on_complete`.
        """
        state = self._state
        if state & FINISHED:
            return False
        self._state = state | DONE
        bucket = self._bucket
        if bucket is not None:
            del bucket[self]
            self._bucket = None
            bucket.wheel._size -= 1
        purgatory = self._purgatory
        if purgatory is not None:
            purgatory._completed += 1
            if self._keys is not None:
                # purgatory._finished(self), inlined: this is every completion's path.
                if self._listed:
                    purgatory._garbage[self] = None
                purgatory._unpurged += 1
                if purgatory._unpurged > purgatory._purge_interval:
                    purgatory._purge_due()
            if purgatory._log is not None:
                purgatory._record_end(self, "completed")
        try:
            self._result = self.on_complete()
        except Exception as exc:  # noqa: BLE001 - delivered to the awaiters
            self._fail(exc)
        except BaseException as exc:
            # Not the caller's to handle, but the awaiters' outcome all the same; an interrupt
            # still interrupts, once the operation is consistent.
            self._fail(exc)
            self._wake_awaiters()
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            return True
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)
        return True

    @property
    def is_completed(self) -> bool:
        """``True`` once the operation completed, by its condition or by its deadline."""
        return bool(self._state & DONE)

    @property
    def is_expired(self) -> bool:
        """``True`` if the operation completed because its deadline passed."""
        return bool(self._state & EXPIRED)

    @property
    def is_cancelled(self) -> bool:
        """``True`` if the operation was cancelled; its callbacks never run."""
        return bool(self._state & CANCELLED)

    @property
    def timeout(self) -> float:
        """Seconds from the first watch to the deadline, as given."""
        return self._timeout

    def __await__(self) -> Generator[Any, None, T_co]:
        """Wait for the outcome: `on_complete`'s value, its exception, or `OperationCancelled`."""
        # All awaiters share one future, created by the first. No shield per awaiter: a
        # cancelled awaiter cancels the shared future, and the others, not cancelled
        # themselves, simply wait again on a fresh one.
        if self._purgatory is None and not self._state & FINISHED:
            raise RuntimeError(
                f"{self!r} was never watched, so nothing will ever complete it: pass it to "
                "purgatory.watch() (or try_complete_else_watch) before awaiting it"
            )
        while not self._state & FINISHED:
            future = self._future
            if future is None or future.done():
                future = self._future = new_future()
            try:
                yield from future
            except CancelledError:
                if cancelled_here(future):
                    raise
        return self._outcome()

    def __repr__(self) -> str:
        state = self._state
        if state & CANCELLED:
            status = "cancelled"
        elif state & EXPIRED:
            status = "expired"
        elif state & DONE:
            status = "completed"
        elif self._purgatory is not None:
            status = "watched"
        else:
            status = "new"
        return f"<{type(self).__qualname__} {status} timeout={self._timeout!r}>"

    # -- internals used by the purgatory -----------------------------------------------------

    def _outcome(self) -> T_co:
        state = self._state
        if state & CANCELLED:
            if state & CLOSED:
                raise PurgatoryClosed("the purgatory was shut down before the operation completed")
            raise OperationCancelled("the operation was cancelled")
        if state & FAILED:
            raise self._result
        result: T_co = self._result
        return result

    def _fail(self, exc: BaseException) -> None:
        """Keep what `on_complete` raised for the awaiters; report it if there are none yet.

        ``CancelledError``, ``KeyboardInterrupt`` and ``SystemExit`` reach the awaiters as the
        cause of a ``RuntimeError`` (as a coroutine's ``StopIteration`` does): raised as such in
        an awaiter, the first would cancel that task and the others stop the loop once more
        (an interrupt propagates once, from where it was raised).
        """
        if isinstance(exc, CancelledError | KeyboardInterrupt | SystemExit):
            wrapped = RuntimeError(
                f"{type(self).__qualname__}.on_complete raised {type(exc).__name__}"
            )
            wrapped.__cause__ = exc
            exc = wrapped
        self._state |= FAILED
        self._result = exc
        if self._future is None:
            # Nobody waits yet: say so now rather than lose the error if nobody ever will.
            report_exception(f"{type(self).__qualname__}.on_complete raised", exc, operation=self)

    def _wake_awaiters(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def _cancel(self, closed: bool = False) -> bool:
        """Cancel unless finished: out of the timer at once, awaiters get the error."""
        state = self._state
        if state & FINISHED:
            return False
        self._state = state | (CANCELLED | CLOSED if closed else CANCELLED)
        bucket = self._bucket
        if bucket is not None:
            del bucket[self]
            self._bucket = None
            bucket.wheel._size -= 1
        purgatory = self._purgatory
        if purgatory is not None:
            purgatory._cancelled += 1
            if self._keys is not None:
                purgatory._finished(self)
            if purgatory._log is not None:
                purgatory._record_end(self, "cancelled")
        self._wake_awaiters()
        return True

    def _attempt_async(self) -> None:
        """Start an attempt of an async `try_complete`, or have the running one followed by one.

        Every attempt runs in a Task of its own, in a copy of the caller's context, as asyncio
        runs any callback: a timeout or a context variable inside `try_complete` is the
        attempt's, never the caller's. Triggers that arrive while an attempt runs set RERUN, and
        the attempt that ends runs one more (Kafka's ``maybeTryComplete``): no trigger is lost
        and none piles up.

        Raises:
            RuntimeError: No event loop is running here.
        """
        state = self._state
        if state & FINISHED:
            return
        if state & RUNNING:
            self._state = state | RERUN
            return
        purgatory = self._purgatory
        assert purgatory is not None
        self._state = state | RUNNING
        try:
            task = spawn(
                self._run_attempts(), f"{type(self).__qualname__}.try_complete", self._ended
            )
        except BaseException:
            self._state &= ~RUNNING
            raise
        purgatory._attempts.add(task)

    async def _run_attempts(self) -> None:
        """Attempts, one at a time, until one ends with no trigger having come in meanwhile."""
        name = type(self).__qualname__
        while True:
            self._state &= ~RERUN
            try:
                claimed = await self.try_complete()  # type: ignore[misc]
            except CancelledError:
                if current_task_cancelling():
                    raise  # the task was cancelled: `_ended` sorts it out
                report_exception(
                    f"{name}.try_complete raised CancelledError without being cancelled",
                    CancelledError(),
                    operation=self,
                )
            except (KeyboardInterrupt, SystemExit):
                self._state &= ~(RUNNING | RERUN)
                raise
            except BaseException as exc:  # noqa: BLE001 - reported; the operation goes on
                report_exception(f"{name}.try_complete raised", exc, operation=self)
            else:
                if claimed and not self._state & DONE:
                    report_false_claim(self, claimed)
            state = self._state
            if not state & RERUN or state & FINISHED:
                self._state = state & ~(RUNNING | RERUN)
                return

    def _ended(self, task: Any) -> None:
        """An attempt's task ended; if it was cancelled from outside, attempt again.

        A shutdown cancels attempts on purpose. Anyone else (code that cancels "all other
        tasks", say) may have cancelled it before it even started, or with a trigger pending:
        the operation must neither stay "running" for good nor lose that trigger.
        """
        purgatory = self._purgatory
        if purgatory is not None:
            purgatory._attempts.discard(task)
        # Only a cancelled task ends with RUNNING still set (every other way out clears it), and
        # no other attempt can have started since: RUNNING is this task's.
        state = self._state
        if not task.cancelled() or not state & RUNNING:
            return
        self._state = state & ~(RUNNING | RERUN)
        if state & FINISHED or purgatory is None or purgatory._closed:
            return
        report_exception(
            f"the task of {type(self).__qualname__}.try_complete was cancelled from outside; "
            "the attempt runs again",
            CancelledError(),
            operation=self,
        )
        self._attempt_async()


def report_false_claim(op: DelayedOperation[Any], claimed: object) -> None:
    """Say that `op`'s try_complete returned a truthy value without completing `op`."""
    report_exception(
        f"{type(op).__qualname__}.try_complete returned {claimed!r} without completing; it "
        "must return self.force_complete()",
        TypeError("try_complete claimed a completion that did not happen"),
        operation=op,
    )
