"""Where the schedule path (``try_complete_else_watch``) spends its time beyond the Floor.

``python -m benchmarks.breakdown [--n 100000] [--repeat 5]`` schedules N operations, each on a
key of its own with a timeout of 1-2 s, like W2's schedule phase, in a series of cumulative
variants: each one does the work of the previous one plus one step of the real path, on the
purgatory's own structures (its watcher map, its timing wheel, its clock), so the difference
between two rows is the price of that step at N pending:

- ``floor``: the Floor of W2: a slotted ``FloorOp`` and one dict insert per key.
- ``op``: construct the `BenchOp` (``DelayedOperation.__init__`` included), keep it in a list.
- ``+tries``: and call its synchronous ``try_complete`` twice, as Kafka's tryCompleteElseWatch.
- ``+register``: and put it on its key's watcher list (the plain registration of
  ``try_complete_else_watch``, copied: a key's lone watcher is stored as itself).
- ``+clock``: and read the purgatory's clock, deadline in ticks, as the real path does.
- ``+wheel``: and add it to the timing wheel at that tick.
- ``watch``: the public ``try_complete_else_watch`` itself; the difference to ``+wheel`` is the
  validation and bookkeeping around the steps (state checks, loop binding check, event-log hook,
  ``max_pending``, the reaper's wake-up check).
- ``watch at threshold``: the same with ``{key: threshold}``, the threshold path.

Every variant runs with the cyclic GC enabled (as in W2) and disabled; the difference is the GC's
share. CPU time (``time.process_time``) per operation, median over the repetitions. The variants
reach into private modules of the package (read only): that is the point of a breakdown.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from purgatory import DelayedOperationPurgatory
from purgatory._timer import _TICK_SLACK

from .baselines import FloorOp, FutureTimer, HeapFutureTimer, LeanFutureTimer
from .ours import BenchOp, OursTarget

__all__ = ("STEADY_COLUMNS", "VARIANTS", "main", "measure", "steady_state")

Variant = Callable[[Any, list[tuple[int]], list[float]], object]
"""Schedules N operations; returns what keeps them alive until the clock has stopped."""


def register(watchers: dict[Any, Any], op: BenchOp, keys: tuple[int]) -> None:
    """The plain registration of ``try_complete_else_watch`` (copied from the core, plain keys
    only): a key's lone watcher is the operation itself, a second one makes a dict."""
    for key in keys:
        ops = watchers.get(key)
        if ops is None:
            watchers[key] = op
        elif type(ops) is dict:
            ops[op] = None
        else:
            watchers[key] = {ops: None, op: None}
    op._keys = keys
    op._listed = len(keys)


def _floor(purgatory: Any, keysets: list[tuple[int]], timeouts: list[float]) -> object:
    watchers: dict[Any, dict[FloorOp, None]] = {}
    out = []
    for i, keys in enumerate(keysets):
        timeout = timeouts[i]
        op = FloorOp(timeout, timeout)
        for key in keys:
            ops = watchers.get(key)
            if ops is None:
                watchers[key] = {op: None}
            else:
                ops[op] = None
        out.append(op)
    return (watchers, out)


def _op(purgatory: Any, keysets: list[tuple[int]], timeouts: list[float]) -> object:
    out = []
    for i in range(len(keysets)):
        timeout = timeouts[i]
        out.append(BenchOp(timeout, timeout))
    return out


def _tries(purgatory: Any, keysets: list[tuple[int]], timeouts: list[float]) -> object:
    out = []
    for i in range(len(keysets)):
        timeout = timeouts[i]
        op = BenchOp(timeout, timeout)
        op.try_complete()
        op.try_complete()
        out.append(op)
    return out


def _register(purgatory: Any, keysets: list[tuple[int]], timeouts: list[float]) -> object:
    out = []
    watchers: dict[Any, Any] = {}  # a map of the same shape as the lists' own
    for i, keys in enumerate(keysets):
        timeout = timeouts[i]
        op = BenchOp(timeout, timeout)
        op.try_complete()
        register(watchers, op, keys)
        op.try_complete()
        out.append(op)
    return out


