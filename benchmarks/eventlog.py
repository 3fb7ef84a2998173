"""What recording costs: microseconds per operation with each event log, in one run.

``python -m benchmarks.eventlog [--operations 200000] [--repetitions 5]``

A real `DelayedOperationPurgatory` on a `ManualClock` (no loop: only the purgatory's and the
recorder's work is timed) runs rounds of 1,000 operations: each watched on one of 100 keys,
half of them completed by `force_complete`, the other half expired by a timer pass. The same
workload runs with no recorder, a do-nothing recorder (what the purgatory's two calls cost),
`JsonLinesEventLog` and `ArrowEventLog` (writing to a temporary directory, anchored to the
manual clock, so the per-batch anchor reads are in), alternated, ``--repetitions`` times each.
Reported: the median CPU time per operation, the recorder's own cost (minus the no-recorder
run), each as a ratio to the no-recorder run, and the bytes written per operation.

``--compare-tree DIR`` also times `JsonLinesEventLog` (and no recorder) of another checkout of the
project (for instance ``git archive <commit> | tar -x -C DIR``) in child processes, alternated
with the same in a child process of this tree: what a change of the recorder saved.

Absolute times on this shared 2-core machine drift with the other users' load (reported); the
ratios come from runs interleaved in the same process, minutes apart at most.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from purgatory import ArrowEventLog, DelayedOperation, DelayedOperationPurgatory, JsonLinesEventLog
from purgatory.testing import ManualClock

from .environment import load_average

ROUND = 1000
KEYS = [f"k{i}" for i in range(100)]


class _Op(DelayedOperation[None]):
    __slots__ = ()

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        return None

    def on_expiration(self) -> None:
        pass


class _NullLog:
    """An event log that does nothing: what remains is the cost of the purgatory's calls."""

    def record_watch(self, *args: Any) -> None:
        pass

    def record_end(self, *args: Any) -> None:
        pass

    def flush(self) -> None:
        pass


def run(operations: int, make_log: Callable[[ManualClock], Any] | None) -> tuple[float, Any]:
    """CPU seconds of `operations` operations (a purgatory, and its recorder if any)."""
    clock = ManualClock()
    log = None if make_log is None else make_log(clock)
    purgatory = DelayedOperationPurgatory[_Op]("bench", clock=clock, event_log=log)
    keys = KEYS
    started = time.process_time()
    for _ in range(operations // ROUND):
        ops = [_Op(0.5) for _ in range(ROUND)]
        for i, op in enumerate(ops):
            purgatory.try_complete_else_watch(op, [keys[i % 100]])
        for op in ops[::2]:
            op.force_complete()
        clock.advance(1.0)
    if log is not None:
        log.flush()
    seconds = time.process_time() - started
    return seconds, log


def _written(directory: str) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(directory))


def _recorder(name: str, directory: str) -> Callable[[ManualClock], Any]:
    """Make a recorder of `name` ("json" or "arrow") in `directory`, on the manual clock."""
    kind = ArrowEventLog if "arrow" in name.lower() else JsonLinesEventLog

    def make(clock: ManualClock) -> Any:
        return kind(directory, clock=clock.now)

    return make


def measure(operations: int, repetitions: int) -> dict[str, Any]:
    """The four runs, alternated; medians and bytes per operation."""
    samples: dict[str, list[float]] = {"none": [], "null": [], "json": [], "arrow": []}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as root:
        makers: dict[str, Callable[[ManualClock], Any] | None] = {
            "none": None,
            "null": lambda clock: _NullLog(),
        }
        for kind in (None, JsonLinesEventLog, ArrowEventLog):  # warm-up (imports, caches)
            warm = os.path.join(root, f"warm-{getattr(kind, '__name__', 'none')}")
            run(ROUND * 20, None if kind is None else _recorder(kind.__name__, warm))
        for rep in range(repetitions):
            for name in ("json", "arrow"):
                makers[name] = _recorder(name, os.path.join(root, f"{name}-{rep}"))
            for name, make in makers.items():
                seconds, log = run(operations, make)
                samples[name].append(seconds)
                if name in ("json", "arrow"):
                    assert log.anchor_error is None, log.anchor_error
                    assert log.lost_lines == 0
                    sizes[name] = _written(os.path.join(root, f"{name}-{rep}"))
    us = {name: statistics.median(values) / operations * 1e6 for name, values in samples.items()}
    return {
        "operations": operations,
        "us_per_op": us,
        "bytes_per_op": {name: size / operations for name, size in sizes.items()},
        "samples": samples,
    }


