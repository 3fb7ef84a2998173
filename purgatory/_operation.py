"""`DelayedOperation`: the one class users subclass, and the operation protocol.

An operation is a single slotted object that is at the same time the timing wheel's entry, the
watcher lists' element and, once somebody awaits it, the owner of a lazily created future. That is
the whole per-operation cost: no Task, no coroutine, no loop handle (each of those costs more than
the operation itself: see the benchmarks' analysis).

The operation protocol
----------------------
Several owners keep fields on the operation, because a field costs less than an object of its own
on paths that run once per operation. Each field is written only by the code this table names
(a module's class, any of its methods, or a module's function); everyone else only reads it. A
test reads this table and checks it against every assignment of an operation's field in the
package, so the table is the truth:

=======================================  ====================================================
Fields                                   Writers
=======================================  ====================================================
``_state`` ``_result``                   ``_operation.DelayedOperation``
                                         ``_operation.expire_due``
``_timeout``                             ``_operation.DelayedOperation``
``_future``                              ``_operation.DelayedOperation``
``_owner``                               ``_operation.DelayedOperation``
                                         ``_purgatory.DelayedOperationPurgatory``
``_bucket``                              ``_operation.DelayedOperation``
                                         ``_wheel.TimingWheel``
                                         ``_wheel._BucketCore.remove``
                                         ``_timer.SystemTimer``
``_deadline``                            ``_wheel.TimingWheel``
                                         ``_timer.SystemTimer``
``_keys`` ``_listed``                    ``_watchers.WatcherLists``
``_marks``                               ``_watchers.WatcherLists``
                                         ``_watchers._release_lone``
=======================================  ====================================================

- ``_state``, ``_timeout``, ``_future``, ``_result``: this module; the timer pass's expiry loop
  (`expire_due`) is here for that reason. ``_state`` is one small int of bit flags, so the hot
  loops read a single attribute: zero means "pending, synchronous ``try_complete``", anything
  else needs a closer look.
- ``_owner``: the purgatory, once the operation is registered (``None`` from ``__init__`` and
  after a watch that failed). It is how the operation reaches the purgatory, with one call,
  ``_owner._settled(op, outcome)``, when it completes or is cancelled (`Owner`); the operation
  knows nothing else of it (Kafka's operation knows nothing of its purgatory).
- ``_bucket``, ``_deadline``: the timing wheel's `TimerEntry` protocol (in ``_wheel.py``):
  ``_bucket`` is ``None`` from ``__init__`` until the wheel takes the operation. The wheel's
  owner, `SystemTimer`, takes the wheel's memo path inline as it adds; the protocol's removal
  step, the bucket's own ``remove`` (``op._bucket.remove(op)``, which sets ``_bucket`` to
  ``None``), is taken by the wheel, by the timer as it discards or drains, and by the
  purgatory's settle (``_settled``), which runs once per operation. Nothing else writes them.
  The wheel holds an operation by identity: it never calls its ``__hash__``, nor does the
  watcher lists' purge queue (a ``list``).
- ``_keys``, ``_listed``, ``_marks``: the watcher lists (`_watchers.py`), which set them when
  they register the operation.

``__init__`` writes only the fields every operation needs from birth; the others are written by
their owner before anything reads them.
"""

from __future__ import annotations

import inspect
import math
import operator
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Generator
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, SupportsIndex, TypeVar

from ._asyncio import (
    CancelledError,
    cancelled_here,
    new_future,
    report_exception,
)
from ._errors import OperationCancelled, PurgatoryClosed
from ._impl import native, twin

__all__ = ("DelayedOperation", "Owner", "expire_due", "not_set_up")

_INF = math.inf