def _clock(purgatory: Any, keysets: list[tuple[int]], timeouts: list[float]) -> object:
    out = []
    watchers: dict[Any, Any] = {}  # a map of the same shape as the lists' own
    clock = purgatory._time
    tick = purgatory._tick
    ceil = math.ceil
    for i, keys in enumerate(keysets):
        timeout = timeouts[i]
        op = BenchOp(timeout, timeout)
        op.try_complete()
        register(watchers, op, keys)
        op.try_complete()
        op._deadline = ceil((clock() + op._timeout) / tick - _TICK_SLACK)
        out.append(op)
    return out


def _wheel(purgatory: Any, keysets: list[tuple[int]], timeouts: list[float]) -> object:
    out = []
    watchers: dict[Any, Any] = {}  # a map of the same shape as the lists' own
    clock = purgatory._time
    tick = purgatory._tick
    ceil = math.ceil
    add = purgatory._wheel.add
    for i, keys in enumerate(keysets):
        timeout = timeouts[i]
        op = BenchOp(timeout, timeout)
        op.try_complete()
        register(watchers, op, keys)
        op.try_complete()
        add(op, ceil((clock() + op._timeout) / tick - _TICK_SLACK))
        out.append(op)
    return out


def _watch(purgatory: Any, keysets: list[tuple[int]], timeouts: list[float]) -> object:
    out = []
    watch = purgatory.try_complete_else_watch
    for i, keys in enumerate(keysets):
        timeout = timeouts[i]
        op = BenchOp(timeout, timeout)
        watch(op, keys)
        out.append(op)
    return out


def _watch_threshold(purgatory: Any, keysets: list[tuple[int]], timeouts: list[float]) -> object:
    out = []
    watch = purgatory.try_complete_else_watch
    for i, keys in enumerate(keysets):
        timeout = timeouts[i]
        op = BenchOp(timeout, timeout)
        watch(op, dict.fromkeys(keys, timeout))
        out.append(op)
    return out


VARIANTS: dict[str, Variant] = {
    "floor": _floor,
    "op": _op,
    "+tries": _tries,
    "+register": _register,
    "+clock": _clock,
    "+wheel": _wheel,
    "watch": _watch,
    "watch at threshold": _watch_threshold,
}


def measure(variant: Variant, n: int, with_gc: bool) -> float:
    """CPU microseconds per operation of one run of `variant` over `n` fresh operations."""
    keysets = [(i,) for i in range(n)]
    timeouts = [1.0 + i / n for i in range(n)]

    async def main() -> float:
        purgatory: Any = DelayedOperationPurgatory("breakdown")
        # Bind the purgatory to this loop (and start its reaper) before the clock starts.
        purgatory.try_complete_else_watch(BenchOp(60.0, 60.0), ("warm",))
        gc.collect()
        if not with_gc:
            gc.disable()
        try:
            start = time.process_time()
            kept = variant(purgatory, keysets, timeouts)
            spent = time.process_time() - start
        finally:
            gc.enable()
        del kept
        await purgatory.shutdown()
        return spent / n * 1e6

    return asyncio.run(main())


STEADY_COLUMNS: dict[str, tuple[Callable[[], Any], str]] = {
    "ours force": (OursTarget, "force"),
    "ours key": (OursTarget, "key"),
    "ours threshold": (OursTarget, "threshold"),
    "A key": (FutureTimer, "key"),
    "A-lean key": (LeanFutureTimer, "key"),
    "A-heap thresh.": (HeapFutureTimer, "threshold"),
}
"""The steady-state table's columns: a W1 target (built on the running loop) and its mode."""


