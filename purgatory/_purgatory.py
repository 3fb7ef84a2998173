"""`DelayedOperationPurgatory`: keyed watcher lists in front of a timer.

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
watchers, the trigger loop, cancel, the purge; `purgatory._watchers`), the `PurgeRule` (Kafka's rule
of when to purge; `purgatory._purge_rule`), the `SystemTimer` (the wheel, its count, ticks and the
expiry passes; `purgatory._timer`), the `LoopBinding` (the loop and thread it belongs to, its
reaper; `purgatory._reaper`) and the operations themselves (`purgatory._operation`, whose docstring
lists which fields of an operation belong to whom). It checks arguments, composes the parts and
counts. An operation reaches it through one call when it settles (`_settled`); everything else goes
from the facade down: a trigger to the lists, then the operation; an expiry from the driver to the
timer, then the wheel.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, final

from ._asyncio import (
    AttemptRunner,
    CancelledError,
    cancelled_here,
    get_ident,
    report_exception,
    report_false_claim,
    running_loop,
)
from ._clock import Alarm, DrivenClock
from ._errors import PurgatoryClosed, PurgatoryFull
from ._events import EventLog, EventSink, Tapper, sink_for, tapped
from ._impl import native, twin
from ._operation import ASYNC, DONE, FINISHED, DelayedOperation, Settlement, expire_due, not_set_up
from ._purge_rule import PurgeRule, _PyPurgeRule
from ._reaper import LoopBinding
from ._statistics import PurgatoryStatistics, read_statistics
from ._timer import SystemTimer, _PySystemTimer
from ._watchers import WatcherLists, _PyWatcherLists

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


def _split_keys(
    keys: Iterable[Hashable] | Mapping[Hashable, Any], lists: WatcherLists[Any]
) -> tuple[tuple[Hashable, ...], Any]:
    """The keys to watch, and their *marks* (see `purgatory._watchers`): ``None`` for a plain
    watch, the one threshold of every key when a mapping gives them all the same one (a single
    key, ``dict.fromkeys``), else the operation's own copy of the mapping of key to threshold.

    Thresholds are checked here, before anything is tried or registered (one that is not an
    int or a float against the key's others in `lists` too).
    """
    if type(keys) is dict or isinstance(keys, Mapping):
        marks = dict(keys)
        uniform: Any = _UNSET  # the threshold every key shares, as far as seen
        for key, threshold in marks.items():
            if uniform is _UNSET:
                uniform = threshold
            elif threshold is not uniform:
                uniform = _MIXED
            kind = type(threshold)  # plain keys, offsets and times pass at once
            if threshold is None or kind is int or (kind is float and threshold == threshold):  # noqa: PLR0124
                continue
            _check_threshold(threshold, key)
            lists.check_orders(key, threshold)
        if uniform is _MIXED or uniform is _UNSET:
            return tuple(marks), marks
        return tuple(marks), uniform  # as `threshold=` keeps it: no copy per operation
    if isinstance(keys, str | bytes):
        raise TypeError(f"keys must be a collection of keys, not the string {keys!r}")
    if not isinstance(keys, Iterable):
        raise TypeError(
            f"keys must be a collection of keys or a mapping of key to threshold, got {keys!r}"
        )
    return tuple(keys), None


_UNSET: Any = object()
_MIXED: Any = object()


def _no_keys() -> ValueError:
    return ValueError("keys is empty: an operation must watch at least one key")


def _full(name: str, max_pending: int) -> PurgatoryFull:
    return PurgatoryFull(f"purgatory {name!r} already delays max_pending={max_pending} operations")


def _beyond_horizon(timeout: float, horizon: float) -> ValueError:
    return ValueError(
        f"timeout {timeout!r} s is beyond the timer's horizon of 2**53 ticks ({horizon:.3g} s); "
        "use a shorter timeout"
    )


def _check_one_threshold(
    threshold: Any, marks: object, keys: Iterable[Hashable], lists: WatcherLists[Any]
) -> None:
    """`threshold=` that is not an int or a float: refused with a mapping, else checked (against
    each key's thresholds in `lists` too)."""
    if marks is not None:
        raise TypeError(
            "threshold= is the one threshold of every key: give the keys as a collection, or "
            "a mapping of key to threshold without threshold="
        )
    _check_threshold(threshold, None)
    for key in keys:
        lists.check_orders(key, threshold)


def _check_threshold(threshold: Any, key: Hashable | None) -> None:
    """Refuse a threshold no watcher could ever be released at, before anything is tried."""
    where = "" if key is None else f" for {key!r}"
    if not threshold <= threshold:  # noqa: PLR0124 - NaN
        raise ValueError(
            f"threshold {threshold!r}{where} does not order against itself (NaN?); a watcher "
            "at it could never be reached"
        )
    try:
        hash(threshold)
    except TypeError:
        raise TypeError(
            f"threshold {threshold!r}{where} is not hashable: thresholds are values that are "
            "hashable and ordered (offsets, numbers, strings, tuples of them)"
        ) from None


def _check_arguments(  # noqa: PLR0917 - the purgatory's arguments, in its order
    name: object,
    purge_interval: object,
    tick: object,
    max_pending: object,
    clock: object,
    event_log: object,
) -> None:
    """A purgatory's arguments, checked before anything is built (see its Raises)."""
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
            raise ValueError(f"max_pending must be >= 1 (or None for no cap), got {max_pending!r}")
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


def _admit_type(op: DelayedOperation[Any], sync_types: set[type]) -> int:
    """The first watch of a class, and every watch of an async one: refuse a class that compares
    by value; mark an async operation; return its state (a synchronous class joins
    `sync_types`, the purgatory's set of the classes whose watch skips this)."""
    cls = type(op)
    _check_identity_semantics(cls)
    if cls._is_async:
        return op._watched_as_async()
    sync_types.add(cls)
    return op._state


def _check_identity_semantics(cls: type) -> None:
    if cls.__hash__ is not object.__hash__ or cls.__eq__ is not object.__eq__:  # type: ignore[comparison-overlap]
        raise TypeError(
            f"{cls.__qualname__} defines __eq__ or __hash__; operations are tracked by identity, "
            "so remove them (for a dataclass, use @dataclass(eq=False))"
        )


class _PurgatoryCore:
    """A purgatory's fields (the native class has them as a C layout: `purgatory._impl`)."""

    __slots__ = (
        "__weakref__",
        "_attempt",
        "_attempts",
        "_binding",
        "_cancelled",
        "_closed",
        "_completed",
        "_lists",
        "_max_pending",
        "_max_timeout",
        "_name",
        "_purge_queue",
        "_rule",
        "_sink",
        "_sync_types",
        "_time_op",
        "_timer",
    )


@final
class DelayedOperationPurgatory(_PurgatoryCore, Generic[Op]):
    """Holds delayed operations until their condition holds or their deadline passes.

    Kafka: ``DelayedOperationPurgatory``. Times are in seconds; the timer counts integer ticks.

    Callbacks may use their own purgatory: ``try_complete``, ``on_complete`` and
    ``on_expiration`` may call `check_and_complete` (re-entrantly, on any key),
    ``force_complete`` of any operation, `try_complete_else_watch` / `watch` of another
    operation, `cancel_for_key`, `purge`, `statistics`, `drain`, `shutdown` (which cancels
    whatever is still pending, the operation being watched or expired included) and
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
        ValueError: An argument is out of range, or the driven clock is past what a timer of
            this tick counts.
        TypeError: An argument has the wrong type.
    """

    __slots__ = ()

    _Lists, _Timer, _Rule = _PyWatcherLists, _PySystemTimer, _PyPurgeRule  # the parts it builds
    _expire_due = staticmethod(expire_due)  # (the native class's: native parts, the C loop)

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
        _check_arguments(name, purge_interval, tick, max_pending, clock, event_log)
        self._name = name
        self._max_pending = max_pending
        # Where the operations' watches and ends go, raw, with no call per event (`_events`).
        self._sink: EventSink | None = None if event_log is None else sink_for(event_log, name)
        self._lists: WatcherLists[Op] = self._Lists()
        # The purge queue of the lists, shared by protocol (see `purgatory._watchers`).
        self._purge_queue = self._lists.queue
        self._completed = 0
        self._cancelled = 0
        self._closed = False
        # The classes met whose try_complete is synchronous: their watch skips `_admit_type`
        # (which adds each to this set of the purgatory's as it first meets it).
        self._sync_types: set[type] = set()
        self._attempts = AttemptRunner()
        self._attempt = self._attempts.attempt
        ended = None if self._sink is None else self._sink.ends
        self._timer: SystemTimer[Op] = self._Timer(
            float(tick),
            wheel_size,
            partial(_unbound_time, name) if clock is None else clock.current_time,
            partial(self._expire_due, purge_queue=self._purge_queue, ended=ended),
            self._after_pass,
        )
        self._rule = self._Rule(self._lists, purge_interval, self._timer, bounded=clock is None)
        # How a watch times its operation: `SystemTimer.add`, or at once once drained.
        self._time_op = self._timer.add
        self._max_timeout = self._timer.max_timeout
        self._binding = LoopBinding(name, self._timer, driven=clock is not None)
        if clock is not None:  # (attached first: the clock refuses a time the timer can't count)
            self._timer.alarm = _checked_alarm(clock.attach(self._timer), clock)
            self._timer.use_clock(clock.current_time)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "draining" if self.draining else "open"
        delayed, keys = self._timer.delayed, len(self._lists)
        return f"<DelayedOperationPurgatory {self._name!r} {state} {delayed=} {keys=}>"

    @property
    def name(self) -> str:
        """The label given at construction."""
        return self._name

    # -- the Kafka API ------------------------------------------------------------------------

    # One path, its steps inlined: on this path a call costs more than a branch.
    def try_complete_else_watch(  # noqa: C901, PLR0912, PLR0915
        self,
        op: Op,
        keys: Iterable[Hashable] | Mapping[Hashable, Any],
        threshold: Any = None,
    ) -> bool:
        """Complete `op` now if it can; otherwise watch it on every key and start its timer.

        Kafka: ``tryCompleteElseWatch``. Tries once; if not complete, registers `op` on every
        key, tries again (a trigger may have come in between), and if still not complete times
        it: due at now + ``op.timeout``. An async `try_complete` is not awaited here: `op` is
        registered and timed, and its attempt starts as a task of its own.

        Args:
            op: An operation never watched before.
            keys: The keys whose `check_and_complete` re-tries `op` (hashables, a collection:
                ``["topic-0"]``, not ``"topic-0"``), or a mapping of key to *threshold* (a
                hashable value ordered against the key's others, offsets typically; ``None``:
                a plain watch of that key): ``check_and_complete(key, reached)`` then re-tries
                `op` once ``reached`` is at least its threshold.
            threshold: One threshold for every key of `keys`: a mapping of equal values,
                without building one.

        Returns:
            ``True`` iff `op` completed inside this call.

        Raises:
            PurgatoryClosed: The purgatory was shut down.
            PurgatoryFull: ``max_pending`` operations are delayed already; nothing registered.
            ValueError: `keys` is empty, `op` was already watched or finished, its timeout is
                beyond the timer's horizon (2**53 ticks), or a threshold is NaN.
            TypeError: `op` is not a set-up `DelayedOperation`, `keys` is a string, a key or a
                threshold is not hashable, thresholds of one key do not compare, or `threshold`
                comes with a mapping; nothing registered.
            RuntimeError: Called outside the thread of the event loop the purgatory is bound to.
            Exception: Whatever a synchronous `try_complete` raised; nothing stays registered.

        Runtime complexity: O(len(keys)) plus two `try_complete` calls (O(log n) more per
        threshold out of order).
        """
        if self._closed:
            raise PurgatoryClosed(f"purgatory {self._name!r} is shut down")
        try:
            state = op._state
            owner = op._owner
        except AttributeError:
            raise not_set_up(op) from None
        if owner is not None or state & FINISHED:
            raise ValueError(f"{op!r} was already watched or finished; watch an operation once")
        if type(op) not in self._sync_types:
            state = _admit_type(op, self._sync_types)
        marks: Any = None
        if type(keys) is not tuple:
            keys, marks = _split_keys(keys, self._lists)
        if threshold is not None:
            kind = type(threshold)  # offsets and times pass at once; the rest is checked
            if marks is not None or not (kind is int or (kind is float and threshold == threshold)):  # noqa: PLR0124
                _check_one_threshold(threshold, marks, keys, self._lists)
            marks = threshold
        if not keys:
            raise _no_keys()
        if op._timeout > self._max_timeout:
            raise _beyond_horizon(op._timeout, self._max_timeout)
        if self._binding.loop is not running_loop():
            self._binding.bind()
        if self._sink is not None:  # the bulk path of the event log: one append, no call
            watches = self._sink.watches
            watches += (op, keys, marks, self._timer.now())
            if len(watches) >= self._sink.limit:
                self._sink.take()
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
        if self._max_pending is not None and self._timer.delayed >= self._max_pending:
            self._refuse(op)
            raise _full(self._name, self._max_pending)
        # Registration: on every key or, if a key cannot be hashed or a threshold compared, on
        # none. From here on the operation settles through `_settled`.
        try:
            self._lists.register(op, keys, marks)
        except BaseException:
            self._refuse(op)
            raise
        if op._state & FINISHED or self._closed:
            return self._ended_in_registration(op)
        op._owner = self
        try:
            if state & ASYNC:
                self._attempt(op)
            else:
                claimed = op.try_complete()
                if op._state & FINISHED:
                    self._rule.owed += 1  # registered, never timed (the purge-queue protocol)
                    if self._rule.due():
                        self._timer.request_pass()
                    return True
                if claimed:
                    report_false_claim(op, claimed)
                if self._closed:  # the attempt shut the purgatory down
                    return False
            self._time_op(op)
        except BaseException as exc:
            self._abandon(op)
            if isinstance(exc, ValueError | TypeError | OverflowError):
                self._timer.check_clock()  # a clear error if the clock's time was the cause
            raise
        return False

    def _ended_before_registration(self, op: Op) -> bool:
        """`op` ended in its first try (completed, or cancelled by a shutdown it made), before
        any `_settled`: counted here. Returns what the watch call returns."""
        completed = bool(op._state & DONE)  # (a shutdown in a key's hash may have cancelled it)
        if completed:
            self._completed += 1
        else:
            op._cancel(closed=True)
            self._cancelled += 1
        if self._sink is not None:
            outcome = "completed" if completed else "cancelled"
            self._sink.ended(op, outcome, self._timer.current_time())
            self._rule.hold()  # its end holds it: taken within the purge's time bound
        return completed

    def _ended_in_registration(self, op: Op) -> bool:
        """A key's ``__hash__`` or ``__eq__`` (or a threshold's comparison) completed `op` or
        shut the purgatory down while `op` was being registered, before it had an owner (so no
        `_settled` counted it): it leaves the lists and ends as if before registration, the
        reference both builds share."""
        if self._closed:  # the lists were drained under the registration: drained again
            self._lists.drain()
        else:
            self._lists.unregister(op)
        return self._ended_before_registration(op)

    if TYPE_CHECKING:

        def _accept(self, op: Op, /) -> Op: ...

    async def watch(
        self: _Accepting[Op, DelayedOperation[T]],
        op: Op,
        keys: Iterable[Hashable] | Mapping[Hashable, Any],
        threshold: Any = None,
    ) -> T:
        """`try_complete_else_watch`, then wait for the outcome: the call a handler awaits.

        Args:
            op: An operation never watched before.
            keys: The keys whose triggers re-try `op`, or a mapping of key to threshold.
            threshold: One threshold for every key of `keys`.

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
        if self.try_complete_else_watch(op, keys, threshold):
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

    def check_and_complete(self, key: Hashable, reached: Any = None) -> int:
        """Re-try the operations watching `key`; return how many completed in this call.

        Kafka: ``checkAndComplete``. Finished operations found on the list are dropped, not
        counted; an unknown key creates nothing. A `try_complete` that raises is reported to the
        loop's exception handler, and the others are tried. Async attempts start (or are marked
        to run once more) and finish later, in tasks of their own.

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

        Runtime complexity: O(operations re-tried) plus their `try_complete` calls (and
        O(log n) per threshold out of order).
        """
        if get_ident() != self._binding.thread:
            self._binding.check_thread()
        return self._lists.trigger(key, reached, self._attempt)

    def check_and_complete_threadsafe(self, key: Hashable, reached: Any = None) -> None:
        """`check_and_complete` from any thread: scheduled on the loop this purgatory is bound to
        (what it returns is known only there; an error there goes to its exception handler).

        Args:
            key: The key whose watchers to re-try.
            reached: The value `key` has reached, as for `check_and_complete`.

        Raises:
            RuntimeError: The purgatory was never used inside a running event loop (it binds to
                the running loop on its first call from one), or that loop is closed (the
                trigger is not delivered).
        """
        self._binding.call_soon_threadsafe(
            f"the trigger for {key!r}", self.check_and_complete, key, reached
        )

    def cancel_for_key(self, key: Hashable) -> list[Op]:
        """Drop `key`'s watcher list and cancel its pending operations; return those.

        Kafka: ``cancelForKey``. Cancelled operations leave the timer at once, never complete nor
        expire, and their awaiters get `OperationCancelled`. Unknown key: ``[]``. Runtime
        complexity: O(operations on the key's list).

        Args:
            key: The key whose watcher list to drop.

        Raises:
            RuntimeError: Called outside the thread of the event loop the purgatory is bound to
                (from another: ``loop.call_soon_threadsafe(purgatory.cancel_for_key, key)``).
        """
        self._binding.check_caller()
        return self._lists.cancel_key(key, _cancel)

    def watched(self) -> int:
        """Entries over all watcher lists (an operation on 3 keys counts 3), unpurged included:
        memory, not what is parked (`num_delayed`). Kafka: ``watched`` / ``PurgatorySize``. O(1).
        """
        return self._lists.entries

    def num_delayed(self) -> int:
        """Operations in the timer: parked now. Kafka: ``numDelayed`` /
        ``NumDelayedOperations``. O(1)."""
        return self._timer.delayed

    def purge(self) -> int:
        """Remove every finished operation from the watcher lists now; return entries removed.

        The purge otherwise runs by Kafka's rule (``purge_interval``) on a timer pass; call this
        to bring `watched` down to the pending operations on demand, for a gauge or a test.
        Runtime complexity: O(keys of the operations finished since the last purge).

        Raises:
            RuntimeError: Called outside the thread of the event loop the purgatory is bound to.
        """
        self._binding.check_caller()
        self._rule.start(self._timer.in_flight())
        return self._lists.purge(None)

    def statistics(self) -> PurgatoryStatistics:
        """A snapshot of the gauges and counters; it only reads (a gauge may ask from another
        thread, though what it reads there may be a step behind)."""
        return read_statistics(
            self._timer, self._lists, self._rule, self._completed, self._cancelled
        )

    def drain(self, answer: Callable[[Op], object] | None = None) -> int:
        """Answer every parked operation now, and every later one at once: for a shutdown.

        Each pending operation is handed to `answer` (if given), which may complete it its own
        way (``op.force_complete()``, after setting what ``on_complete`` should say); each one
        still pending after that expires now, as at its deadline: ``on_complete``, then
        ``on_expiration``, and its awaiter gets ``on_complete``'s value.

        From then on the purgatory is *draining*: an operation watched later is tried as usual
        and, if it does not complete, expires at the next timer pass (at once on the loop)
        instead of waiting for its timeout, so that requests still arriving are answered too.
        `shutdown` ends it.

        From a server's shutdown signal: ``purgatory.asgi.drain_on_signals``.

        Args:
            answer: Called with each pending operation, in deadline order, before the rest
                expire (``None``: all expire). One that raises is reported as a callback's
                error is, and its operation expires with the rest: the drain goes on.

        Returns:
            How many operations this call answered (completed by `answer` or expired).

        Raises:
            PurgatoryClosed: The purgatory was shut down.
            RuntimeError: Called outside the thread of the event loop the purgatory is bound to.
        """
        if self._closed:
            raise PurgatoryClosed(f"purgatory {self._name!r} is shut down")
        self._binding.check_caller()
        self._time_op = self._timer.add_due
        return self._timer.drain(None if answer is None else partial(_answer_reported, answer))

    @property
    def closed(self) -> bool:
        """``True`` once `shutdown` has begun."""
        return self._closed

    @property
    def draining(self) -> bool:
        """``True`` once `drain` was called (and until `shutdown`)."""
        return self._time_op != self._timer.add and not self._closed

    async def shutdown(self) -> None:
        """Stop the reaper and cancel every pending operation; idempotent.

        Awaiters of the pending operations get `PurgatoryClosed`; no callback runs (`drain`
        first answers them instead). Later watches raise `PurgatoryClosed`. The event log, if
        any, is flushed.
        """
        if not self._closed:
            self._closed = True
            pending = self._timer.close()
            pending.extend(self._lists.drain())
            for op in pending:
                op._cancel(closed=True)
            self._attempts.close()
            if self._sink is not None:
                self._sink.flush()
        await self._binding.stop()

    async def __aenter__(self) -> DelayedOperationPurgatory[Op]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    # -- the parts' calls ---------------------------------------------------------------------

    def _settled(self, op: Op, outcome: Settlement, /) -> None:
        """The operation protocol's one call: the registered `op` completed or was cancelled.

        Out of the timer at once (O(1)), counted, queued for the purge if still listed, told to
        the event log (whose length is checked as operations are watched: ends never outnumber
        watches long). Runs before the operation's callbacks (update state first).
        """
        bucket = op._bucket
        if bucket is not None:  # out of the timer (`SystemTimer`'s removal protocol)
            bucket.remove(op)
            self._timer.delayed -= 1
            rule = self._rule
            rule.owed += 1  # (the purge-queue protocol)
            if rule.owed > rule.trip and rule.due():
                self._timer.request_pass()
        if outcome == "completed":
            self._completed += 1
        else:
            self._cancelled += 1
        if op._listed:  # the purge-queue protocol (`purgatory._watchers`)
            self._purge_queue.append(op)
        if self._sink is not None:  # the bulk path of the event log: one extend, no call
            self._sink.ends += (op, outcome, self._timer.now())
            if self._sink.eager:
                self._sink.take()

    def _after_pass(self, taken: int, budget: int | None) -> bool:
        """After each timer pass: the purge rule's slice, and the event sink's batch when due."""
        return self._rule.after_pass(taken, budget, self._timer.in_flight, self._sink)

    def _tap(self, tap: Tapper) -> None:
        """Hand the operations' events to `tap` too, batch by batch (`purgatory._histograms`)."""
        sink = self._sink = tapped(self._sink, self._name, tap)
        sink.each_pass = self._binding.driven  # no time bound takes the batches of a driven clock
        expire = partial(self._expire_due, purge_queue=self._purge_queue, ended=sink.ends)
        self._timer.expire_with(expire)

    # -- internals ----------------------------------------------------------------------------

    def _refuse(self, op: Op) -> None:
        """`op`'s watch call failed before registration: it was never watched."""
        if self._sink is not None and not op._state & FINISHED:
            self._sink.ended(op, "refused", self._timer.current_time())
            self._rule.hold()

    def _abandon(self, op: Op) -> None:
        """Leave `op` unwatched after its watch call failed once registered: off every list,
        out of the timer if timing it is what failed (a driver's alarm that raised), not ours."""
        self._lists.unregister(op)
        if op._bucket is not None:
            self._timer.discard(op)
        op._owner = None
        self._refuse(op)


# help() and the API reference show the signature a caller reads, not the self-type that
# lets the type checker tie `await watch(op)` to `op`'s result type.
DelayedOperationPurgatory.watch.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("op", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Op"),
        inspect.Parameter(
            "keys",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation="Iterable[Hashable] | Mapping[Hashable, Any]",
        ),
        inspect.Parameter(
            "threshold", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation="Any"
        ),
    ],
    return_annotation="T",
)


def _checked_alarm(alarm: object, clock: object) -> Alarm | None:
    """What a driven clock's ``attach`` returned: an `Alarm`, or ``None``; anything else is
    refused as the purgatory is built, not at the first watch."""
    if alarm is None or (
        isinstance(getattr(alarm, "wake_tick", None), int | float)
        and callable(getattr(alarm, "wake_by", None))
        and hasattr(alarm, "alive")
    ):
        return alarm  # type: ignore[return-value]
    raise TypeError(
        f"{type(clock).__qualname__}.attach returned {alarm!r}: it must return a "
        "purgatory.Alarm (wake_tick, wake_by, alive) or None"
    )


_PyDelayedOperationPurgatory = DelayedOperationPurgatory
"""The reference, whole in every process: it builds `_PyWatcherLists`, a `_PySystemTimer` and a
`_PyPurgeRule`, and expires with the pure `expire_due`. `DelayedOperationPurgatory` is the native
class where the core is built (made by `purgatory._impl.twin`, its parts the native ones), this
one otherwise."""

if not TYPE_CHECKING and native is not None:
    from ._operation import native_expire_due

    DelayedOperationPurgatory = twin(
        _PyDelayedOperationPurgatory,
        native.PurgatoryCore,
        hot=("try_complete_else_watch", "check_and_complete", "_settled"),
        _Lists=WatcherLists,
        _Timer=SystemTimer,
        _Rule=PurgeRule,
        _expire_due=staticmethod(native_expire_due),
    )

#: Both purgatory classes (one on the pure build), for what takes a purgatory of either.
PURGATORY_TYPES: tuple[type[DelayedOperationPurgatory[Any]], ...] = (
    DelayedOperationPurgatory,
    _PyDelayedOperationPurgatory,
)


def _unbound_time(name: str) -> float:
    """The clock of a purgatory on the loop's clock, until its first use in a loop binds it."""
    raise RuntimeError(f"purgatory {name!r} is not bound to an event loop yet")


def _answer_reported(answer: Callable[[Op], object], op: Op) -> None:
    """`drain`'s `answer` for `op`; what it raises is reported, and the drain goes on."""
    try:
        answer(op)
    except Exception as exc:  # noqa: BLE001 - reported; the operation expires with the rest
        report_exception(
            f"drain's answer raised for {type(op).__qualname__}; it expires with the rest",
            exc,
            operation=op,
        )


def _cancel(op: DelayedOperation[Any]) -> bool:
    """Cancel `op` (the operation protocol's cancel), for `WatcherLists.cancel_key`."""
    return op._cancel()
