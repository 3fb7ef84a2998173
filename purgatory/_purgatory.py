"""`DelayedOperationPurgatory`: keyed watcher lists in front of a timing wheel.

Kafka's design, kept: an operation is tried once, registered on each of its keys, tried again
(which closes the race with a trigger that arrived in between) and only then put in the timer.
A trigger on a key (`check_and_complete`) re-tries the operations on that key's list. Completed
operations are left on the lists of their other keys and removed in bulk by a *purge*, run on a
timer pass once enough have piled up (``purge_interval``), because removing them eagerly from
every list would cost more than the rare purge.

Ours, added: watchers at a threshold (see `purgatory._thresholds`), so a trigger that carries
the value reached re-tries only the operations that can now complete. The purge visits only the
operations that finished while still on a list, not every watched entry, so its cost follows the
garbage, not the number of pending operations; on the event loop it runs in bounded slices, so a
burst of garbage never stalls the expirations. The purgatory holds an operation only while a
list or the timer does: one that has left them all is forgotten at once, whatever its result.

The purgatory is a facade over parts that each own their state: `WatcherLists` (every key's
watchers, the trigger loop, cancel, the purge; `purgatory._watchers`), the `TimingWheel`
(`purgatory._wheel`) and the operations themselves (`purgatory._operation`, whose docstring lists
which fields of an operation belong to whom). It checks arguments, binds to a loop, composes the
parts, counts the gauges, decides when to purge (Kafka's rule) and runs the timer pass. An
operation reaches it through one call when it settles (`_settled`); everything else goes from
the facade down.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, final

from ._asyncio import (
    AttemptRunner,
    CancelledError,
    FunctionClock,
    Reaper,
    cancelled_here,
    get_ident,
    loop_time_function,
    no_running_loop_reason,
    report_exception,
    report_false_claim,
    running_loop,
)
from ._clock import Alarm, Clock, DrivenClock
from ._errors import PurgatoryClosed, PurgatoryFull
from ._events import EventLog, Outcome
from ._operation import (
    ASYNC,
    DONE,
    EXPIRED,
    FINISHED,
    DelayedOperation,
    Settlement,
    expire_due,
)
from ._watchers import WatcherLists
from ._wheel import TimingWheel

if TYPE_CHECKING:
    from ._asyncio import EventLoop

__all__ = ("DEFAULT_WHEEL_SIZE", "DelayedOperationPurgatory", "PurgatoryStatistics")

T = TypeVar("T")
Op = TypeVar("Op", bound=DelayedOperation[Any])
_D_contra = TypeVar("_D_contra", contravariant=True)
_R_co = TypeVar("_R_co", covariant=True)


class _Accepting(Protocol[_D_contra, _R_co]):
    """What `watch` asks of its purgatory, for the type checker only: to take `_D_contra`, an
    operation type that is a `DelayedOperation[T]` (`_R_co`), so that ``await watch(op)`` is a
    ``T`` and only the purgatory's own operation type is accepted."""

    def _accept(self, op: _D_contra, /) -> _R_co: ...


#: Slots per wheel level. Kafka uses 20; 1024 one-millisecond ticks put every timeout under a
#: second straight into level 0, so such operations never cascade (see benchmarks/RESULTS.md).
DEFAULT_WHEEL_SIZE = 1024

# Deadlines are rounded up and the current time down, each with this slack in ticks, so that
# float noise on a tick boundary neither delays an expiry by a tick nor fires one early.
_TICK_SLACK = 1e-6
# An alarm's `wake_tick` while nothing needs to wake it: the reaper is in a pass, or a driven
# clock has not learned when the next pass is due and will ask at its next move.
_RUNNING = -math.inf
_ceil = math.ceil
_floor = math.floor

# Garbage entries one purge slice removes on the event loop (about a millisecond of work); more
# garbage waits for the next pass, which the reaper runs as soon as the loop has had a turn.
PURGE_SLICE = 4096

# Deadlines at most this many ticks ahead: 2**53 one-millisecond ticks are 285,000 years, and a
# wheel of 1024 slots reaches them with 6 levels (1e300 seconds would have built 112).
MAX_TIMEOUT_TICKS = 2**53
# Entries a timer pass on the event loop cascades (moves down a wheel level) before it yields.
CASCADE_SLICE = 4096


