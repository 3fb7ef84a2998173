"""`WatcherLists`: every key's watchers, the re-tries a trigger makes, and the purge.

Kafka gives these one owner (its private ``Watchers``: ``tryCompleteWatched``, purge, cancel); so
does this module. `WatcherLists` owns the map of key to watchers and the queue of finished
operations the next purge visits (*when* to purge is `purgatory._purge_rule`); it is the only code
that writes an operation's list fields (``_keys``, ``_listed``, ``_marks``: the watcher-list part of
the operation protocol, see `purgatory._operation`).

Theory of operation
-------------------
A key's watchers take the cheapest shape that serves the key:

- the operation itself, when it is the key's only watcher (most keys of a server with many
  partitions or sessions are like that, and a ``dict`` per key would cost more memory than the
  operation); if it watches the key at a threshold, the threshold is in the operation's own
  ``_marks`` (`purgatory._thresholds.threshold_of` reads them), so a lone watcher costs no
  object at all;
- an insertion-ordered ``dict[op, None]`` used as a set, once several watch it (O(1) removal,
  Kafka's order of re-tries);
- a `ThresholdWatchers`, once several watch it and any of them at a threshold.

An operation's ``_marks`` say at which threshold it waits on each key: ``None`` (a plain watch),
a ``dict`` of key to threshold (a watch given a mapping; the operation's own copy), or one
threshold for all its keys (the ``threshold=`` watch, which copies nothing). Once a key has
several watchers, its `ThresholdWatchers` holds the truth about who was released (released
operations are plain watchers there); for a lone watcher the marks do, and a lone watcher is
released by marking the key ``None`` (its marks become a ``dict`` then).

Finished operations are dropped lazily, as in Kafka: by the trigger that finds them, or by the
purge. Every operation counts the lists that hold it (``_listed``); one that finishes while
listed enters the purge queue, so the purge visits only garbage, never every watched entry.

The purge-queue protocol. The queue (`WatcherLists.queue`) is the one piece of the lists that
code elsewhere writes, by one rule: whoever settles an operation whose ``_listed`` is not zero
appends it to the queue (``queue.append(op)``), before any callback runs. The queue is a
``list`` held by identity: nothing in it calls an operation's ``__hash__`` or ``__eq__`` (a
class may assign them after its first watch: user code, re-entrant), and an operation settles
once, so it is queued at most once. The purgatory's ``_settled`` (a completion or a
cancellation) and the timer pass's expiry loop (`purgatory._operation.expire_due`) append, on
paths that run once per operation and cannot afford a call (the settle also counts the
operation for the purge rule, `PurgeRule.owed`; a timer pass counts those it took). Everything
else about the queue is here. An operation that leaves its last list once queued is taken off
the queue's end if it is the last one queued (a trigger that completes a watcher: its settle
appended it a moment before), and is otherwise left there, dead: the purge skips an entry
whose ``_listed`` is 0, and a slice of it (``purge(limit)``) takes the newest `limit` entries
still listed, dropping the dead ones it meets. The queue's last entry is never dead (what a
removal from its end uncovers goes too), so the queue is empty exactly when no finished
operation is left on a list, as the purge rule reads it (`PurgeRule.after_pass`). Dead entries
are what the queue holds beyond the finished operations still listed (its bound before, the
lists' own garbage); so they stay few, and nothing keeps a finished operation alive long, the
queue is compacted (`_gone`) whenever an operation leaves its last list and the queue
is longer than ``2 * entries + 16``: more than half of it is dead then (each live entry is on a
list), so a compaction costs O(1) per entry dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar, final

from ._asyncio import report_exception, report_false_claim
from ._impl import native, twin
from ._operation import DONE, EXPIRED_NOW, FINISHED
from ._thresholds import ThresholdWatchers, _PyThresholdWatchers, check_orders, threshold_of

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = ("WatcherLists",)

Op = TypeVar("Op", bound="DelayedOperation[Any]")

# Stands in for a key's list when the key has a lone watcher: only ever popped from, never filled.
_NOTHING_TO_POP: dict[Any, None] = {}
_MISSING: Any = object()
# The two kinds of a key's threshold watchers: the pure lists hold the first, the native the other
# (one class on the pure build); a type test accepts either, a container is made by `_Thresholds`.
_THRESHOLDS = (_PyThresholdWatchers, ThresholdWatchers)
_COLLECTIONS = (dict, *_THRESHOLDS)


class _ListsCore:
    """The watcher lists' fields (the native class has them as a C layout: `purgatory._impl`)."""

    __slots__ = (
        "_entries",
        "_lists",
        "_purged",
        "queue",
    )


