"""Watcher lists: which operations a trigger on a key re-tries.

Theory of operation
-------------------
A purgatory maps each watched key to the operations watching it. The value takes the cheapest
shape that serves the key:

- the operation itself, when it is the key's only watcher (most keys of a server with many
  partitions or sessions are like that, and a ``dict`` per key would cost more memory than the
  operation); if it watches the key at a threshold, the threshold is in the operation's own
  ``_marks`` (its key-to-threshold mapping), so a lone watcher costs no object at all;
- an insertion-ordered ``dict[op, None]`` used as a set, once several watch it (O(1) removal,
  Kafka's order of re-tries);
- a `ThresholdWatchers`, once several watch it and any of them at a threshold.

Thresholds are the step beyond Kafka. Its ``checkAndComplete(key)`` re-tries every watcher of the
key, yet the common waits are for a number to pass a mark: an acks=all produce waits for the high
watermark to pass its offset, a fetch for the log end to pass ``offset + min_bytes``. A watcher
at a threshold sits in a heap ordered by threshold; ``check_and_complete(key, reached)`` pops the
watchers whose threshold is ``<= reached``, in threshold order, and re-tries only those (and the
plain watchers of the key). A popped watcher whose ``try_complete`` still says no is *released*:
it becomes a plain watcher of the key, re-tried by every later trigger, so it is never lost. A
lone watcher is released by setting its mark for the key to ``None``.

An operation's ``_marks`` speaks only for the keys on which it is the lone watcher: once a key
has several watchers, the key's `ThresholdWatchers` holds the truth (it took the threshold over
when it grew) and the mark is not read again.

Removal without a scan. Every heap entry is a mutable *cell* ``[threshold, seq, op]``; removing
an operation nulls its cell's ``op`` (so the heap never keeps a finished operation alive) and
counts the cell dead; once dead cells are half the heap it is rebuilt, which is O(1) amortised per
removal. ``seq`` makes cells with equal thresholds pop in watch order and keeps operations out of
the comparisons.

Finished operations are dropped lazily, as in Kafka: by the trigger that finds them, or by the
purge (see `DelayedOperationPurgatory`). Every operation counts the lists that hold it
(``_listed``), so the purgatory can forget it the moment it has left the last one.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar, final

from ._operation import FINISHED

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = (
    "ThresholdWatchers",
    "WatcherMap",
    "count_entries",
    "discard",
    "join_at",
    "join_plain",
    "lone_mark",
    "members",
    "take_all",
    "unregister",
)

Op = TypeVar("Op", bound="DelayedOperation[Any]")

_MISSING: Any = object()


@final
class ThresholdWatchers(Generic[Op]):
    """The watchers of one key of which some watch at a threshold.

    ``plain`` holds the operations tried by every trigger of the key (watched without a
    threshold, or released); ``cells`` maps each operation still waiting for its threshold to its
    heap cell.
    """

    __slots__ = ("cells", "dead", "heap", "plain", "seq")

    def __init__(self, plain: dict[Op, None]) -> None:
        self.plain = plain
        self.cells: dict[Op, list[Any]] = {}
        self.heap: list[list[Any]] = []
        self.dead = 0
        self.seq = 0

    def __len__(self) -> int:
        return len(self.plain) + len(self.cells)

    def __iter__(self) -> Iterator[Op]:
        yield from self.plain
        yield from self.cells

    def __repr__(self) -> str:
        return f"<ThresholdWatchers plain={len(self.plain)} at_threshold={len(self.cells)}>"

    def add(self, op: Op, threshold: Any) -> None:
        """Watch at `threshold` (``None``: plain). O(log n); raises if thresholds don't compare."""
        if threshold is None:
            self.plain[op] = None
            return
        cell = [threshold, self.seq, op]
        self.seq += 1
        self.cells[op] = cell
        try:
            heapq.heappush(self.heap, cell)
        except BaseException:
            self.unpush(op, cell)
            raise

    def unpush(self, op: Op, cell: list[Any]) -> None:
        """Undo a push that raised (thresholds that do not compare): the failed push may have
        left the cell anywhere in the heap, so take it out and restore the heap order."""
        del self.cells[op]
        self.heap[:] = [c for c in self.heap if c is not cell]
        heapq.heapify(self.heap)

    def pop(self, op: Op, default: Any = None) -> Any:
        """Stop watching `op` (the ``dict.pop`` signature the trigger loop uses). O(1) amortised."""
        if self.plain.pop(op, _MISSING) is not _MISSING:
            return None
        cell = self.cells.pop(op, None)
        if cell is None:
            return default
        cell[2] = None
        self.dead += 1
        if self.dead > len(self.heap) >> 1:
            self.heap[:] = [c for c in self.heap if c[2] is not None]
            heapq.heapify(self.heap)
            self.dead = 0
        return None

    def release(self, reached: Any, garbage: dict[Any, None]) -> None:
        """Make every operation whose threshold is ``<= reached`` a plain watcher, in order.

        One that finished meanwhile (through another key) just leaves: this list no longer holds
        it, and once no list does, neither does the purge queue `garbage`.

        Runtime complexity: O((1 + released) * log n).
        """
        heap = self.heap
        plain = self.plain
        cells = self.cells
        while heap and heap[0][0] <= reached:
            cell = heapq.heappop(heap)
            op = cell[2]
            if op is None:
                self.dead -= 1
                continue
            del cells[op]
            if op._state & FINISHED:
                op._listed -= 1
                if not op._listed:
                    garbage.pop(op, None)
            else:
                plain[op] = None


