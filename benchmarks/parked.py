"""A million operations parked: the longest collector pause while scheduling them, and the bytes
each one costs, ours beside baseline A's.

``python -m benchmarks --only parked`` (``--parked-n`` to change N; about a minute and a half at
1e6). Per contender, each pass on a fresh loop, after a full collection:

1. **pauses**: schedule N operations in one synchronous burst, each on a key of its own with a
   timeout uniform in [`FAR`, `FAR` + 1 s] (so nothing falls due while they are parked: this is
   the scheduling alone), the cyclic GC enabled as in production. ``gc.callbacks`` time every
   collection (`measure.GcPauses`): the longest one is the pause a request waiting on the loop
   would see at that moment, the sum and the full collections beside it. Then the contender
   shuts down (every operation cancelled, untimed).
2. **bytes**: W2's memory pass (`w2.run_once`, tracemalloc): the traced bytes that scheduling
   the N operations allocated, divided by N, after a small warm-up batch; beside it, the bytes of
   the user's own object alone (`w2.user_object_bytes`).

Why: every object the collector tracks is traversed by each full collection, and at a million
parked operations a full collection is the longest stall an asyncio program sees while it
schedules. A (a Future, a TimerHandle, its arguments and a waiter per request) tracks several
objects per operation; the fewer a purgatory keeps, the shorter its pauses.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from .config import Config
from .contenders import Contender, run_on, w2_contenders
from .measure import GcPauses, Stopwatch, figure
from .w2 import W2Target, Workload, run_once, user_object_bytes

__all__ = ("CONTENDERS", "FAR", "run", "schedule_pauses")

FAR = 30.0
"""Seconds from the burst's start to the earliest deadline: nothing expires while parked."""
CONTENDERS = ("ours", "A")


async def _pauses(target: W2Target, work: Workload) -> dict[str, Any]:
    n = work.n
    out: list[Any] = [None] * n
    base = time.monotonic() + FAR
    deadlines = [base + u for u in work.offsets]
    gc.collect()
    with GcPauses() as pauses:
        clock = Stopwatch()
        target.schedule(work.keysets, deadlines, out)
        await target.settle()
        span = clock.stop()
    return {
        "n": n,
        "schedule_us": span.cpu / n * 1e6,
        "schedule_wall_s": span.wall,
        "gc_longest_s": pauses.longest,
        "gc_s": pauses.seconds,
        "gc_collections": pauses.collections,
        "gc_full_collections": pauses.full_collections,
    }


def schedule_pauses(contender: Contender[Any], work: Workload) -> dict[str, Any]:
    """Pass 1 for one contender on a fresh loop of its kind (see the module's docstring)."""

    async def main() -> dict[str, Any]:
        target: W2Target = contender.factory()
        try:
            return await _pauses(target, work)
        finally:
            await target.close()

    return run_on(contender.loop, main)


def run(config: Config, log: Callable[[str], None]) -> dict[str, Any]:
    """Both passes for ours and A at ``config.parked_n`` operations."""
    n = config.parked_n
    work = Workload.make(n, config.seed)
    contenders = [c for c in w2_contenders(with_uvloop=False) if c.name in CONTENDERS]
    results: dict[str, dict[str, Any]] = {}
    for contender in contenders:
        found = schedule_pauses(contender, work)
        log(
            f"    N={n:,} {contender.name:>4} schedule {found['schedule_us']:.2f} us/op  longest "
            f"GC pause {found['gc_longest_s'] * 1e3:.0f} ms  GC {found['gc_s']:.2f} s in "
            f"{found['gc_collections']} collections ({found['gc_full_collections']} full)"
        )
        memory = run_once(contender, work, FAR, memory=True)
        log(f"    N={n:,} {contender.name:>4} memory {memory['bytes_per_op']:.0f} B/op")
        results[contender.name] = {**found, "bytes_per_op": memory["bytes_per_op"]}
    return {
        "n": n,
        "far_s": FAR,
        "user_object_bytes": user_object_bytes(work),
        "contenders": results,
        "figures": {
            **{
                f"parked N={n:,} {who}: longest GC pause": figure([r["gc_longest_s"]], "s")
                for who, r in results.items()
            },
            **{
                f"parked N={n:,} {who}: bytes": figure([r["bytes_per_op"]], "B/op")
                for who, r in results.items()
            },
        },
    }