@final
class WatcherLists(_ListsCore, Generic[Op]):
    """The watcher lists of one purgatory, for all keys, and their purge."""

    __slots__ = ()

    _Thresholds = _PyThresholdWatchers  # a key's (the native lists': the native class)

    def __init__(self) -> None:
        # A key's watchers: the operation, an ordered set or a ThresholdWatchers.
        self._lists: dict[Hashable, Any] = {}
        #: Operations that finished while still on some list (and dead ones: ``_listed`` 0,
        #: skipped), by identity: what the next purge visits.
        self.queue: list[Op] = []
        self._entries = 0
        self._purged = 0

    def __len__(self) -> int:
        """Keys with a watcher list."""
        return len(self._lists)

    @property
    def entries(self) -> int:
        """Entries over all lists, finished ones not purged yet included. O(1)."""
        return self._entries

    @property
    def purged(self) -> int:
        """Entries removed by purges since creation."""
        return self._purged

    def watching(self, key: Hashable) -> list[Op]:
        """The operations on `key`'s list, in re-try order (threshold watchers last)."""
        ops = self._lists.get(key)
        if ops is None:
            return []
        return list(ops) if type(ops) in _COLLECTIONS else [ops]

    # -- registration -------------------------------------------------------------------------

    def check_orders(self, key: Hashable, threshold: Any) -> None:
        """Refuse (`TypeError`) a `threshold` for `key` that does not order against the key's
        thresholds: the slow path of a watch at a threshold that is not an int or a float,
        before anything is tried (see `purgatory._thresholds`)."""
        ops = self._lists.get(key)
        if ops is None or type(ops) is dict:
            return
        if type(ops) in _THRESHOLDS:
            ops.check_orders(threshold, key)
            return
        other = threshold_of(ops, key)  # a lone watcher
        if other is not None:
            check_orders(threshold, other, key)

    # Registration runs once per watch and its per-key loop once per key: inlined on purpose.
    def register(  # noqa: C901, PLR0912, PLR0915
        self, op: Op, keys: tuple[Hashable, ...], marks: Any
    ) -> None:
        """Put `op` on the list of every key of `keys`, or, if that fails, on none.

        `marks` are the operation's thresholds (see the module docstring): ``None`` for a plain
        watch of every key, a ``dict`` of key to threshold (``None``: plain on that key), or one
        threshold for every key. A key given twice is watched once.

        Raises:
            TypeError: A key or a threshold is not hashable, or a threshold does not compare
                with the key's others; nothing stays registered.

        Runtime complexity: O(len(keys)), O(log n) more per threshold out of order.
        """
        lists = self._lists
        op._marks = marks
        op._keys = keys
        # Counted from zero and added to at the end: a key's __hash__ / __eq__ may cancel or
        # trigger a key `op` is on already, which counts it off meanwhile.
        op._listed = 0
        listed = len(keys)  # less one per key given twice
        try:
            if marks is None:
                for key in keys:
                    ops = lists.get(key)
                    if ops is None:
                        lists[key] = op
                    elif type(ops) is dict:
                        if op in ops:
                            listed -= 1
                        else:
                            ops[op] = None
                    elif not self._join_plain(key, op, ops):
                        listed -= 1
                op._listed += listed
                self._entries += listed
                return
            mapping = marks if type(marks) is dict else None
            threshold = marks  # (one threshold for every key, unless a mapping was given)
            for key in keys:
                ops = lists.get(key)
                if mapping is not None:
                    threshold = mapping[key]
                    if threshold is None:  # a plain watch of this key
                        if ops is None:
                            lists[key] = op
                        elif type(ops) is dict:
                            if op in ops:
                                listed -= 1
                            else:
                                ops[op] = None
                        elif not self._join_plain(key, op, ops):
                            listed -= 1
                        continue
                if ops is None:
                    lists[key] = op
                elif type(ops) is _PyThresholdWatchers:
                    # ThresholdWatchers.add, inline: a threshold queued in the run or the heap.
                    at = ops.at
                    waiting = at.get(threshold)
                    if waiting is None:
                        run = ops.run
                        heap = ops.heap
                        if not heap and (not run or run[-1] <= threshold):
                            run.append(threshold)
                        else:
                            ops.push(threshold)
                        at[threshold] = op
                    elif waiting is op:
                        listed -= 1
                    elif type(waiting) is list:
                        if op in waiting:
                            listed -= 1
                        else:
                            waiting.append(op)
                    else:
                        at[threshold] = [waiting, op]
                elif type(ops) is self._Thresholds:  # the native lists': its own queue
                    if not ops.add(op, threshold):
                        listed -= 1
                elif ops is op:
                    listed -= 1
                else:
                    self._join_at(key, op, ops, threshold)
        except BaseException:
            for key in keys:
                try:
                    self._discard(key, op)
                except Exception:  # noqa: BLE001 - the key that failed to hash fails again
                    continue
            op._listed = 0
            raise
        op._listed += listed
        self._entries += listed

    def _join_at(self, key: Hashable, op: Op, ops: Any, threshold: Any) -> None:
        """Add `op` at `threshold` to `key`'s watchers `ops`, a lone operation or an ordered
        set, which become a `ThresholdWatchers`."""
        watchers = _grown(ops, key, self._Thresholds)
        watchers.add(op, threshold)
        self._lists[key] = watchers

    def _join_plain(self, key: Hashable, op: Op, ops: Any) -> bool:  # noqa: PLR0911 - a case each
        """Add `op` as a plain watcher of `key`, whose watchers are `ops` (usually not an
        ordered set: its case is inline in `register`); ``False`` if `op` already watched
        `key` (the key was given twice)."""
        if type(ops) is self._Thresholds:
            if ops.holds(op, key):
                return False
            ops.plain[op] = None
            return True
        if ops is op:
            return False
        if ops is None:
            self._lists[key] = op
            return True
        if type(ops) is dict:
            if op in ops:
                return False
            ops[op] = None
            return True
        marks = ops._marks
        if type(marks) is dict:
            # The lookup runs the key's __eq__, user code that may change the key's watchers
            # (cancel them, trigger them): joined as they are after it.
            lone_plain = marks.get(key) is None
            now = self._lists.get(key)
            if now is not ops:
                return self._join_plain(key, op, now)
        else:
            lone_plain = marks is None
        if lone_plain:
            self._lists[key] = {ops: None, op: None}
            return True
        watchers = _grown(ops, key, self._Thresholds)
        watchers.plain[op] = None
        self._lists[key] = watchers
        return True

    def unregister(self, op: Op) -> None:
        """Take `op` off every list it is on and out of the purge queue (a watch that failed)."""
        keys: tuple[Hashable, ...] = op._keys
        for key in keys:
            try:
                if self._discard(key, op):
                    self._entries -= 1
            except Exception:  # noqa: BLE001 - the key that failed to hash fails again
                continue
        op._listed = 0
        self._gone(op)

    # -- the trigger --------------------------------------------------------------------------

    # The trigger's loop runs once per re-tried entry: its steps are inlined on purpose.
    def trigger(  # noqa: C901, PLR0912, PLR0915
        self, key: Hashable, reached: Any, attempt: Callable[[Op], None]
    ) -> int:
        """Re-try `key`'s watchers (those at a threshold ``<= reached`` only, unless it is
        ``None``); return how many completed. Kafka: ``Watchers.tryCompleteWatched``.

        The key's shape says what is re-tried: every watcher of an ordered set, in watch order;
        of a `ThresholdWatchers`, the plain ones and then by threshold, or, given `reached`, the
        plain ones after those its release adds (`ThresholdWatchers.release`); a lone watcher if
        its threshold was reached. Then one loop re-tries them. Finished operations found on the
        list are dropped. An async operation is handed to `attempt` (which starts its attempt or
        marks one pending). A `try_complete` that raises is reported and the others are tried.

        Raises:
            ValueError: `reached` is NaN.

        Runtime complexity: O(operations re-tried) plus their `try_complete` calls.
        """
        if reached is not None and not reached <= reached:  # noqa: PLR0124 - NaN alone
            raise ValueError(f"reached {reached!r} does not order against itself (NaN?)")
        lists = self._lists
        ops = lists.get(key)
        if ops is None:
            return 0
        single: Op | None = None
        candidates: Iterable[Op]
        if type(ops) is dict:
            candidates = list(ops)
            drop = ops.pop
        elif type(ops) is self._Thresholds:
            if reached is None:
                candidates = list(ops)
                drop = partial(ops.pop, key=key)
            else:
                ops.release(reached, self)
                candidates = list(ops.plain)
                drop = ops.plain.pop
        else:
            if reached is not None:
                threshold = threshold_of(ops, key)
                if threshold is not None:
                    if not threshold <= reached:
                        return 0
                    _release_lone(ops, key)
            # The key's only watcher: the pops below find nothing, its entry goes after the loop.
            single = ops
            candidates = (ops,)
            drop = _NOTHING_TO_POP.pop
        completed = 0
        try:
            for op in candidates:
                state = op._state
                if not state:
                    try:
                        claimed = op.try_complete()
                    except Exception as exc:  # noqa: BLE001 - reported; the others go on
                        _report_attempt(op, key, exc)
                        continue
                    except BaseException as exc:
                        if isinstance(exc, KeyboardInterrupt | SystemExit):
                            raise
                        _report_attempt(op, key, exc)
                        continue
                    state = op._state
                    if state & FINISHED:
                        if drop(op, _NOTHING_TO_POP) is None:
                            self._entries -= 1
                            op._listed -= 1
                            if not op._listed:
                                self._gone(op)
                        if state & EXPIRED_NOW == DONE:  # completed, not expired meanwhile
                            completed += 1
                    elif claimed:
                        report_false_claim(op, claimed)
                elif state & FINISHED:
                    if drop(op, _NOTHING_TO_POP) is None:
                        self._entries -= 1
                        op._listed -= 1
                        if not op._listed:
                            self._gone(op)
                else:
                    attempt(op)
        except BaseException:
            self._tidy(key, ops, single)
            raise
        if single is None:
            # Emptied? (`not ops` would call ThresholdWatchers.__len__, a Python call per trigger.)
            plain_keyed = type(ops) is dict
            emptied = not ops if plain_keyed else not (ops.plain or ops.at)  # type: ignore[union-attr]
            if emptied and lists.get(key) is ops:
                del lists[key]
        elif single._state & FINISHED and lists.get(key) is ops:  # (`ops` is `single`)
            del lists[key]  # the common end of a lone watcher's trigger, inlined
            self._entries -= 1
            single._listed -= 1
            if not single._listed:
                self._gone(single)
        else:
            self._tidy(key, ops, single)  # a newcomer may have joined the key meanwhile
        return completed

    def left(self, op: Op) -> None:
        """`op`, finished through another key, left one of its lists as a release found it (see
        `ThresholdWatchers.release`): one entry fewer, off the purge queue once on none."""
        self._entries -= 1
        op._listed -= 1
        if not op._listed:
            self._gone(op)

    def _gone(self, op: Op) -> None:
        """`op` left its last list: off the end of the purge queue if it is the last queued
        (with the dead it uncovers: the end stays live), else left there dead, and the queue
        compacted once mostly dead (the module docstring)."""
        queue = self.queue
        if queue and queue[-1] is op:
            queue.pop()
            while queue and not queue[-1]._listed:
                queue.pop()
        elif len(queue) > 2 * self._entries + 16:  # compacted in place, in order
            queue[:] = [queued for queued in queue if queued._listed]

    def _tidy(self, key: Hashable, ops: Any, single: Op | None) -> None:
        """After a trigger of `key`: drop a finished lone watcher, or the key's emptied list."""
        lists = self._lists
        if single is None:
            if _empty(ops) and lists.get(key) is ops:
                del lists[key]
        elif single._state & FINISHED and self._discard(key, single):
            self._entries -= 1
            single._listed -= 1
            if not single._listed:
                self._gone(single)

    # -- cancel, finish, purge, drain ---------------------------------------------------------

    def cancel_key(self, key: Hashable, cancel: Callable[[Op], bool]) -> list[Op]:
        """Drop `key`'s list; `cancel` each operation on it; return those it cancelled.

        Kafka: ``Watchers.cancel``. The container is emptied before any `cancel` runs, so a
        trigger of the same key that is iterating over it (a callback called this) has nothing
        left to drop a second time.
        """
        ops = self._lists.pop(key, None)
        if ops is None:
            return []
        taken = _take_all(ops)
        self._entries -= len(taken)
        cancelled = []
        for op in taken:
            op._listed -= 1
            if cancel(op):
                cancelled.append(op)
            if not op._listed:
                self._gone(op)
        return cancelled

    def purge(self, limit: int | None) -> int:
        """Drop finished operations from the lists (Kafka ``purgeCompleted``); return entries
        removed. At most `limit` operations (``None``: all); the rest wait for the next call.

        Runtime complexity: O(keys of the operations purged).
        """
        lists = self._lists
        get = lists.get
        purged = 0
        for op in _purge_batch(self.queue, limit):
            if not op._listed:  # dead: it left every list once queued
                continue
            for key in op._keys:
                # _discard(key, op), its two common shapes inlined: the purge visits every
                # operation that finished on a list, so this runs once per such entry.
                ops = get(key)
                if ops is op:
                    del lists[key]
                    purged += 1
                elif type(ops) is dict:
                    if op in ops:
                        del ops[op]
                        purged += 1
                        if not ops:
                            del lists[key]
                elif type(ops) is _PyThresholdWatchers:
                    # ThresholdWatchers.pop, its common case inlined: alone at its threshold.
                    marks = op._marks
                    threshold = marks.get(key) if type(marks) is dict else marks
                    at = ops.at
                    if threshold is not None and at.get(threshold) is op:
                        del at[threshold]
                        ops.dead += 1
                        if ops.dead > (len(ops.run) + len(ops.heap)) >> 1:
                            ops.compact()
                    elif ops.pop(op, _MISSING, key) is _MISSING:
                        continue
                    purged += 1
                    if not (ops.plain or at):
                        del lists[key]
                elif type(ops) is self._Thresholds:  # the native lists': its own queue
                    purged += self._discard(key, op)
            op._listed = 0
        self._purged += purged
        self._entries -= purged
        return purged

    def drain(self) -> list[Op]:
        """Empty every list (a shutdown): return the operations that were on them, once each
        per list, and forget everything."""
        taken: list[Op] = []
        for ops in self._lists.values():
            taken.extend(_take_all(ops))
        self._lists.clear()
        self.queue.clear()
        self._entries = 0
        for op in taken:
            op._listed = 0
        return taken

    def _discard(self, key: Hashable, op: Op) -> bool:
        """Take `op` off `key`'s list (dropping the key once empty); ``False`` if not on it."""
        lists = self._lists
        ops = lists.get(key)
        if ops is op:
            del lists[key]
            return True
        if type(ops) is dict:
            if op not in ops:
                return False
            del ops[op]
            if not ops:
                del lists[key]
        elif type(ops) is self._Thresholds:
            if ops.pop(op, _MISSING, key) is _MISSING:
                return False
            if not (ops.plain or ops.at):
                del lists[key]
        else:
            return False
        return True

    def __iter__(self) -> Iterator[tuple[Hashable, list[Op]]]:
        """Each key with its operations (for invariant checks and debugging)."""
        for key in self._lists:
            yield key, self.watching(key)

    def _check(self) -> None:
        """Raise ``AssertionError`` if the lists, the counts and the purge queue disagree.

        Checked: no list is empty; each operation on a list names the key and counts the lists
        that hold it; the entry count is right; every finished operation still on a list is
        queued for the purge, once; what the queue holds beyond them is dead (finished, on no
        list, ``_listed`` 0), and not at its end; threshold containers are consistent. By
        identity throughout: an operation's ``__hash__`` and ``__eq__`` are not called.
        """
        assert not self.queue or self.queue[-1]._listed, "the purge queue ends with a dead entry"
        queued: dict[int, int] = {}
        for op in self.queue:
            assert op._state & FINISHED, f"{op!r} queued for the purge but not finished"
            if op._listed:
                assert id(op) not in queued, f"{op!r} queued twice for the purge"
                queued[id(op)] = 1
        held: dict[int, int] = {}
        by_id: dict[int, Op] = {}
        entries = 0
        for key, ops in self._lists.items():
            if type(ops) is self._Thresholds:
                ops._check()
                for threshold, waiting in ops.at.items():
                    for op in waiting if type(waiting) is list else [waiting]:
                        assert threshold_of(op, key) == threshold, (
                            f"{op!r} waits at {threshold!r} on {key!r}, its marks say otherwise"
                        )
            members = self.watching(key)
            assert members, f"empty watcher list for {key!r}"
            entries += len(members)
            for op in members:
                held[id(op)] = held.get(id(op), 0) + 1
                by_id[id(op)] = op
                assert key in op._keys, f"{op!r} is on {key!r}'s list but does not watch it"
                if op._state & FINISHED:
                    assert id(op) in queued, f"finished {op!r} on {key!r}'s list, not queued"
        assert entries == self._entries, f"{entries} entries, {self._entries} counted"
        for ident, count in held.items():
            op = by_id[ident]
            assert op._listed == count, f"{op!r} counts {op._listed} lists, is on {count}"
        for op in self.queue:
            if not op._listed:
                assert id(op) not in held, f"{op!r} queued dead but still on a list"