@final
@dataclass(frozen=True, slots=True)
class PurgatoryStatistics:
    """A snapshot of a purgatory's gauges and counters (counters count since creation)."""

    watched: int
    """Entries over all watcher lists, completed ones not yet purged included."""
    delayed: int
    """Operations in the timer."""
    keys: int
    """Keys with a watcher list."""
    completed: int
    """Operations completed by their condition or `force_complete` (expiries not included)."""
    expired: int
    """Operations completed by their deadline."""
    cancelled: int
    """Operations cancelled (`cancel_for_key`, `shutdown`, a cancelled `watch`)."""
    purged: int
    """Watcher-list entries removed by purges."""
    timer_passes: int
    """Timer passes run: reaper wake-ups on the loop, ``advance`` calls of a driven clock."""
    purges: int
    """Timer passes that removed entries from the watcher lists (on the loop a purge runs in
    slices, one per pass; `purge` calls are not counted)."""
    next_deadline_in: float
    """Seconds until the timer next has work (``math.inf`` when nothing is timed)."""


def _split_keys(
    keys: Iterable[Hashable] | Mapping[Hashable, Any],
) -> tuple[tuple[Hashable, ...], dict[Hashable, Any] | None]:
    """The keys to watch, and the operation's own copy of the mapping of key to threshold if
    a mapping was given (its *marks*, see `purgatory._watchers`), else ``None``.

    Thresholds are checked here, before anything is tried or registered.
    """
    if type(keys) is dict or isinstance(keys, Mapping):
        marks = dict(keys)  # (all None: a plain watch, which these marks then describe)
        for threshold in marks.values():
            if threshold is not None and not threshold <= threshold:  # noqa: PLR0124 - NaN
                key = next(key for key, value in marks.items() if value is threshold)
                raise ValueError(
                    f"threshold {threshold!r} for {key!r} does not order against itself "
                    "(NaN?); a watcher at it could never be reached"
                )
        return tuple(marks), marks
    if isinstance(keys, str | bytes):
        raise TypeError(f"keys must be a collection of keys, not the string {keys!r}")
    if not isinstance(keys, Iterable):
        raise TypeError(
            f"keys must be a collection of keys or a mapping of key to threshold, got {keys!r}"
        )
    return tuple(keys), None


def _check_identity_semantics(cls: type) -> None:
    if cls.__hash__ is not object.__hash__ or cls.__eq__ is not object.__eq__:  # type: ignore[comparison-overlap]
        raise TypeError(
            f"{cls.__qualname__} defines __eq__ or __hash__; operations are tracked by identity, "
            "so remove them (for a dataclass, use @dataclass(eq=False))"
        )


