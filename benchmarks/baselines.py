"""The baselines, written the way a careful asyncio user would write them.

- **A** (`FutureTimer`): one ``asyncio.Future`` per request, ``loop.call_later`` for its timeout and
  ``dict[key, list[waiter]]``; completion cancels the timer handle and sets the result. A finished
  waiter is removed from each of its keys' lists at once (``list.remove``, C speed), so nothing
  stays reachable after it is done; a trigger tests the condition inline (an attribute, no method
  call) in one list comprehension.
- **B**: the same class on uvloop (the loop is the only difference; see `contenders.py`).
- **A-lean** (`LeanFutureTimer`): the leanest thing an asyncio user writes, no Python class of
  its own per request: a tuple ``(threshold, future, handle)`` of ``loop.call_at`` in a list per
  key, the condition (``threshold <= reached``) checked inline in a list comprehension.
- **C** (`TaskPerRequest`): the idiom, a Task per request doing
  ``await asyncio.wait_for(event.wait(), timeout)``; a trigger sets the events of the ready ones.
- **Floor** (`Floor`): the irreducible work, create the operation object and insert it into one
  dict per key; completion pops the key's dict. It has no timer, so no expiry figures.

All of them share the drivers' interface with `ours.OursTarget` (``submit``/``force``/``trigger``
for W1, ``schedule``/``complete``/``settle`` for W2), with the same per-request harness work.
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


def _unlink(watchers: dict[Hashable, list[Any]], item: Any, keys: tuple[Hashable, ...]) -> None:
    """Remove a finished waiter from each of its keys' lists; drop lists that become empty."""
    for key in keys:
        waiters = watchers[key]
        if len(waiters) == 1:
            del watchers[key]
        else:
            waiters.remove(item)


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
    """Baseline A (and B on uvloop): Future + ``call_later`` + ``dict[key, list[waiter]]``."""

    has_timer = True

    def __init__(self, name: str = "A") -> None:
        self.name = name
        self._loop = asyncio.get_running_loop()
        self._watchers: dict[Hashable, list[Waiter]] = {}
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
                watchers[key] = [waiter]
            else:
                waiters.append(waiter)
        self._pending += 1
        return waiter

    def check(self, key: Hashable) -> int:
        """Complete every waiter on `key` whose condition holds; return how many."""
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
    the other keys' heaps lazily, when a trigger reaches their threshold. W1 interface only (and
    the ``steady`` microbenchmark): what an A user gains from a threshold structure, against
    which ours' threshold path can be judged.
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

    def submit(
        self, keys: tuple[Hashable, ...], timeout: float, deadline: float, threshold: float
    ) -> Waiter:
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
        self._pending += 1
        return waiter

    def trigger(self, waiter: Waiter, key: Hashable, reached: float) -> bool:
        waiter.ready = True
        return self.check(key, reached) > 0

    submit_threshold = submit
    trigger_threshold = trigger

    def check(self, key: Hashable, reached: float) -> int:
        """Complete the ready waiters of `key` whose threshold is <= `reached`."""
        done = 0
        waiting = self._reached.pop(key, None)
        if waiting is not None:
            still = [w for w in waiting if not w.future.done() and not w.ready]
            for w in waiting:
                if w.ready and not w.future.done():
                    self._complete(w)
                    done += 1
            if still:
                self._reached[key] = still
        heap = self._heaps.get(key)
        if heap is None:
            return done
        pop = heapq.heappop
        while heap and heap[0][0] <= reached:
            w = pop(heap)[2]
            if w.future.done():
                continue
            if w.ready:
                self._complete(w)
                done += 1
            else:
                self._reached.setdefault(key, []).append(w)
        if not heap:
            del self._heaps[key]
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

    def _expire(self, waiter: Waiter) -> None:
        self.expiry_lateness.append(_monotonic() - waiter.deadline)
        waiter.future.set_result(False)
        self._pending -= 1

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
        self._pending = 0


# -- A-lean -------------------------------------------------------------------------------------

LeanEntry = tuple[float, "asyncio.Future[bool]", asyncio.TimerHandle]
"""``(threshold, future, handle)``: all A-lean keeps per request (no class of its own)."""

COMPACT_EVERY = 64
"""A-lean drops finished entries from a key's list on every 64th append to it (amortised O(1)),
so that lists no trigger scans (W1-force) do not grow without bound."""


class LeanFutureTimer:
    """Baseline A-lean: per request a tuple of its threshold, its Future and the TimerHandle of
    ``loop.call_at``, appended to a list per key; the condition is checked inline.

    The condition is the one an acks=all waiter has: the value the key reached is at least the
    request's threshold. In W1 the threshold is the request's completion time and a trigger
    carries the time reached, so A-lean completes exactly what A's ready flags complete (W1-key
    and W1-threshold are the same code here). A trigger scans the key's list with two list
    comprehensions (the entries reached, then the rest, only when something was reached) and
    completes the reached ones still pending. Finished entries are not unlinked from the other
    keys' lists at once (the tuple does not know its keys, and the expiry callback cannot name
    its tuple): they leave a list when a trigger on that key reaches their threshold, or at the
    next compaction of that list, so ``watched()`` counts some finished entries.
    """

    has_timer = True
    name = "A-lean"

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._watchers: dict[Hashable, list[LeanEntry]] = {}
        self._pending = 0
        self.expiry_lateness: list[float] = []

    # -- what the user writes -------------------------------------------------------------------

    def watch(self, keys: tuple[Hashable, ...], threshold: float, deadline: float) -> LeanEntry:
        loop = self._loop
        future: asyncio.Future[bool] = loop.create_future()
        entry = (threshold, future, loop.call_at(deadline, self._expire, future, deadline))
        watchers = self._watchers
        for key in keys:
            entries = watchers.get(key)
            if entries is None:
                watchers[key] = [entry]
            else:
                entries.append(entry)
                if not len(entries) % COMPACT_EVERY:
                    entries[:] = [e for e in entries if not e[1].done()]
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
        for _, future, handle in due:
            if not future.done():  # it may have completed through another key, or expired
                handle.cancel()
                future.set_result(True)
                done += 1
        self._pending -= done
        return done

    def _expire(self, future: asyncio.Future[bool], deadline: float) -> None:
        self.expiry_lateness.append(_monotonic() - deadline)
        future.set_result(False)
        self._pending -= 1

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
            for _, future, handle in entries:
                handle.cancel()
                future.cancel()
        self._watchers.clear()
        self._pending = 0


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
    """Baseline C: a Task per request doing ``await asyncio.wait_for(event.wait(), timeout)``."""

    name = "C"
    has_timer = True

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._watchers: dict[Hashable, list[TaskRequest]] = {}
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
                watchers[key] = [request]
            else:
                requests.append(request)
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
