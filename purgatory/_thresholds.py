"""`ThresholdWatchers`: one key's watchers when some of them wait for the key to reach a mark.

Thresholds are the step beyond Kafka. Its ``checkAndComplete(key)`` re-tries every watcher of the
key, yet the common waits are for a number to pass a mark: an acks=all produce waits for the high
watermark to pass its offset, a fetch for the log end to pass ``offset + min_bytes``. An
operation watching at a threshold waits under that threshold; ``check_and_complete(key,
reached)`` releases the thresholds ``<= reached``, in order, and only their operations (and the
key's plain watchers) are re-tried. A released operation whose ``try_complete`` still says no
stays a plain watcher of the key, re-tried by every later trigger, so it is never lost.

A queue of thresholds, not of operations. ``at`` maps each threshold to the operation waiting
under it (a list once several share it, in watch order); the order is kept over the thresholds
alone, so that the comparisons a queue makes are comparisons of bare values (offsets: C-level
integer or float comparisons), and thresholds must be hashable as well as ordered. Two orders,
two structures: offsets mostly arrive in increasing order per key (each produce request appends
after the last, each fetch asks for what follows), so a threshold at least the last one queued
goes to the tail of a *run*, a deque sorted by construction, released from its head: O(1) both
ways. One that arrives out of order goes to a heap instead, and so does every threshold after it
until the heap is empty again (a key whose order is lost pays a heap, in C, rather than a merge
of two queues in Python at every release); a release takes from whichever head is smaller, so
the order stays exact.

Removal without a scan. Removing an operation deletes it from ``at`` (an operation knows its
threshold for each key: `threshold_of`); its threshold, if no other operation waits under it,
stays queued as a *dead* entry that a release skips and counts off. Once dead entries are half
of those queued, both structures are rebuilt without them, which is O(1) amortised per removal.
Nothing queued refers to an operation, so a removed one is never kept alive.

Thresholds that order against each other. Every threshold of a key is compared with the others,
sooner or later: queued after the run's tail, pushed on the heap, or against the other head as a
trigger releases them. Offsets and times (ints and floats) always compare, and a value of
another type meets at least one of the key's thresholds as it is queued, so a mix of kinds is
refused there. Tuples can compare in part only: ``(1, 5)`` and ``(2, "y")`` order, ``(1, 5)``
and ``(1, "y")`` do not, and such a pair would only meet in a later trigger, which would fail.
So a threshold that is not an int or a float is checked against the key's thresholds before
the watch (`ThresholdWatchers.check_orders`, off the hot path): once against each of them,
or not at all when it has the *shape* of all of them (`shape_of`: the same types at the same
places, which compare whatever the values).

Who does what. The container is the watcher lists' (`purgatory._watchers`), the only code that
touches it: on the pure build the two hot paths, queueing a threshold as an operation registers
and releasing thresholds as a trigger comes, are taken inline there, on the fields below (their
per-entry loops move whole, a call per entry would cost more than the work); the rest is here.
The native core's `ThresholdWatchers` is a C type of its own (purgatory/_csrc/thresholds.c):
the queue is a C ring (the run) and a C heap sifted by `heapq`'s own steps, so that the same
comparisons run in the same order and release in the same order on both builds; ``run`` and
``heap`` read as copies there. This class, `_PyThresholdWatchers`, is the reference, whole.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, final

from ._impl import native, twin
from ._operation import FINISHED

__all__ = ("ThresholdWatchers", "check_orders", "shape_of", "threshold_of")

_heappop = heapq.heappop


class _Lists(Protocol):
    """What a release needs of the watcher lists: to count off an entry that left."""

    def left(self, op: Any, /) -> None: ...


Op = TypeVar("Op")

_MISSING: Any = object()
# The shape of a value whose comparisons depend on more than its type (`shape_of`).
_UNSURE: Any = object()
# Types whose values always order against each other (None only equals None: a tuple comparison
# never reaches ``<`` on two of them).
_SIMPLE = frozenset((int, float, bool, str, bytes, type(None)))


def shape_of(threshold: Any) -> Any:
    """The types that decide whether `threshold` orders against another value: its type, or for
    a tuple the tuple of its items' shapes. Two thresholds of one shape always order against
    each other, unless the shape holds a type whose values may not (``_UNSURE`` then: a
    ``complex``, a class of the user's own)."""
    kind = type(threshold)
    if kind in _SIMPLE:
        return kind
    if kind is tuple:
        shapes = tuple(map(shape_of, threshold))
        return _UNSURE if _UNSURE in shapes else shapes
    return _UNSURE


def check_orders(threshold: Any, other: Any, key: Hashable) -> None:
    """Refuse `threshold` unless it orders against `other`, a threshold of `key` (both ways)."""
    try:
        threshold < other  # noqa: B015 - asked for the error only
        other < threshold  # noqa: B015
    except TypeError as exc:
        raise TypeError(
            f"threshold {threshold!r} for {key!r} does not order against {other!r}, a "
            "threshold the key already has: a key's thresholds must all compare (offsets, "
            "times, or tuples with the same types at the same places)"
        ) from exc


def threshold_of(op: Any, key: Hashable) -> Any:
    """The threshold at which `op` watches `key` (``None``: plain), from its *marks*.

    An operation's ``_marks`` (the watcher lists' field) is ``None`` for a plain watch, a
    ``dict`` of key to threshold for a watch given a mapping, or else the one threshold of every
    key (thresholds are hashable, so never a ``dict``).
    """
    marks = op._marks
    if marks is None:
        return None
    if type(marks) is dict:
        return marks.get(key)
    return marks


class _ThresholdCore:
    """One key's threshold watchers' fields (the native class has them as a C type of its own,
    its queue a C ring and a C heap: `purgatory._impl`)."""

    __slots__ = ("at", "dead", "heap", "plain", "run", "shape")


@final
class ThresholdWatchers(_ThresholdCore, Generic[Op]):
    """The watchers of one key of which some watch at a threshold.

    ``plain`` holds the operations tried by every trigger of the key (watched without a
    threshold, or released); ``at`` maps each threshold still waiting to its operation (or list
    of operations); each of its thresholds is queued in ``run`` (increasing order) or ``heap``;
    ``dead`` counts the queued entries whose threshold has left ``at``.

    The reference, whole, is `_PyThresholdWatchers`. Where the core is built, `ThresholdWatchers`
    is its twin over the C core, which has its own queue (a C ring and a C heap, sifted as
    `heapq` sifts) and its own `add`, `release`, `pop_head`, `pop`, `push`, `unpush`,
    `recount`, `clear` and `compact`; the cold reads (``len``, iteration, ``repr``, `holds`,
    `check_orders`, `_check`) are these functions, which read ``run`` and ``heap`` as copies
    there.
    """

    __slots__ = ()

    def __init__(self, plain: dict[Op, None]) -> None:
        self.plain = plain
        self.at: dict[Any, Any] = {}
        self.run: deque[Any] = deque()
        self.heap: list[Any] = []
        self.dead = 0
        #: The shape (`shape_of`) every threshold queued here has, as `check_orders` last
        #: found; ``None`` while unknown. Only ints and floats join unchecked, and they order
        #: against nothing of another sure shape (their queueing refuses them).
        self.shape: Any = None

    def __len__(self) -> int:
        return len(self.plain) + sum(
            len(waiting) if type(waiting) is list else 1 for waiting in self.at.values()
        )

    def __iter__(self) -> Iterator[Op]:
        """The plain watchers, then those at a threshold in threshold order (watch order within
        one), as a trigger without a value re-tries them; in the order they came if the
        thresholds do not sort (values of a class of the user's own, say): a shutdown or a
        cancel always gets them all."""
        yield from self.plain
        at = self.at
        try:
            order = sorted(at)
        except TypeError:
            order = list(at)
        for threshold in order:
            waiting = at[threshold]
            if type(waiting) is list:
                yield from waiting
            else:
                yield waiting

    def __repr__(self) -> str:
        return f"<ThresholdWatchers plain={len(self.plain)} thresholds={len(self.at)}>"

    def holds(self, op: Op, key: Hashable) -> bool:
        """Whether `op` watches this container's `key`."""
        if op in self.plain:
            return True
        threshold = threshold_of(op, key)
        if threshold is None:
            return False
        waiting = self.at.get(threshold)
        return waiting is op or (type(waiting) is list and op in waiting)

    def check_orders(self, threshold: Any, key: Hashable) -> None:
        """Refuse `threshold` (`TypeError`) unless it orders against every threshold queued
        here (dead ones too: a release still compares them). O(1) when it has the shape of
        all of them, else O(thresholds queued)."""
        shape = shape_of(threshold)
        if shape is not _UNSURE and shape == self.shape:
            return
        queued = {*self.run, *self.heap}
        same = True
        for other in queued:
            check_orders(threshold, other, key)
            same = same and shape_of(other) == shape
        self.shape = shape if same and shape is not _UNSURE else None

    def add(self, op: Op, threshold: Any) -> bool:
        """Watch at `threshold` (``None``: plain); ``False`` if `op` already waited there.

        Raises:
            TypeError: `threshold` is not hashable, or does not compare with the key's other
                thresholds (nothing is added).

        Runtime complexity: O(1) for a threshold at least the last in-order one, else O(log n).
        """
        if threshold is None:
            self.plain[op] = None
            return True
        at = self.at
        waiting = at.get(threshold)
        if waiting is None:
            run = self.run
            if not self.heap and (not run or run[-1] <= threshold):
                run.append(threshold)
            else:
                self.push(threshold)
            at[threshold] = op
        elif waiting is op:
            return False
        elif type(waiting) is list:
            if op in waiting:
                return False
            waiting.append(op)
        else:
            at[threshold] = [waiting, op]
        return True

    # Its loop runs once per threshold released: a call per step would cost more than a branch.
    def release(self, reached: Any, lists: _Lists) -> None:  # noqa: C901, PLR0912
        """Release every threshold ``<= reached``, in order (a trigger with a value): its
        operations become plain watchers of the key, re-tried after the older plain ones,
        except those already finished (through another key), which leave the key on the spot
        (``lists.left``) and are never re-tried.

        Runtime complexity: O(1) per threshold of the run, O(log n) per one of the heap.
        """
        run = self.run
        heap = self.heap
        at = self.at
        plain = self.plain
        # A comparison may run a threshold's own code (a class of the user's), which may cancel
        # or trigger this key: the head compared is taken only if it is still the head, else
        # the loop looks again.
        while True:
            if run:
                threshold = run[0]
                if heap and (top := heap[0]) < threshold:
                    threshold = top
                    if not threshold <= reached:
                        break
                    if not heap or heap[0] is not threshold:
                        continue
                    self.pop_head(threshold, lists)
                else:
                    if not threshold <= reached:
                        break
                    if not run or run[0] is not threshold:
                        continue
                    run.popleft()
            elif heap:
                threshold = heap[0]
                if not threshold <= reached:
                    break
                if not heap or heap[0] is not threshold:
                    continue
                self.pop_head(threshold, lists)
            else:
                break
            waiting = at.pop(threshold, None)
            if waiting is None:
                self.dead -= 1
            elif type(waiting) is list:
                for op in waiting:
                    if op._state & FINISHED:
                        lists.left(op)
                    else:
                        plain[op] = None
            elif waiting._state & FINISHED:
                lists.left(waiting)
            else:
                plain[waiting] = None

    def pop_head(self, threshold: Any, lists: _Lists) -> None:
        """Pop `threshold`, the heap's head, for a release. If the pop's sift raises (a
        threshold's comparison), the head is off the heap already: its operations are released
        all the same before the error propagates, or nothing would release them again (a lost
        wake-up), the heap is ordered again, and the dead entries are counted again (the
        sift's comparison may have cancelled or triggered the key)."""
        try:
            _heappop(self.heap)
        except BaseException:
            try:
                waiting = self.at.pop(threshold, [])
                for op in waiting if type(waiting) is list else [waiting]:
                    if op._state & FINISHED:
                        lists.left(op)
                    else:
                        self.plain[op] = None
                heapq.heapify(self.heap)  # (the sift stopped half way)
            finally:
                self.recount()
            raise

    def push(self, threshold: Any) -> None:
        """Queue an out-of-order `threshold` in the heap (``TypeError`` if it does not compare:
        then nothing is queued). A comparison in the push's sift may trigger the key, whose
        release can pop `threshold` before it is in ``at``: the dead entries are counted again
        when the push fails."""
        try:
            heapq.heappush(self.heap, threshold)
        except BaseException:
            try:
                self.unpush(threshold)
            finally:
                self.recount()
            raise

    def recount(self) -> None:
        """Count the dead entries again from the queue and ``at`` (every threshold in ``at``
        is queued), after a sift that user code interrupted."""
        self.dead = len(self.run) + len(self.heap) - len(self.at)

    def unpush(self, threshold: Any) -> None:
        """Undo a push of `threshold` that raised, which may have left it anywhere in the
        heap (the heap's other values were ordered against each other already)."""
        heap = self.heap
        for index in range(len(heap) - 1, -1, -1):
            if heap[index] is threshold:
                del heap[index]
                break
        heapq.heapify(heap)

    def pop(self, op: Op, default: Any, key: Hashable) -> Any:
        """Stop watching `op`, which watched `key` (this container's): ``dict.pop``'s answer,
        `default` if it did not watch. O(1) amortised (O(n) among operations sharing one
        threshold)."""
        if self.plain.pop(op, _MISSING) is not _MISSING:
            return None
        threshold = op._marks  # type: ignore[attr-defined] # threshold_of(op, key), inline (the purge calls this per entry)
        if type(threshold) is dict:
            threshold = threshold.get(key)
        if threshold is None:
            return default
        at = self.at
        waiting = at.get(threshold)
        if waiting is op:
            del at[threshold]
        elif type(waiting) is list and op in waiting:
            waiting.remove(op)
            if waiting:
                return None
            del at[threshold]
        else:
            return default
        self.dead += 1
        if self.dead > (len(self.run) + len(self.heap)) >> 1:
            self.compact()
        return None

    def clear(self) -> None:
        """Forget every watcher (a key cancelled or drained)."""
        self.plain.clear()
        self.at.clear()
        self.run.clear()
        self.heap.clear()
        self.dead = 0

    def compact(self) -> None:
        """Drop the dead entries: the run keeps its order; the heap is made again. In place: a
        release in progress (a threshold's comparison may pop a watcher, which may compact)
        goes on over the compacted queue, as the native core's does."""
        at = self.at
        run = [threshold for threshold in self.run if threshold in at]
        heap = [threshold for threshold in self.heap if threshold in at]
        self.run.clear()
        self.run.extend(run)
        self.heap[:] = heap
        heapq.heapify(self.heap)  # (these values were ordered against each other already)
        self.dead = len(self.run) + len(self.heap) - len(at)

    def _check(self) -> None:
        """Raise ``AssertionError`` if the thresholds, the run and the heap disagree."""
        at = self.at
        queued = list(self.run) + self.heap
        assert all(threshold in queued for threshold in at), "a threshold waits unqueued"
        assert self.dead == len(queued) - len(at), (
            f"{len(queued) - len(at)} dead entries, {self.dead} counted"
        )
        for threshold, waiting in at.items():
            ops = waiting if type(waiting) is list else [waiting]
            assert ops, f"nobody waits at {threshold!r}"
            for op in ops:
                assert op not in self.plain, f"{op!r} both plain and at a threshold"
        run = list(self.run)
        assert all(a <= b for a, b in itertools.pairwise(run)), "run out of order"
        for i in range(1, len(self.heap)):
            assert not self.heap[i] < self.heap[(i - 1) >> 1], "heap order broken"


_PyThresholdWatchers = ThresholdWatchers

if not TYPE_CHECKING and native is not None:
    # The C core's own methods and fields are its (`twin` copies none of their names).
    ThresholdWatchers = twin(_PyThresholdWatchers, native.ThresholdCore)
