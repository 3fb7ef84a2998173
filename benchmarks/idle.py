"""Idle cost: how often the reaper wakes the loop when little or nothing is due.

The target: a purgatory with nothing due wakes the loop no more than once per
``max(1 s, next deadline)``, and with sparse operations the reaper wakes once per due bucket, not
once per tick. Counted with ``statistics().timer_passes`` (one per reaper wake-up) on the stock
asyncio loop, in real time:

- **empty**: bound to the loop, nothing pending, watched for `WINDOW` seconds;
- **one far deadline**: a single operation with a 30 s timeout, watched for `WINDOW` seconds;
- **sparse**: `SPARSE_OPS` operations with seeded random deadlines over 0.1-2 s (some beyond the
  1024-tick first level, so their buckets cascade once), run until all have expired; compared
  with the number of distinct deadline ticks (the due buckets) and the ticks that elapsed.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

from purgatory import DelayedOperationPurgatory

from .ours import BenchOp

__all__ = ("run_idle",)

WINDOW = 2.0
FAR_TIMEOUT = 30.0
SPARSE_OPS = 200
SPARSE_SPAN = (0.1, 2.0)


async def _passes_while_idle(pending_timeout: float | None) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    purgatory: DelayedOperationPurgatory[BenchOp] = DelayedOperationPurgatory("idle")
    ready = BenchOp(1.0, 0.0)
    ready.ready = True
    purgatory.try_complete_else_watch(ready, ["bind"])  # binds the loop, leaves nothing
    if pending_timeout is not None:
        purgatory.try_complete_else_watch(BenchOp(pending_timeout, 0.0), ["far"])
    await asyncio.sleep(0.05)  # the reaper's first pass
    before = purgatory.statistics().timer_passes
    started = loop.time()
    await asyncio.sleep(WINDOW)
    passes = purgatory.statistics().timer_passes - before
    elapsed = loop.time() - started
    await purgatory.shutdown()
    return {"seconds": elapsed, "timer_passes": passes}


async def _sparse(seed: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    rng = random.Random(f"idle/{seed}")
    purgatory: DelayedOperationPurgatory[BenchOp] = DelayedOperationPurgatory("sparse")
    lateness: list[float] = []
    BenchOp.expiry_sink = lateness
    tick = 0.001
    start = loop.time()
    due_ticks: set[int] = set()
    for i in range(SPARSE_OPS):
        timeout = rng.uniform(*SPARSE_SPAN)
        now = loop.time()
        purgatory.try_complete_else_watch(BenchOp(timeout, now + timeout), [i])
        due_ticks.add(math.ceil((now + timeout) / tick))
    before = purgatory.statistics().timer_passes
    while purgatory.num_delayed():
        await asyncio.sleep(0.05)
    passes = purgatory.statistics().timer_passes - before
    elapsed = loop.time() - start
    await purgatory.shutdown()
    return {
        "operations": SPARSE_OPS,
        "seconds": elapsed,
        "timer_passes": passes,
        "distinct_deadline_ticks": len(due_ticks),
        "ticks_elapsed": round(elapsed / tick),
        "expired": len(lateness),
        "max_lateness_ms": max(lateness) * 1e3 if lateness else None,
    }


def run_idle(seed: int) -> dict[str, Any]:
    """The three idle scenarios, each on a fresh asyncio loop."""
    return {
        "window_s": WINDOW,
        "empty": asyncio.run(_passes_while_idle(None)),
        "one_far_deadline": asyncio.run(_passes_while_idle(FAR_TIMEOUT)),
        "sparse": asyncio.run(_sparse(seed)),
    }