def _checked_timeout(timeout: object) -> float:
    """The slow path of the timeout check: anything but a finite float >= 0."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not 0 <= timeout < math.inf:
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
    try:
        return float(timeout)
    except OverflowError:  # an int beyond any float: as infinite as math.inf
        raise ValueError(
            f"timeout must be a finite number of seconds >= 0, got {timeout!r}"
        ) from None


def not_set_up(op: object) -> TypeError:
    """The error of an operation whose ``__init__`` did not call ``super().__init__(timeout)``:
    its fields were never written (the slow path of whatever read one)."""
    return TypeError(
        f"{type(op).__qualname__} object is not a set-up DelayedOperation (did its __init__ "
        "call super().__init__(timeout)?)"
    )


T_co = TypeVar("T_co", covariant=True)

# Bit flags of DelayedOperation._state.
ASYNC = 1  # try_complete is a coroutine function (set at construction, never cleared)
DONE = 2  # completed: by its condition, by force_complete, or by its deadline
EXPIRED = 4  # completed because its deadline passed
CANCELLED = 8  # cancelled: will never complete
FAILED = 16  # on_complete raised; _result holds the exception
CLOSED = 32  # cancelled by the purgatory's shutdown
FINISHED = DONE | CANCELLED
EXPIRED_NOW = DONE | EXPIRED

Settlement = Literal["completed", "cancelled"]


class Owner(Protocol):
    """What an operation calls when it settles: the purgatory that registered it."""

    def _settled(self, op: Any, outcome: Settlement, /) -> None:
        """`op` just completed or was cancelled (its state says which); called once."""
        ...


#: The fields of the operation protocol (the table above), which the core's layout holds.
FIELDS = (
    "_bucket",
    "_deadline",
    "_future",
    "_keys",
    "_listed",
    "_marks",
    "_owner",
    "_result",
    "_state",
    "_timeout",
)


class _OperationCore:
    """The fields of an operation (see the module docstring for their owners); the native class
    has them as a C layout (see `_impl.py`)."""

    __slots__ = FIELDS


class DelayedOperation(_OperationCore, ABC, Generic[T_co]):
    """A request parked until its condition holds (`try_complete`) or its deadline passes.

    Subclass it and implement `try_complete` and `on_complete` (and `on_expiration`, if expiry
    needs more than what ``on_complete`` does when ``is_expired`` is set); hand instances
    to `DelayedOperationPurgatory.watch` (or `try_complete_else_watch`). Kafka:
    ``DelayedOperation``.

    Operations are hashed and compared by identity: subclasses must not define ``__eq__`` or
    ``__hash__`` (a ``@dataclass`` needs ``eq=False``); the purgatory refuses such a class.

    The names of the operation's fields (``_state``, ``_result``, ``_future``, ... : the
    operation protocol of this module) are the core's: a subclass that defines an attribute or
    a slot of one of them is refused as it is created. A ``__getattribute__`` or
    ``__setattr__`` of a subclass sees what the purgatory looks up of it (``try_complete``,
    ``on_complete``, ``on_expiration``), everything its own code reads and writes, and the
    writes of ``DelayedOperation.__init__`` (a frozen dataclass refuses them); how often the
    core reads and writes its fields after that, and whether through these methods, is its
    own affair (the native core does it in C), so they must let those through unchanged.

    Args:
        timeout: Seconds from the moment the operation is first watched to its deadline; >= 0
            and finite.

    Raises:
        ValueError: `timeout` is negative, NaN or infinite.
        TypeError: `timeout` is not a real number.
    """

    __slots__ = ()

    # Written by their owners before any read (see the module docstring): the wheel's
    # _deadline, the lists' _keys, _listed and _marks, and _result at completion. Declared here,
    # not in __init__, where even a bare annotation of an attribute costs its evaluation.
    _deadline: int
    _keys: tuple[Any, ...]
    _listed: int
    _marks: Any
    _result: Any

    # Whether the subclass's try_complete is a coroutine function. Read when a purgatory first
    # meets the class, which then marks each of its operations ASYNC as it is watched: the
    # state every operation starts with is a constant, cheaper to write than a class attribute
    # is to read.
    _is_async: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _refuse_shadowed_fields(cls)
        cls._is_async = inspect.iscoroutinefunction(cls.try_complete)

    def __init__(self, timeout: float) -> None:
        """Set the operation up; a subclass's ``__init__`` calls ``super().__init__(timeout)``.

        Args:
            timeout: Seconds from the moment the operation is first watched to its deadline;
                >= 0 and finite.
        """
        if not (type(timeout) is float and timeout >= 0.0 and timeout < _INF):
            timeout = _checked_timeout(timeout)
        self._timeout = timeout
        self._state = 0
        self._owner: Owner | None = None
        self._bucket: Any = None  # the timing wheel's (its `TimerEntry` protocol)
        self._future: Any = None

    # -- the methods to implement (on_expiration: if need be) ----------------------------------

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

    def on_expiration(self) -> None:
        """React to the deadline passing; runs once, right after `on_complete`, only on expiry.

        Does nothing unless overridden (``on_complete`` already sees ``is_expired``): most
        operations need no more. Kafka: ``onExpiration`` (abstract there).
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
        owner = self._owner
        if owner is not None:
            owner._settled(self, "completed")
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
        try:
            return bool(self._state & DONE)
        except AttributeError:
            raise not_set_up(self) from None

    @property
    def is_expired(self) -> bool:
        """``True`` if the operation completed because its deadline passed."""
        try:
            return bool(self._state & EXPIRED)
        except AttributeError:
            raise not_set_up(self) from None

    @property
    def is_cancelled(self) -> bool:
        """``True`` if the operation was cancelled; its callbacks never run."""
        try:
            return bool(self._state & CANCELLED)
        except AttributeError:
            raise not_set_up(self) from None

    @property
    def timeout(self) -> float:
        """Seconds from the first watch to the deadline, as given."""
        try:
            return self._timeout
        except AttributeError:
            raise not_set_up(self) from None

    def __await__(self) -> Generator[Any, None, T_co]:
        """Wait for the outcome: `on_complete`'s value, its exception, or `OperationCancelled`."""
        # All awaiters share one future, created by the first. No shield per awaiter: a
        # cancelled awaiter cancels the shared future, and the others, not cancelled
        # themselves, simply wait again on a fresh one.
        try:
            owner = self._owner
        except AttributeError:
            raise not_set_up(self) from None
        if owner is None and not self._state & FINISHED:
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
        try:
            state = self._state
        except AttributeError:  # (a repr never raises: it is what a traceback shows)
            return (
                f"<{type(self).__qualname__} not set up: its __init__ did not call "
                "super().__init__(timeout)>"
            )
        if state & CANCELLED:
            status = "cancelled"
        elif state & EXPIRED:
            status = "expired"
        elif state & DONE:
            status = "completed"
        elif self._owner is not None:
            status = "watched"
        else:
            status = "new"
        return f"<{type(self).__qualname__} {status} timeout={self._timeout!r}>"

    # -- copies ---------------------------------------------------------------------------------

    def __getstate__(self) -> object:
        """What a copy (``copy.copy``, ``copy.deepcopy``) or a pickle of the operation carries.

        Its fields and its subclass's, as for any object (`object.__getstate__`), but not its
        ties to a purgatory: a finished operation's copy has no owner and no future (it is
        finished: neither is read again), so a deep copy does not copy the whole purgatory
        that once held it, nor the awaiters' future (which cannot be copied). An operation
        watched and still pending is refused: its purgatory holds it in its timer and on its
        keys, and would hold no copy, so a copy would say it is watched while nothing could
        complete or expire it (copy it before it is watched, or once it finished).

        Raises:
            TypeError: The operation is watched and still pending.
        """
        try:
            pending = self._owner is not None and not self._state & FINISHED
        except AttributeError:  # not set up (see `not_set_up`): copied as any object is
            pending = False
        if pending:
            raise TypeError(
                f"cannot copy {self!r}: it is watched, held by its purgatory's timer and keys, "
                "which would hold no copy of it; copy an operation before it is watched, or "
                "once it finished"
            )
        state = object.__getstate__(self)
        if type(state) is tuple:  # (the instance's dict or None, its slots: the fields)
            fields = state[1]
            for tie in ("_owner", "_future"):
                if tie in fields:
                    fields[tie] = None
        return state

    def __reduce_ex__(self, protocol: SupportsIndex, /) -> str | tuple[Any, ...]:
        """Copied and pickled as `object` does at protocol 2 or more, whatever the protocol.

        At protocols 0 and 1, `copyreg` rebuilds an object through its nearest base that is
        not a Python class: ``object`` for the pure-Python modules, the C layout of the
        native core (which cannot be built that way) for the other. Protocol 2's way
        (``copyreg.__newobj__`` and `__getstate__`), which pickles of protocols 0 and 1 can
        carry too, is the same on both.
        """
        return object.__reduce_ex__(self, max(operator.index(protocol), 2))

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
        owner = self._owner
        if owner is not None:
            owner._settled(self, "cancelled")
        self._wake_awaiters()
        return True

    def _watched_as_async(self) -> int:
        """Mark an operation of an async class as such, as it is first watched; its state."""
        state = self._state = self._state | ASYNC
        return state

    def _renew_future(self) -> Any:
        """A fresh shared future, when the last one was cancelled by another awaiter."""
        future = self._future = new_future()
        return future

    def _expect_awaiter(self) -> None:
        """Create the future before the first attempt, for `watch`: an `on_complete` error
        raised inside that attempt then has an awaiter and is not also reported as unretrieved."""
        if self._future is None:
            self._future = new_future()