def _purge_batch(queue: list[Any], limit: int | None) -> list[Any]:
    """The operations a purge visits, taken out of the purge `queue`: all of them (``None``, or
    no more than `limit`), or the newest `limit` still listed, newest first, the dead ones met
    on the way dropped (and those the queue's end uncovers: it stays live)."""
    if limit is None or len(queue) <= limit:
        # Copied, then deleted by the count taken: a collection the copy starts may run code
        # that settles into the queue, which stays for the next purge.
        batch = queue[:]  # the usual case: all of it
        del queue[: len(batch)]
        return batch
    batch = []
    while queue and len(batch) < limit:
        op = queue.pop()
        if op._listed:
            batch.append(op)
    while queue and not queue[-1]._listed:
        queue.pop()
    return batch


def _report_attempt(op: Any, key: Hashable, exc: BaseException) -> None:
    report_exception(f"{type(op).__qualname__}.try_complete raised", exc, operation=op, key=key)


def _release_lone(op: Any, key: Hashable) -> None:
    """Make the lone watcher `op` of `key` a plain watcher of it (its threshold was reached)."""
    marks = op._marks
    if type(marks) is dict:
        # A copy: the event log may still hold the watch's own marks, to render them as given.
        op._marks = {**marks, key: None}
    else:  # one threshold for every key: this key's own mark now differs
        op._marks = dict.fromkeys(op._keys, marks)
        op._marks[key] = None