#: A key's watchers: the operation itself, an ordered set of them or a `ThresholdWatchers`.
WatcherMap = dict[Hashable, Any]


def join_at(lists: WatcherMap, key: Hashable, op: Any, ops: Any, threshold: Any) -> None:
    """Add `op` at `threshold` to `key`'s watchers `ops`, which are not empty.

    A key's first watcher is stored as itself by the purgatory, on its hot path, whether it
    watches at a threshold or not (its mark says which); this is where a key shared by several
    watchers takes the shape that knows thresholds. `op` is not already on the key (a mapping's
    keys are distinct). On an error the caller takes back what was registered (`unregister`).

    Raises:
        TypeError: `threshold` does not compare with the key's other thresholds.

    Runtime complexity: O(log n).
    """
    if type(ops) is ThresholdWatchers:
        ops.add(op, threshold)
    else:
        watchers = _grown(ops, key)
        watchers.add(op, threshold)
        lists[key] = watchers


def lone_mark(op: Any, key: Hashable) -> Any:
    """The threshold at which the lone watcher `op` of `key` waits (``None``: plain)."""
    marks = op._marks
    return None if marks is None else marks.get(key)


def join_plain(lists: WatcherMap, key: Hashable, op: Any, ops: Any) -> bool:
    """Add `op` as a plain watcher of `key`, whose watchers `ops` know thresholds (a
    `ThresholdWatchers`, or a lone operation watching `key` at a threshold).

    Returns:
        ``False`` if `op` already watched `key` (the key was given twice).
    """
    if type(ops) is ThresholdWatchers:
        if op in ops.plain or op in ops.cells:
            return False
        ops.plain[op] = None
        return True
    if ops is op:
        return False
    watchers = _grown(ops, key)
    watchers.plain[op] = None
    lists[key] = watchers
    return True


def _grown(ops: Any, key: Hashable) -> ThresholdWatchers[Any]:
    """The `ThresholdWatchers` of `key` that holds what the lone or ordered-set `ops` held."""
    if type(ops) is dict:
        return ThresholdWatchers(ops)
    watchers: ThresholdWatchers[Any] = ThresholdWatchers({})
    watchers.add(ops, lone_mark(ops, key))  # one threshold: nothing to compare with
    return watchers


def unregister(lists: WatcherMap, op: Any, keys: tuple[Hashable, ...]) -> None:
    """Take `op` off every list of `keys` it is on: the undo of a registration that failed."""
    for key in keys:
        try:
            discard(lists, key, op)
        except Exception:  # noqa: BLE001 - the key that failed to hash fails again
            continue


def discard(lists: WatcherMap, key: Hashable, op: Any) -> bool:
    """Take `op` off `key`'s list (dropping the key once empty); ``False`` if it was not on it."""
    ops = lists.get(key)
    if ops is op:
        del lists[key]
        return True
    if type(ops) is dict:
        if op not in ops:
            return False
        del ops[op]
    elif type(ops) is ThresholdWatchers:
        if op not in ops.plain and op not in ops.cells:
            return False
        ops.pop(op)
    else:
        return False
    if not ops:
        del lists[key]
    return True


def take_all(ops: Any) -> list[Any]:
    """The operations of one key's watchers, leaving the container empty.

    A trigger of the same key may be iterating over the container (a callback called
    `cancel_for_key` or `shutdown`): emptied, it has nothing left for that trigger to drop a
    second time.
    """
    taken = list(members(ops))
    if type(ops) is dict:
        ops.clear()
    elif type(ops) is ThresholdWatchers:
        for cell in ops.heap:
            cell[2] = None
        ops.plain.clear()
        ops.cells.clear()
        ops.heap.clear()
        ops.dead = 0
    return taken


def members(ops: Any) -> Iterator[Any]:
    """The operations of one key's watchers, whatever their shape."""
    if type(ops) is dict or type(ops) is ThresholdWatchers:
        yield from ops
    else:
        yield ops


def count_entries(lists: WatcherMap) -> int:
    """Entries over all lists (Kafka's ``watched()``). Runtime complexity: O(keys)."""
    return sum(1 if type(ops) not in _COLLECTIONS else len(ops) for ops in lists.values())


_COLLECTIONS = (dict, ThresholdWatchers)
