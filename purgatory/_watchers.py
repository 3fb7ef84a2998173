"""Watcher lists: which operations a trigger on a key re-tries.

Theory of operation
-------------------
A purgatory maps each watched key to the operations watching it. The value takes the cheapest
shape that serves the key:

- the operation itself, when it is the key's only watcher (most keys of a server with many
  partitions or sessions are like that, and a ``dict`` per key would cost more memory than the
  operation);
- an insertion-ordered ``dict[op, None]`` used as a set, once several watch it (O(1) removal,
  Kafka's order of re-tries);
- a `ThresholdWatchers`, once any operation watches the key *at a threshold*.

Thresholds are the step beyond Kafka. Its ``checkAndComplete(key)`` re-tries every watcher of the
key, yet the common waits are for a number to pass a mark: an acks=all produce waits for the high
watermark to pass its offset, a fetch for the log end to pass ``offset + min_bytes``. A watcher
at a threshold sits in a heap ordered by threshold; ``check_and_complete(key, reached)`` pops the
watchers whose threshold is ``<= reached``, in threshold order, and re-tries only those (and the
plain watchers of the key). A popped watcher whose ``try_complete`` still says no is *released*:
it becomes a plain watcher of the key, re-tried by every later trigger, so it is never lost.

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

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = (
    "ThresholdWatchers",
    "WatcherMap",
    "count_entries",
    "discard",
    "members",
    "register",
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
            # Not comparable with the thresholds already here: the failed push may have left
            # the cell anywhere in the heap, so take it out and restore the heap order.
            del self.cells[op]
            self.heap[:] = [c for c in self.heap if c is not cell]
            heapq.heapify(self.heap)
            raise

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

    def release(self, reached: Any) -> None:
        """Make every operation whose threshold is ``<= reached`` a plain watcher, in order.

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
            plain[op] = None


#: A key's watchers: the operation itself, an ordered set of them, or a `ThresholdWatchers`.
WatcherMap = dict[Hashable, Any]


def register(
    lists: WatcherMap, op: Op, keys: tuple[Hashable, ...], thresholds: tuple[Any, ...] | None
) -> None:
    """Put `op` on the list of every key (at its threshold): all of them, or none.

    A key that cannot be hashed or a threshold that cannot be compared raises after some keys
    were registered; they are taken back before the error propagates, so nothing stays half
    registered.

    Runtime complexity: O(len(keys)), O(log n) more per key watched at a threshold.
    """
    try:
        if thresholds is None:
            for key in keys:
                ops = lists.get(key)
                if ops is None:
                    lists[key] = op
                elif type(ops) is dict:
                    ops[op] = None
                elif type(ops) is ThresholdWatchers:
                    ops.plain[op] = None
                else:
                    lists[key] = {ops: None, op: None}
        else:
            for key, threshold in zip(keys, thresholds, strict=True):
                ops = lists.get(key)
                if threshold is None and ops is None:
                    lists[key] = op
                    continue
                if type(ops) is not ThresholdWatchers:
                    if threshold is None:
                        if type(ops) is dict:
                            ops[op] = None
                        else:
                            lists[key] = {ops: None, op: None}
                        continue
                    plain = {} if ops is None else ops if type(ops) is dict else {ops: None}
                    ops = lists[key] = ThresholdWatchers(plain)
                ops.add(op, threshold)
    except BaseException:
        for key in keys:
            try:
                discard(lists, key, op)
            except Exception:  # noqa: BLE001 - the key that failed to hash fails again
                continue
        raise
    op._listed = len(keys)


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