def steady_state(column: str, pending: int, ops: int, seed: int = 1) -> float:
    """CPU microseconds per request of W1's purgatory work without the driver's clock and loop.

    Requests arrive one per step, watch 3 of 100 keys and complete `pending` steps later on
    average (exponential), so about `pending` are watched at once, as in a W1 probe whose rate
    times mean latency is `pending`. The contender of `column` (`STEADY_COLUMNS`) is driven
    through the W1 interface: ``submit`` then ``force``, ``trigger`` (Kafka's
    ``check_and_complete(key)`` for ours) or ``submit_threshold`` then ``trigger_threshold``
    (watch at the completion step, ``check_and_complete(key, step)``). Timeouts are far away:
    this measures watching and completing, not expiry.
    """
    factory, mode = STEADY_COLUMNS[column]
    rng = random.Random(f"steady/{seed}")
    names = [f"key-{i}" for i in range(100)]
    keysets = [tuple(rng.sample(names, 3)) for _ in range(ops)]
    dues = [float(i + 1 + int(rng.expovariate(1.0 / pending))) for i in range(ops)]

    async def main() -> float:
        target: Any = factory()
        if mode == "threshold":
            submit, trigger = target.submit_threshold, target.trigger_threshold
        else:
            submit, trigger = target.submit, target.trigger
        force = target.force
        far = time.monotonic() + 3600.0
        heap: list[tuple[float, int, Any]] = []
        push, pop = heapq.heappush, heapq.heappop
        start = time.process_time()
        for i in range(ops):
            due = dues[i]
            push(heap, (due, i, submit(keysets[i], 3600.0, far, due)))
            while heap[0][0] <= i:
                due, j, req = pop(heap)
                if mode == "force":
                    force(req)
                else:
                    trigger(req, keysets[j][0], due)
        spent = time.process_time() - start
        await target.close()
        return spent / ops * 1e6

    return asyncio.run(main())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.breakdown", description=__doc__)
    parser.add_argument(
        "--n",
        type=int,
        default=100_000,
        help="operations pending at once (0: skip the schedule table)",
    )
    parser.add_argument("--repeat", type=int, default=5, help="repetitions per variant")
    parser.add_argument(
        "--pending",
        type=lambda text: [int(float(v)) for v in text.split(",")],
        default=[1_000, 3_000, 8_000],
        help="W1 steady-state table: requests watched at once (100 keys), e.g. 1000,8000",
    )
    args = parser.parse_args(argv)
    if args.n > 0:
        print(f"schedule path at N={args.n:,}: CPU us per operation, median of {args.repeat}")
        print(f"{'variant':<20} {'GC on':>8} {'step':>8} {'GC off':>8} {'step':>8}")
        previous = {True: 0.0, False: 0.0}
        watch_row = previous
        for name, variant in VARIANTS.items():
            row = {}
            for with_gc in (True, False):
                runs = [measure(variant, args.n, with_gc) for _ in range(args.repeat)]
                row[with_gc] = statistics.median(runs)
            base = watch_row if name == "watch at threshold" else previous
            steps = {g: row[g] - base[g] for g in row}
            if name == "op":  # not built on the row above
                steps = dict.fromkeys(row, math.nan)
            if name == "watch":
                watch_row = row
            print(
                f"{name:<20} {row[True]:>8.2f} {steps[True]:>+8.2f} "
                f"{row[False]:>8.2f} {steps[False]:>+8.2f}",
                flush=True,
            )
            if name != "watch at threshold":
                previous = row
    print()
    print("W1 steady state, 100 keys, 3 per request: CPU us per request (watch + complete)")
    print(f"{'pending':>8}" + "".join(f"{column:>16}" for column in STEADY_COLUMNS))
    for pending in args.pending:
        ops = max(100_000, 20 * pending)
        cells = [
            statistics.median(steady_state(column, pending, ops) for _ in range(args.repeat))
            for column in STEADY_COLUMNS
        ]
        print(f"{pending:>8,}" + "".join(f"{cell:>16.2f}" for cell in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