_CHILD = """
import sys, tempfile, time
from purgatory import DelayedOperation, DelayedOperationPurgatory, JsonLinesEventLog
from purgatory.testing import ManualClock

class Op(DelayedOperation[None]):
    def try_complete(self): return False
    def on_complete(self): return None
    def on_expiration(self): pass

def run(n, log):
    clock = ManualClock()
    p = DelayedOperationPurgatory("bench", clock=clock, event_log=log)
    keys = [f"k{i}" for i in range(100)]
    started = time.process_time()
    for _ in range(n // 1000):
        ops = [Op(0.5) for _ in range(1000)]
        for i, op in enumerate(ops):
            p.try_complete_else_watch(op, [keys[i % 100]])
        for op in ops[::2]:
            op.force_complete()
        clock.advance(1.0)
    if log is not None:
        log.flush()
    return time.process_time() - started

n = int(sys.argv[1])
with tempfile.TemporaryDirectory() as d:
    run(20000, JsonLinesEventLog(d + "/warm"))
    none = run(n, None)
    json = run(n, JsonLinesEventLog(d + "/run"))
print(none / n * 1e6, json / n * 1e6)
"""


def compare_trees(tree: str, operations: int, repetitions: int) -> dict[str, list[float]]:
    """`JsonLinesEventLog`'s own us/op in `tree` and in this tree, child processes alternated."""
    here = str(Path(__file__).resolve().parent.parent)
    out: dict[str, list[float]] = {"other": [], "this": []}
    for _ in range(repetitions):
        for name, path in (("other", tree), ("this", here)):
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, str(operations)],
                env={**os.environ, "PYTHONPATH": path},
                capture_output=True,
                text=True,
                check=True,
            )
            none, json = map(float, done.stdout.split())
            out[name].append(json - none)
    return out


def report(figures: dict[str, Any]) -> str:
    us = figures["us_per_op"]
    base = us["none"]
    rows = [
        "| recorder | us/op (whole run) | vs no recorder | recorder's own us/op | bytes/op |",
        "|---|---|---|---|---|",
    ]
    labels = {
        "none": "none",
        "null": "do-nothing (the purgatory's two calls)",
        "json": "`JsonLinesEventLog`",
        "arrow": "`ArrowEventLog`",
    }
    for name, label in labels.items():
        size = figures["bytes_per_op"].get(name)
        rows.append(
            f"| {label} | {us[name]:.2f} | {us[name] / base:.2f}x | "
            f"{us[name] - base:+.2f} | {'-' if size is None else f'{size:.0f}'} |"
        )
    samples = "; ".join(
        f"{name}: {', '.join(f'{v:.3f}' for v in values)}"
        for name, values in figures["samples"].items()
    )
    return "\n".join(rows) + f"\n\nSamples (CPU s per run of {figures['operations']:,}): {samples}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.eventlog")
    parser.add_argument("--operations", type=int, default=200_000)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--compare-tree", default=None, help="another checkout: JSON Lines cost")
    args = parser.parse_args(argv)
    before = load_average()
    figures = measure(args.operations, args.repetitions)
    print(f"load before/after: {before} / {load_average()}")
    print(report(figures))
    if args.compare_tree:
        costs = compare_trees(args.compare_tree, args.operations, args.repetitions)
        other, this = (statistics.median(costs[k]) for k in ("other", "this"))
        print(
            f"\nJsonLinesEventLog's own cost, child processes alternated: {other:.2f} us/op in "
            f"{args.compare_tree}, {this:.2f} us/op here ({this / other:.2f}x); samples: "
            f"{', '.join(f'{v:.2f}' for v in costs['other'])} / "
            f"{', '.join(f'{v:.2f}' for v in costs['this'])}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