def _empty(ops: Any) -> bool:
    """Whether a key's watchers (an ordered set or a `ThresholdWatchers`) are none."""
    if type(ops) is dict:
        return not ops
    return not (ops.plain or ops.at)


def _grown(ops: Any, key: Hashable, kind: type[ThresholdWatchers[Any]]) -> ThresholdWatchers[Any]:
    """The threshold watchers (of the lists' `kind`) of `key` that hold what the lone or
    ordered-set `ops` held."""
    if type(ops) is dict:
        return kind(ops)
    watchers: ThresholdWatchers[Any] = kind({})
    watchers.add(ops, threshold_of(ops, key))  # one threshold: nothing to compare with
    return watchers


def _take_all(ops: Any) -> list[Any]:
    """The operations of one key's watchers, leaving the container empty."""
    if type(ops) is dict:
        taken = list(ops)
        ops.clear()
        return taken
    if type(ops) in _THRESHOLDS:
        taken = list(ops)
        ops.clear()
        return taken
    return [ops]


_PyWatcherLists = WatcherLists
"""The reference, whole in every process (its keys' threshold watchers `_PyThresholdWatchers`);
`WatcherLists` is the native class where the core is built (made by `purgatory._impl.twin`),
this one otherwise."""

if not TYPE_CHECKING and native is not None:
    WatcherLists = twin(
        _PyWatcherLists,
        native.ListsCore,
        hot=("register", "trigger", "purge"),
        _Thresholds=ThresholdWatchers,
    )
