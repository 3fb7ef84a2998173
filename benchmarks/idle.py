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

Each scenario runs ``idle_repeat`` times (the sparse one with a new seed each time); the goals
are judged on the worst repetition.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from typing import Any

from purgatory import DelayedOperationPurgatory

from .config import Config
from .measure import figure
from .ours import FlagOp, TimedOp

__all__ = ("run",)

WINDOW = 2.0
FAR_TIMEOUT = 30.0
SPARSE_OPS = 200
SPARSE_SPAN = (0.1, 2.0)


async def _passes_while_idle(pending_timeout: float | None) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory("idle")
    ready = FlagOp(1.0)
    ready.ready = True
    purgatory.try_complete_else_watch(ready, ["bind"])  # binds the loop, leaves nothing
    if pending_timeout is not None:
        purgatory.try_complete_else_watch(FlagOp(pending_timeout), ["far"])
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
    purgatory: DelayedOperationPurgatory[TimedOp] = DelayedOperationPurgatory("sparse")
    lateness: list[float] = []
    TimedOp.expiry_sink = lateness
    tick = 0.001
    start = loop.time()
    due_ticks: set[int] = set()
    for i in range(SPARSE_OPS):
        timeout = rng.uniform(*SPARSE_SPAN)
        now = loop.time()
        purgatory.try_complete_else_watch(TimedOp(timeout, now + timeout), [i])
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


def run(config: Config, log: Callable[[str], None]) -> dict[str, Any]:
    """The three scenarios, `config.idle_repeat` times each, each run on a fresh asyncio loop."""
    runs: dict[str, list[dict[str, Any]]] = {"empty": [], "one_far_deadline": [], "sparse": []}
    for index in range(config.idle_repeat):
        runs["empty"].append(asyncio.run(_passes_while_idle(None)))
        runs["one_far_deadline"].append(asyncio.run(_passes_while_idle(FAR_TIMEOUT)))
        runs["sparse"].append(asyncio.run(_sparse(config.seed + index)))
        log(
            f"  idle rep {index + 1}: wake-ups "
            + ", ".join(f"{name} {found[-1]['timer_passes']}" for name, found in runs.items())
        )
    figures = {
        f"idle {name}: wake-ups": figure([r["timer_passes"] for r in found], "wake-ups")
        for name, found in runs.items()
    }
    figures["idle sparse: wake-ups per due bucket"] = figure(
        [r["timer_passes"] / r["distinct_deadline_ticks"] for r in runs["sparse"]], "x"
    )
    return {"window_s": WINDOW, **runs, "figures": figures}
