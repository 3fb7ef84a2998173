"""The one measuring module: every figure of the suite is timed and summarised here.

Two ways to time, one way to summarise:

- **Microbenchmarks** (a function run again and again, no loop or a private one per run) are
  timed by pyperf, as pyperformance times its benchmarks: `pyperf_group` runs a group of
  `benchmarks.micro` in worker processes of its own (calibrated loops, warm-ups, several
  processes, so that one process's hash seed or memory layout does not decide the figure) and
  reads the values back. Each value is CPU seconds (`cpu_seconds`) per operation.
- **Open-loop workloads** on a real event loop (W1's rate search, W2's phases, idle wake-ups,
  the expiry rate) time their phases with a `Stopwatch` (CPU and wall) and report lateness
  through `lateness_ms`; they repeat themselves and hand the repetitions to `spread`.

CPU is ``time.process_time()`` (this process only, so the other jobs sharing the machine's two
cores inflate it less than wall time); wall is ``time.perf_counter()``. Every figure a run keeps
for comparison is a `figure`: a `spread` (n, median, quartiles, min, max) with its unit and
which direction is better.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

__all__ = (
    "Figure",
    "GcPauses",
    "PyperfSettings",
    "Span",
    "Stopwatch",
    "cpu_seconds",
    "figure",
    "lateness_ms",
    "pyperf_group",
    "quantile",
    "spread",
    "spread_field",
)

ROOT = Path(__file__).resolve().parent.parent

Figure = dict[str, Any]
"""A figure kept for comparison: ``{"unit", "better", "n", "median", "q1", "q3", "min", "max"}``."""


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-quantile (0 <= q <= 1) of an already sorted, non-empty sequence."""
    if not sorted_values:
        raise ValueError("quantile of an empty sequence")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def spread(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """n, median, quartiles (nearest rank), min and max of the values that are not ``None``.

    With no values every statistic is ``None`` (n = 0): a figure that was not measured, said so.
    """
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return {"n": 0, "median": None, "q1": None, "q3": None, "min": None, "max": None}
    return {
        "n": len(ordered),
        "median": statistics.median(ordered),
        "q1": quantile(ordered, 0.25),
        "q3": quantile(ordered, 0.75),
        "min": ordered[0],
        "max": ordered[-1],
    }


def spread_field(records: Sequence[dict[str, Any]], *path: str) -> dict[str, float | int | None]:
    """The `spread` over `records` of the number found at ``record[path[0]][path[1]]...``."""
    values: list[float | None] = []
    for record in records:
        value: Any = record
        for part in path:
            value = None if value is None else value.get(part)
        values.append(value)
    return spread(values)


def figure(
    values: Iterable[float | None] | dict[str, Any],
    unit: str,
    better: Literal["lower", "higher"] = "lower",
) -> Figure:
    """A figure for the results file: the spread of `values` (or a spread already made)."""
    summary = values if isinstance(values, dict) else spread(values)
    return {"unit": unit, "better": better, **summary}


def lateness_ms(values: Iterable[float]) -> dict[str, float | int | None]:
    """Summarise lateness samples (seconds) as n, p50, p99, max and min in milliseconds.

    A negative sample means the event fired early. With no samples the quantiles are ``None``.
    """
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "p50": None, "p99": None, "max": None, "min": None}
    return {
        "n": len(ordered),
        "p50": quantile(ordered, 0.50) * 1e3,
        "p99": quantile(ordered, 0.99) * 1e3,
        "max": ordered[-1] * 1e3,
        "min": ordered[0] * 1e3,
    }


@dataclass(frozen=True)
class Span:
    """CPU and wall seconds spent between two points."""

    cpu: float
    wall: float


class Stopwatch:
    """Reads both clocks when made and returns the `Span` since then at `stop`."""

    __slots__ = ("_cpu", "_wall")

    def __init__(self) -> None:
        self._cpu = time.process_time()
        self._wall = time.perf_counter()

    def stop(self) -> Span:
        """The span since construction."""
        return Span(time.process_time() - self._cpu, time.perf_counter() - self._wall)


def cpu_seconds(body: Callable[[], object]) -> float:
    """CPU seconds of one call of `body`, after a full collection (so that garbage left by the
    set-up is not collected on the body's time). The GC stays enabled: it is part of the cost."""
    gc.collect()
    started = time.process_time()
    body()
    return time.process_time() - started


class GcPauses:
    """Context manager that adds up the time and count of cyclic-GC collections inside it.

    GC stays enabled during every measurement (it is part of the real cost); this only reports
    how much of the cost it was, through ``gc.callbacks``.
    """

    __slots__ = ("_started", "collections", "full_collections", "longest", "seconds")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.longest = 0.0
        """The longest single collection, seconds: the pause a request waiting on the loop saw."""
        self.collections = 0
        self.full_collections = 0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            pause = time.perf_counter() - self._started
            self.seconds += pause
            self.longest = max(self.longest, pause)
            self.collections += 1
            if info.get("generation") == 2:
                self.full_collections += 1

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        gc.callbacks.remove(self._callback)


@dataclass(frozen=True)
class PyperfSettings:
    """How many worker processes, values per process and warm-ups pyperf runs per benchmark."""

    processes: int
    values: int
    warmups: int
    min_time: float
    """Seconds a value lasts at least: pyperf calibrates the number of loops to reach it."""


def pyperf_group(
    group: str, settings: PyperfSettings, *, quick: bool, seed: int
) -> dict[str, dict[str, float | int | None]]:
    """Run the microbenchmarks of `group` (``python -m benchmarks.micro GROUP``) under pyperf,
    at the ``--quick`` sizes if `quick`.

    Returns each benchmark's spread of CPU microseconds per operation, over every value of
    every worker process.
    """
    import pyperf

    with tempfile.TemporaryDirectory(prefix="purgatory-pyperf-") as scratch:
        output = Path(scratch) / f"{group}.json"
        command = [
            sys.executable,
            "-m",
            "benchmarks.micro",
            group,
            f"--seed={seed}",
            *(["--quick"] if quick else []),
            "--quiet",
            f"--output={output}",
            f"--processes={settings.processes}",
            f"--values={settings.values}",
            f"--warmups={settings.warmups}",
            f"--min-time={settings.min_time}",
        ]
        if "PYTHONPATH" in os.environ:  # pyperf's workers get a clean environment otherwise
            command.append("--inherit-environ=PYTHONPATH")
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(
                f"pyperf group {group!r} failed (exit {done.returncode}): {done.stderr[-2000:]}"
            )
        suite = pyperf.BenchmarkSuite.load(str(output))
    return {
        bench.get_name(): spread(value * 1e6 for value in bench.get_values())
        for bench in suite.get_benchmarks()
    }