_PyDelayedOperation = DelayedOperation
"""The reference, whole in every process; `DelayedOperation` is the native class where the core
is built (made by `purgatory._impl.twin`: ``__init__`` and `force_complete` C bodies over the C
layout), this one otherwise. Subclass the public one.

An operation of either class may be watched by a purgatory of either (tests/test_twins.py runs
every pairing through one script): a pure purgatory reads a native operation's fields through
their descriptors, as it reads its own; a native purgatory's C bodies see that a pure operation
is not of their C layout and hand it to the reference functions or read it through its
attributes (rule 3 of purgatory/_csrc/README.md), so it behaves the same, at the reference's
speed."""

#: The cores an operation's fields live in: what `_refuse_shadowed_fields` stops at.
_CORES: tuple[type, ...] = (_OperationCore,)

if not TYPE_CHECKING and native is not None:
    DelayedOperation = twin(
        _PyDelayedOperation, native.OperationCore, hot=("__init__", "force_complete")
    )
    _CORES = (_OperationCore, native.OperationCore)


def _refuse_shadowed_fields(cls: type) -> None:
    """Refuse a class that defines, or inherits from a class other than the core, an attribute
    named as one of the core's fields (`FIELDS`: ``_result``, ``_future``, ``_state``, ...).

    Such an attribute hides the field's descriptor: on a class with a ``__dict__``, the
    operation's state then lives in two places, the instance's dict (what Python code reads and
    writes) and the core's layout (what the native core reads and writes), so that an awaiter
    never wakes or gets ``None``. The pure-Python modules would only seem to work: a class-level
    ``_state = 0`` or ``_owner = None`` makes an operation whose ``__init__`` never called
    ``super().__init__`` look set up, and a slot of that name (``__slots__ = ("_result",)``)
    is a second field beside the core's. The names are the core's (the operation protocol in
    this module's docstring); honouring them as a subclass's own would cost every operation a
    lookup on the hot paths. Refused when the class is created, on both implementations.
    """
    for name in FIELDS:
        for base in cls.__mro__:
            if base in _CORES:
                break
            if name in base.__dict__:
                where = "" if base is cls else f" (inherited from {base.__qualname__})"
                raise TypeError(
                    f"{cls.__qualname__} defines {name}{where}, the name of a field the core keeps "
                    f"on every operation (see purgatory._operation): a class attribute or slot "
                    f"named {name} would hide it; rename it"
                )


