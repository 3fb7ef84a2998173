"""Baseline A-lean (`benchmarks.baselines.LeanFutureTimer`) does what its figures claim.

A baseline that completes too much, too little or twice would make every ratio against it
meaningless, so its semantics are checked here on a real asyncio loop (its timers are
``loop.call_at`` handles; the ones that should fire are given deadlines already past).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from typing import Any

from helpers import until

from benchmarks.baselines import COMPACT_EVERY, HeapFutureTimer, LeanFutureTimer

FAR = 3600.0  # seconds: a deadline no test reaches


def on_the_stock_loop(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run the async `test` on a fresh stock asyncio loop, whose clock is `time.monotonic`, the
    baselines' own (their deadlines are ``loop.call_at`` times)."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


@on_the_stock_loop
async def test_a_trigger_completes_exactly_the_reached_entries_once() -> None:
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
async def test_expiry_resolves_false_once_and_a_later_trigger_skips_it() -> None:
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
async def test_force_completes_once_and_compaction_bounds_unchecked_lists() -> None:
    lean = LeanFutureTimer()
    far = time.monotonic() + FAR
    for _ in range(4 * COMPACT_EVERY):
        entry = lean.submit(("hot",), FAR, far, 1.0)
        assert lean.force(entry) is True
        assert lean.force(entry) is False
        assert entry[2].cancelled()
    assert lean.pending() == 0
    # Never triggered (W1-force), the list still drops its finished entries.
    assert lean.watched() < COMPACT_EVERY
    await lean.close()


@on_the_stock_loop
async def test_w2_driver_interface_completes_by_key() -> None:
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
