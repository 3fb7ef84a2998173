"""Measurement helpers: quantiles, medians, CPU and wall stopwatches, GC pause accounting.

Every figure the suite reports goes through these few functions, so that "p99" or "CPU" mean the
same thing in W1 and W2. CPU is ``time.process_time()`` (this process only, so the other jobs
sharing the machine's two cores inflate it less than wall time); wall is ``time.perf_counter()``.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

__all__ = (
    "GcPauses",
    "Span",
    "Stopwatch",
    "lateness_ms",
    "median",
    "median_field",
    "quantile",
)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-quantile (0 <= q <= 1) of an already sorted, non-empty sequence."""
    if not sorted_values:
        raise ValueError("quantile of an empty sequence")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


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


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not ``None``; ``None`` if there are none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_field(records: Sequence[dict[str, Any]], *path: str) -> float | None:
    """The median over `records` of the number found at ``record[path[0]][path[1]]...``."""
    values: list[float | None] = []
    for record in records:
        value: Any = record
        for part in path:
            value = None if value is None else value.get(part)
        values.append(value)
    return median(values)


@dataclass(frozen=True)
class Span:
    """CPU and wall seconds spent between two points."""

    cpu: float
    wall: float


class Stopwatch:
    """Reads both clocks at `start` and returns the `Span` since then at `stop`."""

    __slots__ = ("_cpu", "_wall")

    def __init__(self) -> None:
        self._cpu = time.process_time()
        self._wall = time.perf_counter()

    def stop(self) -> Span:
        """The span since construction."""
        return Span(time.process_time() - self._cpu, time.perf_counter() - self._wall)


class GcPauses:
    """Context manager that adds up the time and count of cyclic-GC collections inside it.

    GC stays enabled during every measurement (it is part of the real cost); this only reports
    how much of the cost it was, through ``gc.callbacks``.
    """

    __slots__ = ("_started", "collections", "full_collections", "seconds")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self.full_collections = 0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
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
