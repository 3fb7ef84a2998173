"""The baselines, written the way a careful asyncio user would write them.

- **A** (`FutureTimer`): one ``asyncio.Future`` per request, ``loop.call_later`` for its timeout and
  the waiters of a key in an insertion-ordered ``dict[waiter, None]``; completion cancels the timer
  handle and sets the result. A finished waiter leaves each of its keys in O(1) (``del``), so
  nothing stays reachable after it is done and no completion scans a list; a trigger tests the
  condition inline (an attribute, no method call) in one comprehension.
- **B**: the same class on uvloop (the loop is the only difference; see `contenders.py`).
- **A-lean** (`LeanFutureTimer`): the leanest thing an asyncio user writes, no Python class of
  its own per request: a tuple ``(threshold, future, handle, width)`` of ``loop.call_at`` in a
  list per key, the condition (``threshold <= reached``) checked inline in a list comprehension;
  finished entries leave a list in the trigger's pass that meets them, or in a purge of every
  list once they outnumber the live ones (Kafka's ``purgeCompleted``).
- **C** (`TaskPerRequest`): the idiom, a Task per request doing
  ``await asyncio.wait_for(event.wait(), timeout)``; a trigger sets the events of the ready ones.
- **Floor** (`Floor`): the irreducible work, create the operation object and insert it into one
  dict per key; completion pops the key's dict. It has no timer, so no expiry figures.

All of them share the drivers' interface with `ours.OursTarget` (``submit``/``force``/``trigger``
for W1, ``schedule``/``complete``/``settle`` for W2), with the same per-request harness work.

What a careful user would not write, and none of them does: a completion that scans a list to
unlink its waiter (``list.remove`` is O(list length) per key, and on hot keys it made A pay for
every completion a cost that grows with the number pending), or finished entries kept reachable
until their deadline. Which of the three careful ways A takes was measured (the steady state of
W1 without the loop, and W1 probes at fixed rates): an ordered dict per key matched the best of
the others on both completion paths, where a list with lazy compaction was slightly ahead when
completing by force and behind on hot keys (it needs a second pass to drop what it completed).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

__all__ = (
    "Floor",
    "FloorOp",
    "FutureTimer",
    "HeapFutureTimer",
    "LeanFutureTimer",
    "TaskPerRequest",
    "Waiter",
    "complete_by_key",
)

_monotonic = time.monotonic


PURGE_AT_LEAST = 1_000
"""The lazy baselines purge once finished entries outnumber the live ones and are at least this
many (Kafka's ``purgeInterval`` default): amortised O(1) per entry, and never a purge per request
while little is pending."""


def _unlink(
    watchers: dict[Hashable, dict[Any, None]], item: Any, keys: tuple[Hashable, ...]
) -> None:
    """Remove a finished waiter from each of its keys in O(1); drop keys left with none."""
    for key in keys:
        waiters = watchers[key]
        if len(waiters) == 1:
            del watchers[key]
        else:
            del waiters[item]


def complete_by_key(
    check: Callable[[Hashable], int], items: Sequence[Any], keysets: Sequence[tuple[Hashable, ...]]
) -> int:
    """W2's completion phase for a contender with flags: set each item's flag, then check its
    first key; how many completed. (Ours, A, B and C share it: the same harness work.)"""
    done = 0
    for item, keys in zip(items, keysets, strict=True):
        item.ready = True
        done += check(keys[0])
    return done


# -- A and B ------------------------------------------------------------------------------------


class Waiter:
    """Baseline A's per-request record."""

    __slots__ = ("deadline", "future", "handle", "keys", "ready")

    def __init__(
        self, keys: tuple[Hashable, ...], deadline: float, future: asyncio.Future[bool]
    ) -> None:
        self.keys = keys
        self.deadline = deadline
        self.future = future
        self.ready = False
        self.handle: asyncio.TimerHandle | None = None


class FutureTimer:
    """Baseline A (and B on uvloop): Future + ``call_later`` + ``dict[key, dict[waiter, None]]``."""

    has_timer = True

    def __init__(self, name: str = "A") -> None:
        self.name = name
        self._loop = asyncio.get_running_loop()
        self._watchers: dict[Hashable, dict[Waiter, None]] = {}
        self._pending = 0
        self.expiry_lateness: list[float] = []

    # -- what the user writes -------------------------------------------------------------------

    def watch(self, keys: tuple[Hashable, ...], timeout: float, deadline: float) -> Waiter:
        """Park a request on `keys` with a timeout; its future resolves True (done) or False."""
        loop = self._loop
        waiter = Waiter(keys, deadline, loop.create_future())
        waiter.handle = loop.call_later(timeout, self._expire, waiter)
        watchers = self._watchers
        for key in keys:
            waiters = watchers.get(key)
            if waiters is None:
                watchers[key] = {waiter: None}
            else:
                waiters[waiter] = None
        self._pending += 1
        return waiter

    def check(self, key: Hashable) -> int:
        """Complete every waiter on `key` whose condition holds; return how many.

        Only pending waiters are on a key (a finished one left all of its keys at once), so the
        comprehension tests the condition alone; it is done before completing, since completing
        removes entries from the dict it walks.
        """
        waiters = self._watchers.get(key)
        if waiters is None:
            return 0
        ready = [waiter for waiter in waiters if waiter.ready]
        for waiter in ready:
            self._complete(waiter)
        return len(ready)

    def force(self, waiter: Waiter) -> bool:
        """Complete `waiter` now unless it is done already."""
        if waiter.future.done():
            return False
        self._complete(waiter)
        return True

    def _complete(self, waiter: Waiter) -> None:
        assert waiter.handle is not None
        waiter.handle.cancel()
        waiter.future.set_result(True)
        _unlink(self._watchers, waiter, waiter.keys)
        self._pending -= 1

    def _expire(self, waiter: Waiter) -> None:
        self.expiry_lateness.append(_monotonic() - waiter.deadline)
        waiter.future.set_result(False)
        _unlink(self._watchers, waiter, waiter.keys)
        self._pending -= 1

    # -- the drivers' interface -----------------------------------------------------------------

    def submit(
        self, keys: tuple[Hashable, ...], timeout: float, deadline: float, threshold: float
    ) -> Waiter:
        """W1: `threshold` (the completion time) is not used: the ready flag says the same."""
        return self.watch(keys, timeout, deadline)

    def trigger(self, waiter: Waiter, key: Hashable, reached: float) -> bool:
        """W1: the flag is set when the time is reached; the inline check then completes only
        the waiters that are due, which is what a threshold buys (at O(watchers) per trigger)."""
        waiter.ready = True
        return self.check(key) > 0

    # W1-threshold runs A's W1-key code: it has nothing else to offer.
    submit_threshold = submit
    trigger_threshold = trigger

    def schedule(
        self,
        keysets: Sequence[tuple[Hashable, ...]],
        deadlines: Sequence[float],
        out: list[Any],
    ) -> None:
        monotonic = _monotonic
        watch = self.watch
        for i, keys in enumerate(keysets):
            due = deadlines[i]
            timeout = due - monotonic()
            if timeout < 0.0:  # noqa: PLR1730 - cheaper than max() in the timed loop
                timeout = 0.0
            out[i] = watch(keys, timeout, due)

    def complete(self, waiters: Sequence[Waiter], keysets: Sequence[tuple[Hashable, ...]]) -> int:
        return complete_by_key(self.check, waiters, keysets)

    async def settle(self) -> None:
        """Nothing runs later: completion and watching are synchronous."""

    def pending(self) -> int:
        return self._pending

    def watched(self) -> int:
        return sum(map(len, self._watchers.values()))

    async def close(self) -> None:
        for waiters in self._watchers.values():
            for waiter in waiters:
                if waiter.handle is not None:
                    waiter.handle.cancel()
                waiter.future.cancel()
        self._watchers.clear()
        self._pending = 0


class HeapFutureTimer:
    """A with thresholds written by hand: Kafka Raft's ``ThresholdPurgatory`` idea in plain asyncio.

    Per key a heap of ``(threshold, seq, waiter)`` tuples; a trigger pops the entries whose
    threshold is reached and completes the ready ones, keeping the reached-but-not-ready ones on
    a per-key list that every later trigger re-tests (so none is lost). Finished waiters leave
    the other keys' heaps lazily: when a trigger reaches their threshold there, or in a purge of
    every heap once finished entries outnumber the live ones (at a watch, never inside a pass).
    W1 interface only (and the ``steady`` microbenchmark): what an A user gains from a threshold
    structure, against which ours' threshold path can be judged.
    """

    has_timer = True
    name = "A-heap"

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._pending = 0
        self.expiry_lateness: list[float] = []
        self._heaps: dict[Hashable, list[tuple[float, int, Waiter]]] = {}
        self._reached: dict[Hashable, list[Waiter]] = {}
        self._seq = 0
        self._entries = 0  # entries in every heap and reached list
        self._dead = 0  # of them, finished waiters'

    def submit(
        self, keys: tuple[Hashable, ...], timeout: float, deadline: float, threshold: float
    ) -> Waiter:
        if self._dead >= PURGE_AT_LEAST and 2 * self._dead > self._entries:
            self._purge()
        loop = self._loop
        waiter = Waiter(keys, deadline, loop.create_future())
        waiter.handle = loop.call_later(timeout, self._expire, waiter)
        entry = (threshold, self._seq, waiter)
        self._seq += 1
        heaps = self._heaps
        push = heapq.heappush
        for key in keys:
            heap = heaps.get(key)
            if heap is None:
                heaps[key] = [entry]
            else:
                push(heap, entry)
        self._entries += len(keys)
        self._pending += 1
        return waiter

    def trigger(self, waiter: Waiter, key: Hashable, reached: float) -> bool:
        waiter.ready = True
        return self.check(key, reached) > 0

    submit_threshold = submit
    trigger_threshold = trigger

    def check(self, key: Hashable, reached: float) -> int:
        """Complete the ready waiters of `key` whose threshold is <= `reached`; every finished
        entry the pass meets leaves the key."""
        # The waiters reached before and not ready then, and those this trigger reaches now.
        candidates = self._reached.pop(key, [])
        heap = self._heaps.get(key)
        if heap is not None:
            pop = heapq.heappop
            while heap and heap[0][0] <= reached:
                candidates.append(pop(heap)[2])
            if not heap:
                del self._heaps[key]
        done = 0
        left = 0
        still = []
        for w in candidates:
            if w.future.done():
                left += 1
            elif w.ready:
                self._complete(w)
                done += 1
                left += 1
            else:
                still.append(w)
        if still:
            self._reached[key] = still
        self._entries -= left
        self._dead -= left
        return done

    def force(self, waiter: Waiter) -> bool:
        if waiter.future.done():
            return False
        self._complete(waiter)
        return True

    def _complete(self, waiter: Waiter) -> None:
        assert waiter.handle is not None
        waiter.handle.cancel()
        waiter.future.set_result(True)
        self._pending -= 1
        self._dead += len(waiter.keys)

    def _expire(self, waiter: Waiter) -> None:
        self.expiry_lateness.append(_monotonic() - waiter.deadline)
        waiter.future.set_result(False)
        self._pending -= 1
        self._dead += len(waiter.keys)

    def _purge(self) -> None:
        """Drop every finished waiter's entries: O(entries), once per as many finished ones."""
        entries = 0
        for key, heap in list(self._heaps.items()):
            live = [entry for entry in heap if not entry[2].future.done()]
            if live:
                heapq.heapify(live)
                self._heaps[key] = live
                entries += len(live)
            else:
                del self._heaps[key]
        for key, waiting in list(self._reached.items()):
            still = [w for w in waiting if not w.future.done()]
            if still:
                self._reached[key] = still
                entries += len(still)
            else:
                del self._reached[key]
        self._entries = entries
        self._dead = 0

    def pending(self) -> int:
        return self._pending

    def watched(self) -> int:
        return sum(map(len, self._heaps.values())) + sum(map(len, self._reached.values()))

    async def close(self) -> None:
        for heap in self._heaps.values():
            for _, _, waiter in heap:
                if waiter.handle is not None:
                    waiter.handle.cancel()
                waiter.future.cancel()
        self._heaps.clear()
        self._reached.clear()
        self._pending = self._entries = self._dead = 0


# -- A-lean -------------------------------------------------------------------------------------

LeanEntry = tuple[float, "asyncio.Future[bool]", asyncio.TimerHandle, int]
"""``(threshold, future, handle, width)``: all A-lean keeps per request (no class of its own);
`width` is how many keys' lists hold the entry, for the count of finished entries."""


class LeanFutureTimer:
    """Baseline A-lean: per request a tuple of its threshold, its Future, the TimerHandle of
    ``loop.call_at`` and its number of keys, appended to a list per key; the condition is
    checked inline.

    The condition is the one an acks=all waiter has: the value the key reached is at least the
    request's threshold. In W1 the threshold is the request's completion time and a trigger
    carries the time reached, so A-lean completes exactly what A's ready flags complete (W1-key
    and W1-threshold are the same code here). A trigger scans the key's list with two list
    comprehensions (the entries reached, then the rest, only when something was reached) and
    completes the reached ones still pending: every entry reached leaves the list in that pass,
    finished or not. Finished entries are not unlinked from the other keys' lists at once (the
    tuple does not know its keys, and the expiry callback cannot name its tuple): they leave a
    list when a trigger on that key reaches their threshold, or in a purge of every list once
    finished entries outnumber the live ones (at a watch, never inside a pass), so
    ``watched()`` counts some finished entries.
    """

    has_timer = True
    name = "A-lean"

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._watchers: dict[Hashable, list[LeanEntry]] = {}
        self._pending = 0
        self._entries = 0  # entries in every list
        self._dead = 0  # of them, finished requests'
        self.expiry_lateness: list[float] = []

    # -- what the user writes -------------------------------------------------------------------

    def watch(self, keys: tuple[Hashable, ...], threshold: float, deadline: float) -> LeanEntry:
        if self._dead >= PURGE_AT_LEAST and 2 * self._dead > self._entries:
            self._purge()
        loop = self._loop
        future: asyncio.Future[bool] = loop.create_future()
        width = len(keys)
        entry = (
            threshold,
            future,
            loop.call_at(deadline, self._expire, future, deadline, width),
            width,
        )
        watchers = self._watchers
        for key in keys:
            entries = watchers.get(key)
            if entries is None:
                watchers[key] = [entry]
            else:
                entries.append(entry)
        self._entries += width
        self._pending += 1
        return entry

    def check(self, key: Hashable, reached: float) -> int:
        """Complete every request on `key` whose threshold is <= `reached`; return how many."""
        entries = self._watchers.get(key)
        if entries is None:
            return 0
        due = [e for e in entries if e[0] <= reached]
        if not due:
            return 0
        rest = [e for e in entries if e[0] > reached]
        if rest:
            self._watchers[key] = rest
        else:
            del self._watchers[key]
        done = 0
        finished = 0
        for _, future, handle, width in due:
            if not future.done():  # it may have completed through another key, or expired
                handle.cancel()
                future.set_result(True)
                done += 1
                finished += width
        self._pending -= done
        # Every entry reached has left this list, finished now or before.
        self._entries -= len(due)
        self._dead += finished - len(due)
        return done

    def _expire(self, future: asyncio.Future[bool], deadline: float, width: int) -> None:
        self.expiry_lateness.append(_monotonic() - deadline)
        future.set_result(False)
        self._pending -= 1
        self._dead += width

    def _purge(self) -> None:
        """Drop every finished entry: O(entries), once per as many finished ones."""
        watchers = self._watchers
        entries = 0
        for key, listed in list(watchers.items()):
            live = [e for e in listed if not e[1].done()]
            if live:
                watchers[key] = live
                entries += len(live)
            else:
                del watchers[key]
        self._entries = entries
        self._dead = 0

    # -- the drivers' interface -----------------------------------------------------------------

    def submit(
        self, keys: tuple[Hashable, ...], timeout: float, deadline: float, threshold: float
    ) -> LeanEntry:
        return self.watch(keys, threshold, deadline)

    def force(self, entry: LeanEntry) -> bool:
        future = entry[1]
        if future.done():
            return False
        entry[2].cancel()
        future.set_result(True)
        self._pending -= 1
        self._dead += entry[3]
        return True

    def trigger(self, entry: LeanEntry, key: Hashable, reached: float) -> bool:
        return self.check(key, reached) > 0

    submit_threshold = submit
    trigger_threshold = trigger

    def schedule(
        self,
        keysets: Sequence[tuple[Hashable, ...]],
        deadlines: Sequence[float],
        out: list[Any],
    ) -> None:
        # call_at takes the deadline itself (asyncio's loop.time() is time.monotonic()); the
        # threshold is the deadline too: W2's completions trigger with reached = +inf.
        watch = self.watch
        for i, keys in enumerate(keysets):
            due = deadlines[i]
            out[i] = watch(keys, due, due)

    def complete(
        self, entries: Sequence[LeanEntry], keysets: Sequence[tuple[Hashable, ...]]
    ) -> int:
        check = self.check
        done = 0
        for keys in keysets:
            done += check(keys[0], _INF)
        return done

    async def settle(self) -> None:
        """Nothing runs later: completion and watching are synchronous."""

    def pending(self) -> int:
        return self._pending

    def watched(self) -> int:
        return sum(map(len, self._watchers.values()))

    async def close(self) -> None:
        for entries in self._watchers.values():
            for _, future, handle, _ in entries:
                handle.cancel()
                future.cancel()
        self._watchers.clear()
        self._pending = self._entries = self._dead = 0


_INF = float("inf")


# -- C ------------------------------------------------------------------------------------------


class TaskRequest:
    """Baseline C's per-request record; its Task waits on `event` with a timeout."""

    __slots__ = ("deadline", "event", "keys", "ready", "signalled", "task")

    def __init__(self, keys: tuple[Hashable, ...], deadline: float) -> None:
        self.keys = keys
        self.deadline = deadline
        self.event = asyncio.Event()
        self.ready = False
        self.signalled = False
        self.task: asyncio.Task[None] | None = None


class TaskPerRequest:
    """Baseline C: a Task per request doing ``await asyncio.wait_for(event.wait(), timeout)``;
    the requests of a key in an ordered dict, which a finished Task leaves in O(1)."""

    name = "C"
    has_timer = True

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._watchers: dict[Hashable, dict[TaskRequest, None]] = {}
        self.expiry_lateness: list[float] = []
        self.created = 0
        self.started = 0
        self.signalled = 0
        self.signalled_finished = 0
        self.completed = 0

    async def _serve(self, request: TaskRequest) -> None:
        self.started += 1
        try:
            await asyncio.wait_for(request.event.wait(), request.deadline - _monotonic())
        except TimeoutError:
            self.expiry_lateness.append(_monotonic() - request.deadline)
        else:
            self.completed += 1
        finally:
            _unlink(self._watchers, request, request.keys)
            if request.signalled:
                self.signalled_finished += 1

    def watch(self, keys: tuple[Hashable, ...], deadline: float) -> TaskRequest:
        request = TaskRequest(keys, deadline)
        request.task = self._loop.create_task(self._serve(request))
        watchers = self._watchers
        for key in keys:
            requests = watchers.get(key)
            if requests is None:
                watchers[key] = {request: None}
            else:
                requests[request] = None
        self.created += 1
        return request

    def check(self, key: Hashable) -> int:
        requests = self._watchers.get(key)
        if requests is None:
            return 0
        ready = [r for r in requests if r.ready and not r.signalled]
        for request in ready:
            request.signalled = True
            request.event.set()
        self.signalled += len(ready)
        return len(ready)

    def schedule(
        self,
        keysets: Sequence[tuple[Hashable, ...]],
        deadlines: Sequence[float],
        out: list[Any],
    ) -> None:
        # The Task computes its timeout from the deadline when it starts, one loop pass later.
        watch = self.watch
        for i, keys in enumerate(keysets):
            out[i] = watch(keys, deadlines[i])

    def complete(
        self, requests: Sequence[TaskRequest], keysets: Sequence[tuple[Hashable, ...]]
    ) -> int:
        return complete_by_key(self.check, requests, keysets)

    async def settle(self) -> None:
        """Let the loop run until every Task has started and every signalled one has finished.

        (A signalled Task may still end by its timeout if both fall in the same loop pass.)
        """
        while self.started < self.created or self.signalled_finished < self.signalled:
            await asyncio.sleep(0)

    def pending(self) -> int:
        return self.created - self.completed - len(self.expiry_lateness)

    def watched(self) -> int:
        return sum(map(len, self._watchers.values()))

    async def close(self) -> None:
        tasks = [r.task for rs in self._watchers.values() for r in rs if r.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watchers.clear()


# -- Floor --------------------------------------------------------------------------------------


class FloorOp:
    """The smallest operation object: its timeout, deadline and condition flag."""

    __slots__ = ("deadline", "ready", "timeout")

    def __init__(self, timeout: float, deadline: float) -> None:
        self.timeout = timeout
        self.deadline = deadline
        self.ready = False


class Floor:
    """The irreducible work: create the operation, insert it into one dict per key. No timer."""

    name = "Floor"
    has_timer = False

    def __init__(self) -> None:
        self._watchers: dict[Hashable, dict[FloorOp, None]] = {}
        self.expiry_lateness: list[float] = []

    def schedule(
        self,
        keysets: Sequence[tuple[Hashable, ...]],
        deadlines: Sequence[float],
        out: list[Any],
    ) -> None:
        monotonic = _monotonic
        new = FloorOp
        watchers = self._watchers
        for i, keys in enumerate(keysets):
            due = deadlines[i]
            timeout = due - monotonic()
            if timeout < 0.0:  # noqa: PLR1730 - cheaper than max() in the timed loop
                timeout = 0.0
            op = new(timeout, due)
            for key in keys:
                ops = watchers.get(key)
                if ops is None:
                    watchers[key] = {op: None}
                else:
                    ops[op] = None
            out[i] = op

    def complete(self, ops: Sequence[FloorOp], keysets: Sequence[tuple[Hashable, ...]]) -> int:
        pop = self._watchers.pop
        done = 0
        for op, keys in zip(ops, keysets, strict=True):
            op.ready = True
            watching = pop(keys[0], None)
            if watching is not None:
                done += len(watching)
        return done

    async def settle(self) -> None:
        """Nothing runs later."""

    def pending(self) -> int:
        return sum(map(len, self._watchers.values()))

    def watched(self) -> int:
        return self.pending()

    async def close(self) -> None:
        self._watchers.clear()
