"""`DelayedOperationPurgatory`: keyed watcher lists in front of a timing wheel.

Kafka's design, kept: an operation is tried once, registered on each of its keys, tried again
(which closes the race with a trigger that arrived in between) and only then put in the timer.
A trigger on a key (`check_and_complete`) re-tries every operation on that key's list. Completed
operations are left on the lists of their other keys and removed in bulk by a *purge*, run on a
timer pass once enough have piled up (``purge_interval``), because removing them eagerly from
every list would cost more than the rare purge.

Ours, added: the purge visits only the operations that finished since the last one, not every
watched entry, so its cost follows the garbage, not the number of pending operations; on the
event loop it runs in bounded slices, so a burst of garbage never stalls the expirations. A key
watched by a single operation maps to that operation itself, not to a one-entry list: most keys
of a server with many partitions or sessions are like that, and a ``dict`` per key would cost
more memory (about 250 bytes) than the operation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, final

from ._asyncio import (
    CancelledError,
    LoopClock,
    Reaper,
    cancelled_here,
    loop_time_function,
    new_future,
    report_exception,
    running_loop,
)
from ._clock import Clock, DrivenClock
from ._errors import PurgatoryClosed, PurgatoryFull
from ._operation import DONE, EXPIRED, FINISHED, DelayedOperation
from ._wheel import TimingWheel

if TYPE_CHECKING:
    from ._asyncio import AttemptTasks, EventLoop

__all__ = ("DEFAULT_WHEEL_SIZE", "DelayedOperationPurgatory", "PurgatoryStatistics")

T = TypeVar("T")
Op = TypeVar("Op", bound=DelayedOperation[Any])

#: Slots per wheel level. Kafka uses 20; 1024 one-millisecond ticks put every timeout under a
#: second straight into level 0, so such operations never cascade (see benchmarks/RESULTS.md).
DEFAULT_WHEEL_SIZE = 1024

# Deadlines are rounded up and the current time down, each with this slack in ticks, so that
# float noise on a tick boundary neither delays an expiry by a tick nor fires one early.
_TICK_SLACK = 1e-6
_ceil = math.ceil
_floor = math.floor
EXPIRED_NOW = DONE | EXPIRED

# Garbage entries one purge slice removes on the event loop (about a millisecond of work); more
# garbage waits for the next pass, which the reaper runs as soon as the loop has had a turn.
PURGE_SLICE = 4096

# Stands in for a key's list when the key has a lone watcher: only ever popped from, never filled.
_NOTHING_TO_POP: dict[Any, None] = {}
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
    next_deadline_in: float
    """Seconds until the timer next has work (``math.inf`` when nothing is timed)."""


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

    Args:
        name: A label for reprs, the reaper task's name and error messages.
        purge_interval: Purge the watcher lists once more than this many watched operations have
            finished since the last purge (Kafka ``purgeInterval``).
        tick: Length of a timer tick in seconds. Deadlines are rounded up to a tick.
        wheel_size: Slots per timing-wheel level.
        max_pending: Refuse (`PurgatoryFull`) to delay more operations than this; ``None``: no cap.
        clock: ``None`` to follow the running event loop's clock with a reaper coroutine, or a
            `DrivenClock` such as `purgatory.testing.ManualClock` that runs the expirations itself.

    Raises:
        ValueError: An argument is out of range.
        TypeError: An argument has the wrong type.
    """

    __slots__ = (
        "__weakref__",
        "_attempts",
        "_cancelled",
        "_checked_types",
        "_clock",
        "_closed",
        "_completed",
        "_driven",
        "_expired",
        "_garbage",
        "_loop",
        "_max_pending",
        "_name",
        "_passes",
        "_purge_interval",
        "_purged",
        "_reaper",
        "_tick",
        "_time",
        "_watchers",
        "_wheel",
    )

    def __init__(
        self,
        name: str,
        *,
        purge_interval: int = 1000,
        tick: float = 0.001,
        wheel_size: int = DEFAULT_WHEEL_SIZE,
        max_pending: int | None = None,
        clock: DrivenClock | None = None,
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
        self._name = name
        self._purge_interval = purge_interval
        self._tick = float(tick)
        self._max_pending = max_pending
        # A key's watchers: the operation itself if it is the only one, else an ordered set.
        self._watchers: dict[Hashable, Op | dict[Op, None]] = {}
        self._garbage: list[Op] = []
        self._completed = 0
        self._expired = 0
        self._cancelled = 0
        self._purged = 0
        self._passes = 0
        self._closed = False
        self._checked_types: set[type] = set()
        self._attempts: AttemptTasks = set()
        self._loop: EventLoop | None = None
        self._reaper: Reaper | None = None
        self._driven = clock is not None
        self._clock: Clock | None = clock
        # The clock's reading, as a bound method: one call on the hot path.
        self._time: Callable[[], float] = (
            self._unbound_time if clock is None else clock.current_time
        )
        start = 0 if clock is None else self._now_tick(clock.current_time())
        self._wheel = TimingWheel(wheel_size, start)
        if clock is not None:
            clock.attach(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<DelayedOperationPurgatory {self._name!r} {state} delayed={len(self._wheel)} "
            f"keys={len(self._watchers)}>"
        )

    @property
    def name(self) -> str:
        """The label given at construction."""
        return self._name

    # -- the Kafka API ------------------------------------------------------------------------

    def try_complete_else_watch(self, op: Op, keys: Iterable[Hashable]) -> bool:
        """Complete `op` now if it can; otherwise watch it on every key and start its timer.

        Kafka: ``tryCompleteElseWatch``. Tries once; if not complete, registers `op` on every
        key, tries again (a trigger may have come in between), and if still not complete adds it
        to the timer, its deadline being now + ``op.timeout``.

        Args:
            op: An operation never watched before.
            keys: The keys whose `check_and_complete` should re-try `op` (any hashables; a
                collection, not one key: ``["topic-0"]``, not ``"topic-0"``).

        Returns:
            ``True`` iff `op` completed inside this call.

        Raises:
            PurgatoryClosed: The purgatory was shut down.
            PurgatoryFull: ``max_pending`` operations are delayed already; nothing registered.
            ValueError: `keys` is empty, or `op` was already watched or finished.
            TypeError: `op` is not a set-up `DelayedOperation`, or `keys` is a string.
            Exception: Whatever a synchronous `try_complete` raised; nothing stays registered.

        Runtime complexity: O(len(keys)) plus two `try_complete` calls.
        """
        if self._closed:
            raise PurgatoryClosed(f"purgatory {self._name!r} is shut down")
        try:
            state = op._state
            owner = op._purgatory
        except AttributeError:
            raise TypeError(
                f"{type(op).__qualname__} object is not a set-up DelayedOperation (did its "
                "__init__ call super().__init__(timeout)?)"
            ) from None
        if owner is not None or state & FINISHED:
            raise ValueError(f"{op!r} was already watched or finished; watch an operation once")
        cls = type(op)
        if cls not in self._checked_types:
            _check_identity_semantics(cls)
            self._checked_types.add(cls)
        if type(keys) is not tuple:
            if isinstance(keys, str | bytes):
                raise TypeError(f"keys must be a collection of keys, not the string {keys!r}")
            keys = tuple(keys)
        if not keys:
            raise ValueError("keys is empty: an operation must watch at least one key")
        if self._loop is not running_loop() or (self._reaper is None and not self._driven):
            self._bind_loop()
        op._purgatory = self
        if state:  # async try_complete
            return self._watch_async(op, keys)
        try:
            op.try_complete()
        except BaseException:
            op._purgatory = None
            raise
        if op._state & FINISHED:
            return True
        wheel = self._wheel
        if self._max_pending is not None and wheel._size >= self._max_pending:
            self._refuse(op)
        watchers = self._watchers
        for key in keys:
            ops = watchers.get(key)
            if ops is None:
                watchers[key] = op
            elif isinstance(ops, dict):
                ops[op] = None
            else:
                watchers[key] = {ops: None, op: None}
        op._keys = keys
        try:
            op.try_complete()
        except BaseException:
            self._unregister(op, keys)
            raise
        if op._state & FINISHED:
            return True
        due = wheel.add(op, _ceil((self._time() + op._timeout) / self._tick - _TICK_SLACK))
        reaper = self._reaper
        if reaper is not None and due < reaper.wake_tick:
            reaper.wake_by(due)
        return False

    async def watch(self, op: DelayedOperation[T], keys: Iterable[Hashable]) -> T:
        """`try_complete_else_watch`, then wait for the outcome: the call a handler awaits.

        Returns:
            `on_complete`'s value, on completion and on expiry alike (see ``op.is_expired``).

        Raises:
            OperationCancelled: The operation was cancelled (`PurgatoryClosed` by a shutdown).
            asyncio.CancelledError: This task was cancelled; the operation is cancelled with it.
            Exception: What `on_complete` raised, or what `try_complete_else_watch` raises.
        """
        if getattr(op, "_future", True) is None:
            # Created before the first attempt so that an on_complete error raised inside it has
            # an awaiter (this call) and is not also reported as unretrieved.
            op._future = new_future()
        if self.try_complete_else_watch(op, keys):  # type: ignore[arg-type]
            return op._outcome()
        # `await op`, unrolled: this is the hot path of every parked request.
        while not op._state & FINISHED:
            future = op._future
            if future.done():
                future = op._future = new_future()
            try:
                await future
            except CancelledError:
                if cancelled_here(future):
                    op._cancel()
                    raise
            except BaseException:
                op._cancel()
                raise
        return op._outcome()

    def check_and_complete(self, key: Hashable) -> int:
        """Re-try every operation watching `key`; return how many completed in this call.

        Kafka: ``checkAndComplete``. Operations found already finished are dropped from the list
        and not counted; an unknown key creates nothing. A `try_complete` that raises is reported
        to the loop's exception handler and the others are still tried. Async attempts start (or
        are marked to run once more) and finish later.

        Runtime complexity: O(operations on the key's list) plus their `try_complete` calls.
        """
        watchers = self._watchers
        ops = watchers.get(key)
        if ops is None:
            return 0
        if self._loop is None:
            self._bind_loop()
        completed = 0
        single: Op | None
        candidates: Iterable[Op]
        if isinstance(ops, dict):
            single = None
            candidates = list(ops)
        else:
            # The key's only watcher: the pops below find nothing, its entry goes after the loop.
            single = ops
            candidates = (single,)
            ops = _NOTHING_TO_POP
        for op in candidates:
            state = op._state
            if not state:
                try:
                    claimed = op.try_complete()
                except Exception as exc:  # noqa: BLE001 - reported; the other operations go on
                    report_exception(
                        f"{type(op).__qualname__}.try_complete raised", exc, operation=op, key=key
                    )
                    continue
                state = op._state
                if state & FINISHED:
                    ops.pop(op, None)
                    if state & EXPIRED_NOW == DONE:  # completed, not expired meanwhile
                        completed += 1
                elif claimed:
                    report_exception(
                        f"{type(op).__qualname__}.try_complete returned {claimed!r} without "
                        "completing; it must return self.force_complete()",
                        TypeError("try_complete claimed a completion that did not happen"),
                        operation=op,
                    )
            elif state & FINISHED:
                ops.pop(op, None)
            elif op._attempt_async():
                ops.pop(op, None)
                completed += 1
        if single is not None:
            if single._state & FINISHED:
                self._discard(key, single)
        elif not ops and watchers.get(key) is ops:
            del watchers[key]
        return completed

    def check_and_complete_threadsafe(self, key: Hashable) -> None:
        """`check_and_complete` from any thread: scheduled on the loop this purgatory is bound to.

        Raises:
            RuntimeError: The purgatory was never used inside a running event loop.
        """
        loop = self._loop
        if loop is None:
            raise RuntimeError(
                f"purgatory {self._name!r} is not bound to an event loop yet: it binds to the "
                "running loop on first use (watch, try_complete_else_watch, check_and_complete)"
            )
        loop.call_soon_threadsafe(self.check_and_complete, key)

    def cancel_for_key(self, key: Hashable) -> list[Op]:
        """Drop `key`'s watcher list and cancel its pending operations; return those.

        Kafka: ``cancelForKey``. Cancelled operations leave the timer at once, never complete nor
        expire, and their awaiters get `OperationCancelled`. Unknown key: ``[]``.

        Runtime complexity: O(operations on the key's list).
        """
        ops = self._watchers.pop(key, None)
        if ops is None:
            return []
        return [op for op in _members(ops) if op._cancel()]

    def watched(self) -> int:
        """Entries over all watcher lists (an operation on 3 keys counts 3), unpurged included.

        Kafka: ``watched`` / gauge ``PurgatorySize``. Runtime complexity: O(keys).
        """
        return sum(len(ops) if isinstance(ops, dict) else 1 for ops in self._watchers.values())

    def num_delayed(self) -> int:
        """Operations in the timer. Kafka: ``numDelayed`` / ``NumDelayedOperations``. O(1)."""
        return len(self._wheel)

    def statistics(self) -> PurgatoryStatistics:
        """A snapshot of the gauges and counters."""
        next_tick = self._wheel.next_deadline()
        if next_tick == math.inf:
            next_in = math.inf
        else:
            now = self._current_time()
            next_in = max(0.0, next_tick * self._tick - now) if now is not None else 0.0
        return PurgatoryStatistics(
            watched=self.watched(),
            delayed=len(self._wheel),
            keys=len(self._watchers),
            completed=self._completed,
            expired=self._expired,
            cancelled=self._cancelled,
            purged=self._purged,
            timer_passes=self._passes,
            next_deadline_in=next_in,
        )

    @property
    def closed(self) -> bool:
        """``True`` once `shutdown` has begun."""
        return self._closed

    async def shutdown(self) -> None:
        """Stop the reaper and cancel every pending operation; idempotent.

        Awaiters of the pending operations get `PurgatoryClosed`; no callback runs. Later
        watches raise `PurgatoryClosed`.
        """
        if not self._closed:
            self._closed = True
            pending = list(self._wheel)
            for ops in self._watchers.values():
                pending.extend(_members(ops))
            self._watchers.clear()
            self._garbage.clear()
            for op in pending:
                op._cancel(closed=True)
            self._garbage.clear()
            # A fresh wheel: a cascade under way would otherwise keep its entries referenced.
            self._wheel = TimingWheel(self._wheel.wheel_size, self._wheel.current_tick)
            for task in list(self._attempts):
                task.cancel()
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

        This is what the reaper runs on the loop's clock and what ``ManualClock.advance`` runs.
        The expiry of one operation is inlined here (state, then `on_complete`, `on_expiration`,
        then the awaiters) because it is the loop that runs once per expired operation.
        """
        if self._closed:
            return 0
        self._passes += 1
        # On the loop, a cascade moves a slice per pass; a driven clock wants it all at once.
        budget = CASCADE_SLICE if self._reaper is not None else None
        due = self._wheel.advance(_floor(now / self._tick + _TICK_SLACK), budget)
        expired = 0
        finished = self._garbage.append
        index = -1
        try:
            for index, op in enumerate(due):  # noqa: B007 - read in the handler
                state = op._state
                if state & FINISHED:
                    continue
                op._state = state | EXPIRED_NOW
                finished(op)
                expired += 1
                try:
                    op._result = op.on_complete()
                except Exception as exc:  # noqa: BLE001 - delivered to the awaiters
                    op._fail(exc)
                try:
                    op.on_expiration()
                except Exception as exc:  # noqa: BLE001 - reported; the reaper must go on
                    report_exception(
                        f"{type(op).__qualname__}.on_expiration raised", exc, operation=op
                    )
                future = op._future
                if future is not None and not future.done():
                    future.set_result(None)
        except BaseException:
            # Something like KeyboardInterrupt: whatever was not expired stays due (unless a
            # callback finished it meanwhile).
            for op in due[index + 1 :]:
                if not op._state & FINISHED:
                    self._wheel.add(op, op._deadline)
            raise
        finally:
            self._expired += expired
        if len(self._garbage) > self._purge_interval:
            # A driven clock has no loop to yield to, so it purges everything at once.
            self._purge(PURGE_SLICE if self._reaper is not None else None)
        return expired

    def _next_timer_pass(self) -> float:
        """The tick at which a timer pass next has work; ``math.inf`` if none."""
        if len(self._garbage) > self._purge_interval:
            return self._wheel.current_tick
        return self._wheel.next_deadline()

    def _finished(self, op: Op) -> None:
        """Note a watched operation that finished, for the next purge.

        The garbage list holds exactly the operations Kafka's rule counts as
        ``estimatedTotalOperations - numDelayed``, so its length says when a purge is due.
        """
        garbage = self._garbage
        garbage.append(op)
        if len(garbage) > self._purge_interval and self._reaper is not None:
            self._reaper.wake_by(self._wheel.current_tick)

    # -- internals ----------------------------------------------------------------------------

    def _now_tick(self, now: float) -> int:
        return _floor(now / self._tick + _TICK_SLACK)

    def _current_time(self) -> float | None:
        clock = self._clock
        return None if clock is None else clock.current_time()

    def _unbound_time(self) -> float:
        raise RuntimeError(f"purgatory {self._name!r} is not bound to an event loop yet")

    def _bind_loop(self) -> None:
        """Bind to the running loop on first use; refuse another loop when a reaper runs."""
        loop = running_loop()
        if loop is self._loop and (loop is not None or self._driven):
            return
        if self._driven:
            # No reaper: the loop only serves threadsafe triggers and async attempts.
            if loop is not None:
                self._loop = loop
            return
        if loop is None:
            raise RuntimeError(
                f"purgatory {self._name!r} follows the event loop's clock, so it must be used "
                "inside a running loop (or pass clock=purgatory.testing.ManualClock())"
            )
        if self._loop is not None:
            raise RuntimeError(
                f"purgatory {self._name!r} is bound to another event loop (its reaper runs "
                "there); create one purgatory per loop"
            )
        self._loop = loop
        self._clock = LoopClock(loop)
        self._time = loop_time_function(loop)
        self._wheel.advance(self._now_tick(loop.time()))
        self._reaper = Reaper(self, loop, self._tick, self._name)

    def _refuse(self, op: Op) -> NoReturn:
        """Leave `op` unwatched and raise `PurgatoryFull` (the `max_pending` cap)."""
        op._purgatory = None
        raise PurgatoryFull(
            f"purgatory {self._name!r} already delays max_pending={self._max_pending} operations"
        )

    def _register(self, op: Op, keys: tuple[Hashable, ...]) -> None:
        watchers = self._watchers
        for key in keys:
            ops = watchers.get(key)
            if ops is None:
                watchers[key] = op
            elif isinstance(ops, dict):
                ops[op] = None
            else:
                watchers[key] = {ops: None, op: None}
        op._keys = keys

    def _unregister(self, op: Op, keys: tuple[Hashable, ...]) -> None:
        for key in keys:
            self._discard(key, op)
        op._keys = None
        op._purgatory = None

    def _discard(self, key: Hashable, op: Op) -> bool:
        """Take `op` off `key`'s watchers; ``False`` if it was not on them."""
        watchers = self._watchers
        ops = watchers.get(key)
        if ops is op:
            del watchers[key]
            return True
        if isinstance(ops, dict) and op in ops:
            del ops[op]
            if not ops:
                del watchers[key]
            return True
        return False

    def _start_timer(self, op: Op) -> None:
        due = self._wheel.add(op, _ceil((self._time() + op._timeout) / self._tick - _TICK_SLACK))
        reaper = self._reaper
        if reaper is not None and due < reaper.wake_tick:
            reaper.wake_by(due)

    def _watch_async(self, op: Op, keys: tuple[Hashable, ...]) -> bool:
        """The watch of an operation whose `try_complete` is async.

        Its attempt is started before the registration, as with a sync one; if it completes
        without suspending, nothing is registered. If it suspends, the operation is registered
        and timed at once (the attempt's outcome cannot be waited for here), so `max_pending` is
        checked before the attempt; a trigger arriving during the attempt runs one more after it,
        which is what Kafka's second try is for.
        """
        if self._max_pending is not None and len(self._wheel) >= self._max_pending:
            self._refuse(op)
        try:
            if op._attempt_async():
                return True
        except BaseException:
            op._purgatory = None
            raise
        if op._state & FINISHED:
            return True
        self._register(op, keys)
        self._start_timer(op)
        return False

    def _purge(self, limit: int | None) -> None:
        """Drop finished operations from the watcher lists (Kafka ``purgeCompleted``).

        At most `limit` of them (``None``: all): the rest wait for the next timer pass.
        """
        # In place: a timer pass holds the list's append while a nested pass may purge.
        pending = self._garbage
        take = len(pending) if limit is None else min(limit, len(pending))
        garbage = pending[-take:] if take else []
        del pending[len(pending) - take :]
        watchers = self._watchers
        purged = 0
        for op in garbage:
            keys = op._keys
            if keys is None:
                continue
            for key in keys:
                ops = watchers.get(key)
                if ops is op:
                    del watchers[key]
                    purged += 1
                elif isinstance(ops, dict) and op in ops:
                    del ops[op]
                    purged += 1
                    if not ops:
                        del watchers[key]
        self._purged += purged


def _members(ops: T | dict[T, None]) -> Iterable[T]:
    """The operations of one watcher-map value (a lone operation or an ordered set of them)."""
    return ops if isinstance(ops, dict) else (ops,)