@final
class DelayedOperationPurgatory(Generic[Op]):
    """Holds delayed operations until their condition holds or their deadline passes.

    Kafka: ``DelayedOperationPurgatory``. Times are in seconds; the wheel counts integer ticks.

    Callbacks may use their own purgatory: ``try_complete``, ``on_complete`` and
    ``on_expiration`` may call `check_and_complete` (re-entrantly, on any key),
    ``force_complete`` of any operation, `try_complete_else_watch` / `watch` of another
    operation, `cancel_for_key`, `purge`, `statistics`, `shutdown` (which cancels whatever is
    still pending, the operation being watched or expired included) and
    ``ManualClock.advance``; each leaves the lists and the timer consistent. A purgatory on the
    loop's clock belongs to that loop and its thread: from another thread, only
    `check_and_complete_threadsafe`.

    Args:
        name: A label for reprs, the reaper task's name and error messages.
        purge_interval: Purge the watcher lists once more than this many watched operations have
            finished since the last purge (Kafka ``purgeInterval``).
        tick: Length of a timer tick in seconds. Deadlines are rounded up to a tick.
        wheel_size: Slots per timing-wheel level.
        max_pending: Refuse (`PurgatoryFull`) to delay more operations than this; ``None``: no cap.
        clock: ``None`` to follow the running event loop's clock with a reaper coroutine, or a
            `DrivenClock` such as `purgatory.testing.ManualClock` that runs the expirations itself.
        event_log: An `EventLog` told of every operation's watch and end (for instance
            `purgatory.JsonLinesEventLog`); ``None``, the default, costs nothing.

    Raises:
        ValueError: An argument is out of range.
        TypeError: An argument has the wrong type.
    """

    __slots__ = (
        "__weakref__",
        "_alarm",
        "_attempt",
        "_attempts",
        "_cancelled",
        "_checked_types",
        "_clock",
        "_closed",
        "_completed",
        "_delayed",
        "_driven",
        "_expired",
        "_in_flight",
        "_lists",
        "_log",
        "_loop",
        "_max_pending",
        "_max_timeout",
        "_name",
        "_owed",
        "_owner_thread",
        "_passes",
        "_purge_interval",
        "_purge_queue",
        "_purges",
        "_purging",
        "_reaper",
        "_sync_types",
        "_tick",
        "_time",
        "_unbound",
        "_wheel",
    )

    def __init__(
        self,
        name: str,
        *,
        purge_interval: int = 1000,
        tick: float = 0.001,
        wheel_size: int = 1024,  # DEFAULT_WHEEL_SIZE, written out for the signature's readers
        max_pending: int | None = None,
        clock: DrivenClock | None = None,
        event_log: EventLog | None = None,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        if isinstance(purge_interval, bool) or not isinstance(purge_interval, int):
            raise TypeError(f"purge_interval must be an int, got {purge_interval!r}")
        if purge_interval < 0:
            raise ValueError(f"purge_interval must be >= 0, got {purge_interval!r}")
        if isinstance(tick, bool) or not isinstance(tick, int | float):
            raise TypeError(f"tick must be a number of seconds, got {tick!r}")
        if not (tick > 0 and math.isfinite(tick)):
            raise ValueError(f"tick must be a finite number of seconds > 0, got {tick!r}")
        if max_pending is not None:
            if isinstance(max_pending, bool) or not isinstance(max_pending, int):
                raise TypeError(f"max_pending must be an int or None, got {max_pending!r}")
            if max_pending < 1:
                raise ValueError(
                    f"max_pending must be >= 1 (or None for no cap), got {max_pending!r}"
                )
        if clock is not None and not isinstance(clock, DrivenClock):
            raise TypeError(
                f"clock must be None (the event loop's clock) or a driven clock such as "
                f"purgatory.testing.ManualClock, got {clock!r}"
            )
        if event_log is not None and not isinstance(event_log, EventLog):
            raise TypeError(
                "event_log must have record_watch, record_end and flush methods (the "
                f"purgatory.EventLog protocol), got {event_log!r}"
            )
        self._name = name
        self._tick = float(tick)
        self._max_timeout = MAX_TIMEOUT_TICKS * self._tick
        self._max_pending = max_pending
        self._log = event_log
        self._lists: WatcherLists[Op] = WatcherLists()
        # The purge queue of the lists, shared by protocol (see `purgatory._watchers`).
        self._purge_queue = self._lists.queue
        # Kafka's purge rule: purge once ``estimated - numDelayed > purgeInterval``, where
        # ``estimated`` counts the operations registered since the last purge. `_owed` is that
        # difference, kept as it changes: a registered operation that enters the timer leaves
        # it unchanged, so the watch path pays nothing for it. The wheel keeps no count of its
        # own: `_delayed` is numDelayed.
        self._purge_interval = purge_interval
        self._owed = 0
        self._delayed = 0
        self._purging = False
        # Due lists of the timer passes under way, so that a shutdown inside one cancels them.
        self._in_flight: list[list[Op]] = []
        self._completed = 0
        self._expired = 0
        self._cancelled = 0
        self._passes = 0
        self._purges = 0
        self._closed = False
        self._checked_types: set[type] = set()
        # The classes met whose try_complete is synchronous: their watch skips `_admit_type`.
        self._sync_types: set[type] = set()
        self._attempts = AttemptRunner()
        self._attempt = self._attempts.attempt
        self._loop: EventLoop | None = None
        # The thread of the bound loop; None until bound (every call then takes the slow path).
        self._owner_thread: int | None = None
        self._reaper: Reaper | None = None
        # Who runs the timer passes, told when one falls due earlier: the reaper, or the
        # driven clock's alarm (``None``: a driven clock that asks at every move).
        self._alarm: Alarm | None = None
        self._driven = clock is not None
        # A purgatory on the loop's clock until its first use inside a loop binds it.
        self._unbound = clock is None
        self._clock: Clock | None = clock
        # The clock's reading, as a bound method: one call on the hot path.
        self._time: Callable[[], float] = (
            self._unbound_time if clock is None else clock.current_time
        )
        start = 0 if clock is None else self._now_tick(clock.current_time())
        self._wheel = TimingWheel(wheel_size, start)
        if clock is not None:
            self._alarm = clock.attach(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<DelayedOperationPurgatory {self._name!r} {state} delayed={self._delayed} "
            f"keys={len(self._lists)}>"
        )

    @property
    def name(self) -> str:
        """The label given at construction."""
        return self._name

    # -- the Kafka API ------------------------------------------------------------------------

    # One path, its steps inlined: on this path a call costs more than a branch.
    def try_complete_else_watch(  # noqa: C901, PLR0912, PLR0915
        self, op: Op, keys: Iterable[Hashable] | Mapping[Hashable, Any]
    ) -> bool:
        """Complete `op` now if it can; otherwise watch it on every key and start its timer.

        Kafka: ``tryCompleteElseWatch``. Tries once; if not complete, registers `op` on every
        key, tries again (a trigger may have come in between), and if still not complete adds it
        to the timer, its deadline being now + ``op.timeout``. An async `try_complete` is not
        awaited here: `op` is registered and timed, and its attempt starts as a task of its own.

        Args:
            op: An operation never watched before.
            keys: The keys whose `check_and_complete` should re-try `op` (any hashables; a
                collection, not one key: ``["topic-0"]``, not ``"topic-0"``), or a mapping of
                key to *threshold* (any value that orders against the key's other thresholds,
                offsets typically; ``None`` for a plain watch of that key): then
                ``check_and_complete(key, reached)`` re-tries `op` only once ``reached`` is at
                least its threshold.

        Returns:
            ``True`` iff `op` completed inside this call.

        Raises:
            PurgatoryClosed: The purgatory was shut down.
            PurgatoryFull: ``max_pending`` operations are delayed already; nothing registered.
            ValueError: `keys` is empty, `op` was already watched or finished, or its timeout
                is beyond the timer's horizon (2**53 ticks).
            TypeError: `op` is not a set-up `DelayedOperation`, `keys` is a string, a key is
                not hashable, or thresholds of one key do not compare; nothing registered.
            RuntimeError: Called outside the thread of the event loop the purgatory is bound to.
            Exception: Whatever a synchronous `try_complete` raised; nothing stays registered.

        Runtime complexity: O(len(keys)) plus two `try_complete` calls (O(log n) more per key
        watched at a threshold).
        """
        if self._closed:
            raise PurgatoryClosed(f"purgatory {self._name!r} is shut down")
        try:
            state = op._state
            owner = op._owner
        except AttributeError:
            raise TypeError(
                f"{type(op).__qualname__} object is not a set-up DelayedOperation (did its "
                "__init__ call super().__init__(timeout)?)"
            ) from None
        if owner is not None or state & FINISHED:
            raise ValueError(f"{op!r} was already watched or finished; watch an operation once")
        if type(op) not in self._sync_types:
            state = self._admit_type(op)
        marks = None
        if type(keys) is not tuple:
            keys, marks = _split_keys(keys)
        if not keys:
            raise ValueError("keys is empty: an operation must watch at least one key")
        if op._timeout > self._max_timeout:
            raise ValueError(
                f"timeout {op._timeout!r} s is beyond the timer's horizon of 2**53 ticks "
                f"({self._max_timeout:.3g} s); use a shorter timeout"
            )
        if self._loop is not running_loop() or self._unbound:
            self._bind_loop()
        if self._log is not None:
            self._record_watch(op, keys, marks)
        if not state:  # a synchronous try_complete: Kafka's first try, before registration
            try:
                claimed = op.try_complete()
            except BaseException:
                self._refuse(op)
                raise
            if op._state & FINISHED or self._closed:
                return self._ended_before_registration(op)
            if claimed:
                report_false_claim(op, claimed)
        wheel = self._wheel
        if self._max_pending is not None and self._delayed >= self._max_pending:
            self._refuse(op)
            raise PurgatoryFull(
                f"purgatory {self._name!r} already delays max_pending={self._max_pending} "
                "operations"
            )
        # Registration: on every key or, if a key cannot be hashed or a threshold compared, on
        # none. From here on the operation settles through `_settled`.
        try:
            self._lists.register(op, keys, marks)
        except BaseException:
            self._refuse(op)
            raise
        op._owner = self
        try:
            if state & ASYNC:
                self._attempt(op)
            else:
                claimed = op.try_complete()
                if op._state & FINISHED:
                    self._owed += 1  # registered, never timed
                    if self._owed > self._purge_interval:
                        self._purge_due()
                    return True
                if claimed:
                    report_false_claim(op, claimed)
                if self._closed:  # the attempt shut the purgatory down
                    return False
        except BaseException:
            self._abandon(op)
            raise
        due = wheel.add(op, _ceil((self._time() + op._timeout) / self._tick - _TICK_SLACK))
        self._delayed += 1
        alarm = self._alarm
        if alarm is not None and due < alarm.wake_tick:
            alarm.wake_by(due)
        return False

    def _admit_type(self, op: Op) -> int:
        """The first watch of a class, and every watch of an async one: refuse a class that
        compares by value; mark an async operation; return its state."""
        cls = type(op)
        if cls not in self._checked_types:
            _check_identity_semantics(cls)
            self._checked_types.add(cls)
        if cls._is_async:
            return op._watched_as_async()
        self._sync_types.add(cls)
        return op._state

    def _ended_before_registration(self, op: Op) -> bool:
        """`op` completed in its first try, or that try shut the purgatory down (which cancels
        it): it never settles through `_settled`, so it is counted here. Returns what the
        watch call returns."""
        if op._state & FINISHED:
            self._completed += 1
            if self._log is not None:
                self._record_end(op, "completed")
            return True
        op._cancel(closed=True)
        self._cancelled += 1
        if self._log is not None:
            self._record_end(op, "cancelled")
        return False

    if TYPE_CHECKING:

        def _accept(self, op: Op, /) -> Op: ...

    async def watch(
        self: _Accepting[Op, DelayedOperation[T]],
        op: Op,
        keys: Iterable[Hashable] | Mapping[Hashable, Any],
    ) -> T:
        """`try_complete_else_watch`, then wait for the outcome: the call a handler awaits.

        Returns:
            `on_complete`'s value, on completion and on expiry alike (see ``op.is_expired``).

        Raises:
            OperationCancelled: The operation was cancelled (`PurgatoryClosed` by a shutdown).
            asyncio.CancelledError: This task was cancelled; the operation is cancelled with it.
            BaseException: What `on_complete` raised, or what `try_complete_else_watch` raises.
        """
        if getattr(op, "_future", True) is None:
            op._expect_awaiter()
        if TYPE_CHECKING:
            assert isinstance(self, DelayedOperationPurgatory)
        if self.try_complete_else_watch(op, keys):
            return op._outcome()  # type: ignore[no-any-return]
        # `await op`, unrolled: this is the hot path of every parked request.
        while not op._state & FINISHED:
            future = op._future
            if future.done():
                future = op._renew_future()
            try:
                await future
            except CancelledError:
                if cancelled_here(future):
                    op._cancel()
                    raise
            except BaseException:
                op._cancel()
                raise
        return op._outcome()  # type: ignore[no-any-return]

    # help() and the API reference show the signature a caller reads, not the self-type that
    # lets the type checker tie `await watch(op)` to `op`'s result type.
    watch.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter("op", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Op"),
            inspect.Parameter(
                "keys",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation="Iterable[Hashable] | Mapping[Hashable, Any]",
            ),
        ],
        return_annotation="T",
    )

    def check_and_complete(self, key: Hashable, reached: Any = None) -> int:
        """Re-try the operations watching `key`; return how many completed in this call.

        Kafka: ``checkAndComplete``. Operations found already finished are dropped from the list
        and not counted; an unknown key creates nothing. A `try_complete` that raises is reported
        to the loop's exception handler and the others are still tried. Async attempts start (or
        are marked to run once more) and finish later, in tasks of their own.

        Args:
            key: The key whose watchers to re-try.
            reached: ``None`` (Kafka's meaning): re-try every watcher of `key`. Otherwise the
                value `key` has reached: only the watchers at a threshold ``<= reached`` are
                re-tried, in threshold order, after the key's plain watchers; the others are not
                touched. A watcher whose threshold was reached but whose `try_complete` said no
                stays and is re-tried by every later trigger of the key.

        Raises:
            RuntimeError: Called outside the thread of the event loop the purgatory is bound to
                (use `check_and_complete_threadsafe`), or a loop-clock purgatory used outside
                any running loop.

        Runtime complexity: O(operations re-tried) plus their `try_complete` calls, and
        O(log n) per threshold reached.
        """
        if get_ident() != self._owner_thread:
            self._check_thread()
        return self._lists.trigger(key, reached, self._attempt)

    def check_and_complete_threadsafe(self, key: Hashable, reached: Any = None) -> None:
        """`check_and_complete` from any thread: scheduled on the loop this purgatory is bound to.

        Nothing is returned (the count is only known later, on the loop); an error inside the
        call goes to the loop's exception handler.

        Raises:
            RuntimeError: The purgatory was never used inside a running event loop (it binds to
                the running loop on its first call from one), or that loop is closed (the
                trigger is not delivered).
        """
        loop = self._loop
        if loop is None:
            raise RuntimeError(
                f"purgatory {self._name!r} is not bound to an event loop yet: it binds to the "
                "running loop the first time it is called from inside one (watch, "
                "try_complete_else_watch, check_and_complete)"
            )
        try:
            loop.call_soon_threadsafe(self.check_and_complete, key, reached)
        except RuntimeError as exc:
            if not loop.is_closed():
                raise
            raise RuntimeError(
                f"purgatory {self._name!r} is bound to an event loop that is closed; the trigger "
                f"for {key!r} was not delivered"
            ) from exc

    def cancel_for_key(self, key: Hashable) -> list[Op]:
        """Drop `key`'s watcher list and cancel its pending operations; return those.

        Kafka: ``cancelForKey``. Cancelled operations leave the timer at once, never complete nor
        expire, and their awaiters get `OperationCancelled`. Unknown key: ``[]``.

        Raises:
            RuntimeError: Called outside the thread of the event loop the purgatory is bound to
                (from another thread: ``loop.call_soon_threadsafe(purgatory.cancel_for_key,
                key)``).

        Runtime complexity: O(operations on the key's list).
        """
        if self._owner_thread is not None and get_ident() != self._owner_thread:
            self._bind_loop()  # refuses a foreign thread while the purgatory's loop runs
        return self._lists.cancel_key(key, _cancel)

    def watched(self) -> int:
        """Entries over all watcher lists (an operation on 3 keys counts 3), unpurged included.

        Kafka: ``watched`` / gauge ``PurgatorySize``. Runtime complexity: O(1).
        """
        return self._lists.entries

    def num_delayed(self) -> int:
        """Operations in the timer. Kafka: ``numDelayed`` / ``NumDelayedOperations``. O(1)."""
        return self._delayed

    def purge(self) -> int:
        """Remove every finished operation from the watcher lists now; return entries removed.

        The purge otherwise runs by Kafka's rule (``purge_interval``) on a timer pass; call this
        to bring `watched` down to the pending operations on demand, for a gauge or a test.

        Raises:
            RuntimeError: Called outside the thread of the event loop the purgatory is bound to.

        Runtime complexity: O(keys of the operations finished since the last purge).
        """
        if self._owner_thread is not None and get_ident() != self._owner_thread:
            self._bind_loop()
        self._reset_estimate()
        self._purging = False
        return self._lists.purge(None)

    def statistics(self) -> PurgatoryStatistics:
        """A snapshot of the gauges and counters."""
        next_tick = self._wheel.next_deadline()
        if next_tick == math.inf:
            next_in = math.inf
        else:
            now = self._current_time()
            next_in = max(0.0, next_tick * self._tick - now) if now is not None else 0.0
        lists = self._lists
        return PurgatoryStatistics(
            watched=lists.entries,
            delayed=self._delayed,
            keys=len(lists),
            completed=self._completed,
            expired=self._expired,
            cancelled=self._cancelled,
            purged=lists.purged,
            timer_passes=self._passes,
            purges=self._purges,
            next_deadline_in=next_in,
        )

    @property
    def closed(self) -> bool:
        """``True`` once `shutdown` has begun."""
        return self._closed

    async def shutdown(self) -> None:
        """Stop the reaper and cancel every pending operation; idempotent.

        Awaiters of the pending operations get `PurgatoryClosed`; no callback runs. Later
        watches raise `PurgatoryClosed`. The event log, if any, is flushed.
        """
        if not self._closed:
            self._closed = True
            pending = list(self._wheel)
            pending.extend(self._lists.drain())
            for due in self._in_flight:
                pending.extend(due)
            for op in pending:
                op._cancel(closed=True)
            # A fresh wheel: a cascade under way would otherwise keep its entries referenced.
            self._wheel = TimingWheel(self._wheel.wheel_size, self._wheel.current_tick)
            self._delayed = 0
            self._attempts.close()
            if self._log is not None:
                try:
                    self._log.flush()
                except Exception as exc:  # noqa: BLE001 - reported; the shutdown goes on
                    self._report_log_failure("flush", exc)
        if self._reaper is not None:
            await self._reaper.stop()

    async def __aenter__(self) -> DelayedOperationPurgatory[Op]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

    # -- driver interface ---------------------------------------------------------------------

    def _run_timer_pass(self, now: float) -> int:
        """Expire what is due at `now` (seconds), then purge if due; return how many expired.

        This is what the reaper runs on the loop's clock and what a driven clock's ``advance``
        runs. On the loop, a cascade moves a slice per pass and a purge a slice per pass; a
        driven clock has no loop to yield to, so it does both whole.
        """
        if self._closed:
            return 0
        self._passes += 1
        sliced = self._reaper is not None
        due = self._wheel.advance(
            _floor(now / self._tick + _TICK_SLACK), CASCADE_SLICE if sliced else None
        )
        expired = 0
        if due:
            taken = len(due)
            self._delayed -= taken
            self._owed += taken
            expired = self._expire(due)
        if self._purging or self._owed > self._purge_interval:
            if not self._purging:
                self._purging = True
                self._reset_estimate()
            if self._lists.purge(PURGE_SLICE if sliced else None):
                self._purges += 1
            self._purging = bool(self._purge_queue)
        return expired

    def _reset_estimate(self) -> None:
        """Kafka's ``estimated = numDelayed`` as a purge starts. Operations a timer pass under
        way took from the wheel but has not expired yet still count: they finish after this
        purge, so the next one must see them."""
        self._owed = sum(map(len, self._in_flight))

    def _expire(self, due: list[Op]) -> int:
        """Expire the pending operations of `due` (see `expire_due`); if a callback interrupts
        the pass, what was not expired yet stays due for the next one."""
        in_flight = self._in_flight
        in_flight.append(due)
        expired = 0
        try:
            expired = expire_due(
                due, self._purge_queue, None if self._log is None else self._record_expired
            )
        except BaseException:
            expired = sum(1 for op in due if op._state & EXPIRED)
            if not self._closed:
                wheel = self._wheel
                for op in due:
                    if not op._state & FINISHED:
                        wheel.add(op, op._deadline)
                        self._delayed += 1
                        self._owed -= 1
            raise
        finally:
            in_flight.pop()
            self._expired += expired
        return expired

    def _next_timer_pass(self) -> float:
        """The tick at which a timer pass next has work; ``math.inf`` if none."""
        if self._purging or self._owed > self._purge_interval:
            return self._wheel.current_tick
        return self._wheel.next_deadline()

    def _next_timer_pass_at(self) -> float:
        """`_next_timer_pass` in seconds of the clock (the `Expirable` protocol)."""
        return self._next_timer_pass() * self._tick

    def _next_deadline(self) -> float:
        """The tick at which a timed operation next needs the timer; ``math.inf`` if none."""
        return self._wheel.next_deadline()

    def _settled(self, op: Op, outcome: Settlement, /) -> None:
        """The operation protocol's one call: the registered `op` completed or was cancelled.

        Out of the timer at once (O(1)), counted, queued for the purge if still listed, told to
        the event log. Runs before the operation's callbacks (update state first).
        """
        bucket = op._bucket
        if bucket is not None:  # out of the timer, by the timer-entry protocol (`TimerEntry`)
            del bucket[op]
            op._bucket = None
            self._delayed -= 1
            self._owed += 1
            if self._owed > self._purge_interval:
                self._purge_due()
        if outcome == "completed":
            self._completed += 1
        else:
            self._cancelled += 1
        if op._listed:  # the purge-queue protocol (`purgatory._watchers`)
            self._purge_queue[op] = None
        if self._log is not None:
            self._record_end(op, outcome)

    def _purge_due(self) -> None:
        """Kafka's purge rule holds: have the reaper run a pass (a driven clock's next one).

        A reaper whose task ended is not brought back for a purge alone (it comes back when an
        operation falls due): during a loop's wind-down that would start a task on a closing loop.
        """
        # (Every completion calls this while a purge is owed: the cheap tests first.)
        alarm = self._alarm
        if alarm is None:
            return
        wake = alarm.wake_tick
        if wake == _RUNNING:  # the reaper is in a pass, or a driven clock will ask at its next move
            return
        tick = self._wheel.current_tick
        if tick < wake and alarm.alive:
            alarm.wake_by(tick)

    # -- the event log ------------------------------------------------------------------------

    def _record_watch(
        self, op: Op, keys: tuple[Hashable, ...], marks: dict[Hashable, Any] | None
    ) -> None:
        log = self._log
        assert log is not None
        now = self._time()
        thresholds = None if marks is None else tuple(marks.values())
        if thresholds is not None and thresholds.count(None) == len(thresholds):
            thresholds = None
        try:
            log.record_watch(self._name, op, keys, thresholds, now, now + op._timeout)
        except Exception as exc:  # noqa: BLE001 - reported; the operation must not suffer
            self._report_log_failure("record_watch", exc)

    def _record_end(self, op: Op, outcome: Outcome) -> None:
        log = self._log
        assert log is not None
        try:
            log.record_end(self._name, op, outcome, self._time())
        except Exception as exc:  # noqa: BLE001 - reported; the operation settles all the same
            self._report_log_failure("record_end", exc)

    def _record_expired(self, op: Op) -> None:
        self._record_end(op, "expired")

    def _report_log_failure(self, call: str, exc: Exception) -> None:
        """An event log that raises is reported, never allowed to strand an operation."""
        report_exception(
            f"the event log of purgatory {self._name!r} failed ({call}); the operations go on, "
            "what it could not record is lost to the log",
            exc,
            event_log=self._log,
        )

    def _check(self) -> None:
        """Raise ``AssertionError`` if the purgatory's parts disagree (each checks itself too).

        Checked beside the wheel's and the lists' own invariants: every timed operation is
        pending and ours; every pending operation on a list is ours and timed (or its watch is
        under way); the operation protocol's fields agree with the state; a driven clock's
        alarm is not later than the next pass that has work (or that pass would be skipped).
        """
        alarm = self._alarm
        if self._driven and alarm is not None:
            assert alarm.wake_tick <= self._next_timer_pass(), (
                f"alarm at tick {alarm.wake_tick!r}, work due at {self._next_timer_pass()!r}"
            )
        self._wheel._check()
        self._lists._check()
        assert self._delayed == len(self._wheel), (
            f"{self._delayed} delayed, {len(self._wheel)} timed"
        )
        for op in self._wheel:
            assert not op._state & FINISHED, f"finished {op!r} is still timed"
            assert op._owner is self, f"timed {op!r} is not this purgatory's"
        for key, ops in self._lists:
            for op in ops:
                assert op._owner is self, f"{op!r} on {key!r}'s list is not this purgatory's"
                assert not (op._state & EXPIRED and not op._state & DONE)
                if not op._state & FINISHED and not self._in_flight:
                    assert op._bucket is not None, f"pending watched {op!r} is not timed"

    # -- internals ----------------------------------------------------------------------------

    def _now_tick(self, now: float) -> int:
        return _floor(now / self._tick + _TICK_SLACK)

    def _current_time(self) -> float | None:
        clock = self._clock
        return None if clock is None else clock.current_time()

    def _unbound_time(self) -> float:
        raise RuntimeError(f"purgatory {self._name!r} is not bound to an event loop yet")

    def _check_thread(self) -> None:
        """The slow path of the thread check of `check_and_complete`: bind, or refuse."""
        if self._owner_thread is None or self._driven:
            self._bind_loop()
        elif get_ident() != self._owner_thread:
            raise RuntimeError(
                f"purgatory {self._name!r} belongs to the event loop of another thread; from "
                f"this thread call check_and_complete_threadsafe(key) instead"
            )

    def _bind_loop(self) -> None:
        """Bind to the running loop on first use; refuse another loop or another thread.

        A purgatory on the loop's clock stays with its first loop (its reaper and its awaiters
        live there). One with a driven clock follows whichever loop (or none) uses it, one after
        the other: it refuses only a call from another thread while its loop still runs.
        """
        loop = running_loop()
        bound = self._loop
        if self._driven:
            if (
                loop is not bound
                and bound is not None
                and bound.is_running()
                and get_ident() != self._owner_thread
            ):
                raise RuntimeError(
                    f"purgatory {self._name!r} belongs to the event loop of another thread "
                    "while that loop runs; call it from that loop (from other threads: "
                    "check_and_complete_threadsafe or loop.call_soon_threadsafe)"
                )
            # No reaper: a loop only serves threadsafe triggers and async attempts.
            self._loop = loop
            self._owner_thread = get_ident()
            return
        if bound is not None and loop is not bound:
            if loop is None and get_ident() != self._owner_thread:
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
        if self._reaper is not None:
            return
        self._loop = loop
        self._owner_thread = get_ident()
        self._unbound = False
        self._time = loop_time_function(loop)
        self._clock = FunctionClock(self._time)
        self._wheel.advance(self._now_tick(self._time()))
        self._reaper = self._alarm = Reaper(self, loop, self._tick, self._time)

    def _refuse(self, op: Op) -> None:
        """`op`'s watch call failed before registration: it was never watched."""
        if self._log is not None and not op._state & FINISHED:
            self._record_end(op, "refused")

    def _abandon(self, op: Op) -> None:
        """Leave `op` unwatched after its watch call failed once registered: off every list,
        not timed, not ours."""
        self._lists.unregister(op)
        op._owner = None
        self._refuse(op)


def _cancel(op: DelayedOperation[Any]) -> bool:
    """Cancel `op` (the operation protocol's cancel), for `WatcherLists.cancel_key`."""
    return op._cancel()
