"""`ThresholdWatchers`: one key's watchers when some of them wait for the key to reach a mark.

Thresholds are the step beyond Kafka. Its ``checkAndComplete(key)`` re-tries every watcher of the
key, yet the common waits are for a number to pass a mark: an acks=all produce waits for the high
watermark to pass its offset, a fetch for the log end to pass ``offset + min_bytes``. A watcher
at a threshold waits in a *cell*; ``check_and_complete(key, reached)`` releases the cells whose
threshold is ``<= reached``, in threshold order, and only those (and the key's plain watchers)
are re-tried. A released watcher whose ``try_complete`` still says no stays a plain watcher of
the key, re-tried by every later trigger, so it is never lost.

Two orders, two structures. Offsets mostly arrive in increasing order per key (each produce
request appends after the last, each fetch asks for what follows), so a cell whose threshold is
at least the last one queued goes to the tail of a *run*, a deque sorted by construction, and is
released from its head: O(1) both ways, no heap. A cell that arrives out of order goes to a heap
instead; a release takes from whichever of the two heads is smaller, so the order stays exact.

Removal without a scan. A cell is a mutable list ``[threshold, seq, op]``; removing an operation
nulls its cell's ``op`` (so nothing keeps a finished operation alive) and counts the cell dead;
once dead cells are half of those held, both structures are rebuilt, which is O(1) amortised per
removal. ``seq`` makes cells with equal thresholds leave in watch order and keeps operations out
of the comparisons.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any, Generic, TypeVar, final

__all__ = ("ThresholdWatchers",)

Op = TypeVar("Op")

_MISSING: Any = object()
_heappush = heapq.heappush
_heappop = heapq.heappop


@final
class ThresholdWatchers(Generic[Op]):
    """The watchers of one key of which some watch at a threshold.

    ``plain`` holds the operations tried by every trigger of the key (watched without a
    threshold, or released); ``cells`` maps each operation still waiting for its threshold to its
    cell, which is in ``run`` (thresholds in increasing order) or in ``heap``.
    """

    __slots__ = ("cells", "dead", "heap", "plain", "run", "seq")

    def __init__(self, plain: dict[Op, None]) -> None:
        self.plain = plain
        self.cells: dict[Op, list[Any]] = {}
        self.run: deque[list[Any]] = deque()
        self.heap: list[list[Any]] = []
        self.dead = 0
        self.seq = 0

    def __len__(self) -> int:
        return len(self.plain) + len(self.cells)

    def __iter__(self) -> Iterator[Op]:
        yield from self.plain
        yield from self.cells

    def __contains__(self, op: object) -> bool:
        return op in self.plain or op in self.cells

    def __repr__(self) -> str:
        return f"<ThresholdWatchers plain={len(self.plain)} at_threshold={len(self.cells)}>"

    def add(self, op: Op, threshold: Any) -> None:
        """Watch at `threshold` (``None``: plain).

        Raises:
            TypeError: `threshold` does not compare with the key's other thresholds (nothing
                is added).

        Runtime complexity: O(1) for a threshold at least the last in-order one, else O(log n).
        """
        if threshold is None:
            self.plain[op] = None
            return
        cell = [threshold, self.seq, op]
        run = self.run
        if not run or run[-1][0] <= threshold:
            run.append(cell)
        else:
            heap = self.heap
            try:
                _heappush(heap, cell)
            except BaseException:
                # A push that raised may have left the cell anywhere in the heap.
                heap[:] = [c for c in heap if c is not cell]
                heapq.heapify(heap)
                raise
        self.seq += 1
        self.cells[op] = cell

    def pop(self, op: Op, default: Any = None) -> Any:
        """Stop watching `op` (the ``dict.pop`` signature the trigger loop uses). O(1) amortised."""
        if self.plain.pop(op, _MISSING) is not _MISSING:
            return None
        cell = self.cells.pop(op, None)
        if cell is None:
            return default
        cell[2] = None
        self.dead += 1
        if self.dead > (len(self.run) + len(self.heap)) >> 1:
            self.run = deque(c for c in self.run if c[2] is not None)
            self.heap[:] = [c for c in self.heap if c[2] is not None]
            heapq.heapify(self.heap)
            self.dead = 0
        return None

    def release(self, reached: Any) -> None:
        """Make every operation whose threshold is ``<= reached`` a plain watcher, in order.

        A released operation that finished meanwhile (through another key) is dropped by the
        trigger that called this, never re-tried.

        Runtime complexity: O(1 + released) for in-order cells, O(log n) more per heap cell.
        """
        run = self.run
        heap = self.heap
        plain = self.plain
        cells = self.cells
        if not heap:  # every cell in order: the O(1) path
            while run and run[0][0] <= reached:
                op = run.popleft()[2]
                if op is None:
                    self.dead -= 1
                else:
                    del cells[op]
                    plain[op] = None
            return
        while True:
            if run:
                cell = run[0]
                if heap and heap[0] < cell:
                    if not heap[0][0] <= reached:
                        return
                    cell = _heappop(heap)
                else:
                    if not cell[0] <= reached:
                        return
                    run.popleft()
            elif heap and heap[0][0] <= reached:
                cell = _heappop(heap)
            else:
                return
            op = cell[2]
            if op is None:
                self.dead -= 1
                continue
            del cells[op]
            plain[op] = None

    def clear(self) -> None:
        """Forget every watcher (a key cancelled or drained): no cell keeps an operation alive."""
        for cell in self.cells.values():
            cell[2] = None
        self.plain.clear()
        self.cells.clear()
        self.run.clear()
        self.heap.clear()
        self.dead = 0

    def _check(self) -> None:
        """Raise ``AssertionError`` if the cells, the run and the heap disagree."""
        held = [c for c in self.run if c[2] is not None] + [
            c for c in self.heap if c[2] is not None
        ]
        assert len(held) == len(self.cells), f"{len(held)} live cells, {len(self.cells)} mapped"
        for cell in held:
            assert self.cells.get(cell[2]) is cell, f"cell {cell!r} is not its operation's"
            assert cell[2] not in self.plain, f"{cell[2]!r} both plain and at a threshold"
        dead = len(self.run) + len(self.heap) - len(held)
        assert dead == self.dead, f"{dead} dead cells, {self.dead} counted"
        run = list(self.run)
        assert all(a[0] <= b[0] for a, b in itertools.pairwise(run)), "run out of order"
        for i in range(1, len(self.heap)):
            assert not self.heap[i] < self.heap[(i - 1) >> 1], "heap order broken"