_Op = TypeVar("_Op", bound=DelayedOperation[Any])


def expire_due(
    due: list[_Op],
    now: float,
    outcome: str = "expired",
    *,
    purge_queue: list[Any],
    ended: list[Any] | None,
) -> int:
    """Expire every operation of `due` still pending, in order, at the time `now`; return how
    many expired.

    The expiry loop of a timer pass, here because it is the one loop outside the operation
    that settles operations, and it runs once per expired operation: state first (expired, in
    the watcher lists' `purge_queue` if still on a list, its end added to `ended` for the
    event log if there is one: ``op, outcome, now``, flat, where `outcome` is ``"expired"``,
    or ``"drained"`` for a draining purgatory's), then `on_complete`, `on_expiration` and the
    awaiters. Whatever a callback raises is that operation's failure;
    ``KeyboardInterrupt`` and ``SystemExit`` still propagate, after the operation is settled
    (the caller puts back what was not expired yet).
    """
    expired = 0
    for op in due:
        state = op._state
        if state & FINISHED:
            continue
        op._state = state | EXPIRED_NOW
        if op._listed:  # the purge-queue protocol (`purgatory._watchers`)
            purge_queue.append(op)
        expired += 1
        if ended is not None:
            ended += (op, outcome, now)
        try:
            op._result = op.on_complete()
        except BaseException as exc:  # noqa: BLE001 - the operation's failure
            op._fail(exc)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                _expired_then_raise(op, exc)
        try:
            op.on_expiration()
        except BaseException as exc:
            _report_expiration(op, exc)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                op._wake_awaiters()
                raise
        future = op._future
        if future is not None and not future.done():
            future.set_result(None)
    return expired


def _expired_then_raise(op: DelayedOperation[Any], interrupt: BaseException) -> None:
    """`op`'s `on_complete` raised an interrupt as it expired: finish the expiry (its
    `on_expiration`, its awaiters), then let the interrupt go on."""
    try:
        op.on_expiration()
    except BaseException as exc:  # noqa: BLE001 - reported; the interrupt goes on
        _report_expiration(op, exc)
    op._wake_awaiters()
    raise interrupt


def _report_expiration(op: DelayedOperation[Any], exc: BaseException) -> None:
    """Report what `op`'s ``on_expiration`` raised (it has no caller to propagate to)."""
    report_exception(f"{type(op).__qualname__}.on_expiration raised", exc, operation=op)


if not TYPE_CHECKING and native is not None:
    #: `expire_due` with its loop in C (the native purgatory's; the reference's body for any
    #: entry that is not a native operation). The pure purgatory calls `expire_due` itself.
    native_expire_due = native.function(expire_due, "_operation.expire_due")
