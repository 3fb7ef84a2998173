"""What the exporters' histograms cost: CPU microseconds per operation, on and off.

``python -m benchmarks.histograms [--operations N] [--repeat R]`` runs `benchmarks.eventlog`'s
workload (rounds of 1,000 operations on a `ManualClock` purgatory, each watched on one of 100
keys, half completed by ``force_complete``, half expired by a timer pass) with no event log,
three ways: nothing tapped (the histograms off: the purgatory has no event sink at all), the
Prometheus collector's histograms (``histograms=HistogramBuckets()``: bucket counts per outcome
and the expiry lateness, kept from the event sink's batches), and OpenTelemetry's (the values
held for the SDK, without recording them: the SDK's own ``record`` is the application's cost,
measured separately, per value). Each way is timed `--repeat` times, alternating, in CPU time of the
process; the figure is the median's difference from the median with nothing tapped, per
operation, against the goal of 0.3 us. Wall-clock figures move with the machine's load, which
is printed beside them; ``python -m benchmarks.instructions --paths record_none
record_histograms`` gives the load-independent count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from purgatory import DelayedOperationPurgatory
from purgatory._histograms import ByName, HistogramBuckets, Tap
from purgatory.testing import ManualClock

from .ours import FlagOp

__all__ = ("GOAL_US", "main", "run")

ROUND = 1000
KEYS = [(f"k{i}",) for i in range(100)]
GOAL_US = 0.3
"""At most this many microseconds of histogram work per operation, when on."""


class _Held:
    """OpenTelemetry's side without an SDK: the values held as `purgatory.otel` holds them."""

    def __init__(self) -> None:
        self.held: list[float] = []

    def __call__(self, values: Any) -> None:
        for _, times in values.by_outcome():
            self.held += times
        self.held += values.lateness
        if len(self.held) > 2**16:
            self.held.clear()


def _purgatory(way: str) -> tuple[ManualClock, DelayedOperationPurgatory[FlagOp]]:
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[FlagOp]("bench", clock=clock)
    if way == "prometheus":
        ByName(HistogramBuckets()).tap(purgatory)
    elif way == "otel":
        purgatory._tap(Tap([_Held()]))
    return clock, purgatory


def run(way: str, operations: int) -> float:
    """CPU seconds of `operations` operations with the histograms `way` (off, prometheus,
    otel)."""
    clock, purgatory = _purgatory(way)
    watch = purgatory.try_complete_else_watch
    started = time.process_time()
    for _ in range(operations // ROUND):
        ops = [FlagOp(0.5) for _ in range(ROUND)]
        for i, op in enumerate(ops):
            watch(op, KEYS[i % 100])
        for op in ops[::2]:
            op.force_complete()
        clock.advance(1.0)
    return time.process_time() - started


def main(argv: list[str] | None = None, out: Callable[[str], object] = print) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.histograms",
        description="CPU microseconds per operation of the exporters' histograms, on and off.",
    )
    parser.add_argument("--operations", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    ways = ("off", "prometheus", "otel")
    run("prometheus", 2 * ROUND)  # warm-up: imports, caches
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(args.repeat):
        for way in ways:
            times[way].append(run(way, args.operations))
    off = statistics.median(times["off"])
    out(f"load average {os.getloadavg()[0]:.2f}; {args.operations:,} operations x {args.repeat}")
    out(f"{'off':12} {off / args.operations * 1e6:7.3f} us per operation (median)")
    for way in ways[1:]:
        median = statistics.median(times[way])
        extra = (median - off) / args.operations * 1e6
        verdict = "met" if extra <= GOAL_US else "NOT met"
        out(
            f"{way:12} {median / args.operations * 1e6:7.3f} us per operation, "
            f"+{extra:.3f} us for the histograms (goal <= {GOAL_US} us: {verdict}; "
            f"spread {min(times[way]) / args.operations * 1e6:.3f}-"
            f"{max(times[way]) / args.operations * 1e6:.3f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
