"""The hand-written baselines (`benchmarks.baselines`) do what their figures claim, the way a
careful user writes them.

A baseline that completes too much, too little or twice would make every ratio against it
meaningless, and one that keeps finished waiters reachable, or unlinks them by scanning a list,
would hand ours a lead no careful user would see. So their semantics and their bookkeeping are
checked here on a real asyncio loop (their timers are ``loop.call_at`` handles; the ones that
should fire are given deadlines already past).
"""

from __future__ import annotations

import ast
import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from helpers import until

import benchmarks.baselines
from benchmarks.baselines import (
    PURGE_AT_LEAST,
    FutureTimer,
    HeapFutureTimer,
    LeanFutureTimer,
    TaskPerRequest,
)

FAR = 3600.0  # seconds: a deadline no test reaches


def on_the_stock_loop(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run the async `test` on a fresh stock asyncio loop, whose clock is `time.monotonic`, the
    baselines' own (their deadlines are ``loop.call_at`` times)."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


def test_no_baseline_unlinks_by_scanning_a_list() -> None:
    # list.remove makes every completion O(list length) per key: a careful user drops finished
    # waiters in the pass that meets them, from an ordered dict in O(1), or in a lazy purge.
    tree = ast.parse(Path(benchmarks.baselines.__file__).read_text())
    calls = [
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    ]
    assert "remove" not in calls
    assert "index" not in calls


# -- A ------------------------------------------------------------------------------------------


@on_the_stock_loop
async def test_a_finished_waiter_leaves_every_key_at_once() -> None:
    a = FutureTimer()
    far = time.monotonic() + FAR
    first = a.submit(("a", "b", "c"), FAR, far, 0.0)
    second = a.submit(("a", "b"), FAR, far, 0.0)
    assert a.watched() == 5
    # Completed through "a": gone from "b" and "c" too, nothing left to skip later.
    assert a.trigger(first, "a", 0.0) is True
    assert first.future.result() is True
    assert a.watched() == 2
    assert a.force(first) is False
    assert a.force(second) is True
    assert a.force(second) is False
    assert a.watched() == 0
    assert a.pending() == 0
    await a.close()


@on_the_stock_loop
async def test_a_trigger_completes_only_the_ready_waiters_of_its_key() -> None:
    a = FutureTimer()
    far = time.monotonic() + FAR
    waiters = [a.submit(("hot", f"k{i}"), FAR, far, 0.0) for i in range(10)]
    for waiter in waiters[::3]:
        waiter.ready = True
    assert a.check("hot") == 4
    assert a.check("hot") == 0  # once only
    assert [w.future.done() for w in waiters] == [i % 3 == 0 for i in range(10)]
    assert a.pending() == 6
    assert a.watched() == 12  # 6 pending on "hot" and on a key of their own
    await a.close()


@on_the_stock_loop
async def test_a_expiry_resolves_false_and_unlinks() -> None:
    a = FutureTimer()
    now = time.monotonic()
    expiring = a.submit(("k", "j"), 0.0, now, 0.0)
    staying = a.submit(("k",), FAR, now + FAR, 0.0)
    await until(expiring.future.done, "the expiry of a zero timeout")
    assert expiring.future.result() is False
    assert len(a.expiry_lateness) == 1
    assert a.watched() == 1  # `staying` alone, on "k"
    staying.ready = True
    assert a.check("k") == 1
    assert a.check("j") == 0
    assert a.watched() == 0
    await a.close()


# -- A-lean -------------------------------------------------------------------------------------


@on_the_stock_loop
async def test_a_lean_trigger_completes_exactly_the_reached_entries_once() -> None:
    lean = LeanFutureTimer()
    far = time.monotonic() + FAR
    low = lean.submit(("a", "b"), FAR, far, 1.0)
    mid = lean.submit(("a",), FAR, far, 2.0)
    high = lean.submit(("a", "b"), FAR, far, 3.0)
    assert lean.pending() == 3
    assert lean.watched() == 5

    assert lean.check("a", 2.0) == 2
    assert low[1].result() is True
    assert mid[1].result() is True
    assert not high[1].done()
    assert lean.pending() == 1
    # `low` completed through "a" is still on "b" (lazily unlinked): reaching it there
    # drops it without completing it again.
    assert lean.check("b", 2.5) == 0
    assert lean.watched() == 2  # `high` on "a" and on "b"
    assert lean.trigger(high, "b", 3.0) is True
    assert high[1].result() is True
    assert lean.check("a", 10.0) == 0
    assert lean.watched() == 0
    assert lean.pending() == 0
    await lean.close()


@on_the_stock_loop
async def test_a_lean_expiry_resolves_false_once_and_a_later_trigger_skips_it() -> None:
    lean = LeanFutureTimer()
    now = time.monotonic()
    expiring = lean.submit(("k",), 0.0, now - 0.001, 5.0)
    waiting = lean.submit(("k",), FAR, now + FAR, 6.0)
    await until(expiring[1].done, "the expiry of a deadline already past")
    assert expiring[1].result() is False
    assert len(lean.expiry_lateness) == 1
    assert lean.expiry_lateness[0] > 0
    assert lean.pending() == 1
    assert lean.check("k", 6.0) == 1
    assert waiting[1].result() is True
    assert lean.pending() == 0
    await lean.close()


@on_the_stock_loop
async def test_a_lean_purges_once_finished_entries_dominate() -> None:
    # W1-force: no trigger ever scans the lists, on a key space wide enough that no key is
    # watched twice; finished entries still leave, at a cost amortised over the watches.
    lean = LeanFutureTimer()
    far = time.monotonic() + FAR
    live = [lean.submit((f"live{i}",), FAR, far, 1.0) for i in range(10)]
    for i in range(4 * PURGE_AT_LEAST):
        entry = lean.submit((f"k{i}", f"j{i}"), FAR, far, 1.0)
        assert lean.force(entry) is True
        assert lean.force(entry) is False
        assert entry[2].cancelled()
    assert lean.pending() == len(live)
    # Never more finished entries than live ones plus the purge's floor, and the live stay.
    assert lean.watched() <= 2 * (PURGE_AT_LEAST + len(live))
    assert lean.check("live3", 1.0) == 1
    assert live[3][1].result() is True
    await lean.close()


@on_the_stock_loop
async def test_a_lean_w2_driver_interface_completes_by_key() -> None:
    lean = LeanFutureTimer()
    far = time.monotonic() + FAR
    keysets = [(i,) for i in range(10)]
    out: list[object] = [None] * 10
    lean.schedule(keysets, [far] * 10, out)
    assert lean.pending() == 10
    assert lean.complete(out[:4], keysets[:4]) == 4  # type: ignore[arg-type]
    assert lean.pending() == 6
    await lean.close()
    assert lean.watched() == 0


# -- A-heap -------------------------------------------------------------------------------------


@on_the_stock_loop
async def test_the_hand_written_heap_baseline_completes_only_reached_ready_waiters() -> None:
    heap = HeapFutureTimer()
    far = time.monotonic() + FAR
    first = heap.submit(("a", "b"), FAR, far, 1.0)
    second = heap.submit(("a",), FAR, far, 2.0)
    third = heap.submit(("a",), FAR, far, 3.0)
    # `second` is reached but not ready: kept, and completed by a later trigger once ready.
    assert heap.trigger(first, "a", 2.0) is True
    assert first.future.result() is True
    assert not second.future.done()
    second.ready = True
    assert heap.check("a", 2.0) == 1
    assert second.future.result() is True
    third.ready = True  # ready, but its threshold is not reached: untouched
    assert heap.check("a", 2.5) == 0
    assert not third.future.done()
    assert heap.check("b", 5.0) == 0  # `first`, finished, leaves "b" uncounted
    assert heap.check("a", 3.0) == 1
    assert heap.pending() == 0
    assert heap.watched() == 0
    await heap.close()


@on_the_stock_loop
async def test_the_heap_baseline_purges_finished_entries_of_keys_never_triggered() -> None:
    heap = HeapFutureTimer()
    far = time.monotonic() + FAR
    kept = heap.submit(("kept",), FAR, far, 5.0)
    for i in range(3 * PURGE_AT_LEAST):
        waiter = heap.submit((f"k{i}",), FAR, far, 1.0)
        assert heap.force(waiter) is True
    assert heap.watched() <= 2 * (PURGE_AT_LEAST + 1)
    kept.ready = True
    assert heap.check("kept", 5.0) == 1
    assert heap.pending() == 0
    await heap.close()


# -- C ------------------------------------------------------------------------------------------


@on_the_stock_loop
async def test_the_task_per_request_baseline_unlinks_a_finished_task() -> None:
    c = TaskPerRequest()
    now = time.monotonic()
    done = c.watch(("a", "b"), now + FAR)
    expiring = c.watch(("a",), now)
    await until(lambda: c.started == 2, "both Tasks started")
    done.ready = True
    assert c.check("b") == 1
    await c.settle()
    await until(lambda: len(c.expiry_lateness) == 1, "the zero timeout")
    assert c.completed == 1
    assert expiring.task is not None
    assert expiring.task.done()
    assert c.watched() == 0
    assert c.pending() == 0
    await c.close()
