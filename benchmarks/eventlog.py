"""What recording costs: CPU microseconds per operation with each event log.

A real `DelayedOperationPurgatory` on a `ManualClock` (no loop: only the purgatory's and the
recorder's work is timed) runs rounds of 1,000 operations: each watched on one of 100 keys,
half of them completed by `force_complete`, the other half expired by a timer pass. The same
workload runs with no recorder, a do-nothing recorder (what the purgatory's two calls cost),
`JsonLinesEventLog` and `ArrowEventLog` (when pyarrow is installed), each writing to a fresh
temporary directory, anchored to the manual clock, so the per-batch anchor reads are in.
pyperf times them (``benchmarks.micro``, group ``eventlog``); a recorder's own cost is its median
minus the median without a recorder, and the goal is at most 1 us per operation. Bytes written
per operation are counted once, untimed, in a run that also checks the recorder lost nothing.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Callable
from typing import Any

from purgatory import DelayedOperationPurgatory, JsonLinesEventLog
from purgatory.testing import ManualClock

from .config import Config
from .measure import cpu_seconds, figure, pyperf_group
from .ours import FlagOp

__all__ = ("GOAL_US", "WRITERS", "NullLog", "recorders", "run", "sampler")

ROUND = 1000
KEYS = [f"k{i}" for i in range(100)]
WRITERS = frozenset({"json", "arrow"})
"""The recorders that write files (the others are the references they are measured against)."""
GOAL_US = 1.0
"""At most this many microseconds of recording per operation."""


class NullLog:
    """An event log that does nothing: what remains is the cost of the purgatory's calls."""

    def record_watch(self, *args: Any) -> None:
        pass

    def record_end(self, *args: Any) -> None:
        pass

    def flush(self) -> None:
        pass


def recorders() -> dict[str, str]:
    """Recorder kind -> what it is, for the kinds this environment can run."""
    found = {
        "none": "no recorder",
        "null": "a do-nothing recorder (the purgatory's two calls)",
        "json": "`JsonLinesEventLog`",
    }
    if importlib.util.find_spec("pyarrow") is not None:
        found["arrow"] = "`ArrowEventLog`"
    return found


def _make(kind: str, directory: str, clock: ManualClock) -> Any:
    if kind == "none":
        return None
    if kind == "null":
        return NullLog()
    if kind == "json":
        return JsonLinesEventLog(directory, clock=clock.now)
    from purgatory import ArrowEventLog

    return ArrowEventLog(directory, clock=clock.now)


def _workload(operations: int, clock: ManualClock, log: Any) -> None:
    purgatory = DelayedOperationPurgatory[FlagOp]("bench", clock=clock, event_log=log)
    watch = purgatory.try_complete_else_watch
    keys = KEYS
    for _ in range(operations // ROUND):
        ops = [FlagOp(0.5) for _ in range(ROUND)]
        for i, op in enumerate(ops):
            watch(op, [keys[i % 100]])
        for op in ops[::2]:
            op.force_complete()
        clock.advance(1.0)
    if log is not None:
        log.flush()


def sampler(kind: str, operations: int) -> Callable[[], float]:
    """One timed sample of `kind`: CPU seconds of `operations` operations, in a fresh directory."""

    def sample() -> float:
        with tempfile.TemporaryDirectory(prefix="purgatory-eventlog-") as directory:
            clock = ManualClock()
            log = _make(kind, directory, clock)
            return cpu_seconds(lambda: _workload(operations, clock, log))

    return sample


def _bytes_per_op(kind: str, operations: int) -> float:
    """Bytes `kind` writes per operation; refuses a run whose recorder lost or mis-anchored."""
    with tempfile.TemporaryDirectory(prefix="purgatory-eventlog-") as directory:
        clock = ManualClock()
        log = _make(kind, directory, clock)
        _workload(operations, clock, log)
        if log.anchor_error is not None or log.lost_lines:
            raise RuntimeError(f"{kind}: anchor_error {log.anchor_error!r}, lost {log.lost_lines}")
        return sum(entry.stat().st_size for entry in os.scandir(directory)) / operations


def run(config: Config, log: Callable[[str], None]) -> dict[str, Any]:
    """pyperf over every recorder this environment has, then the bytes each writes."""
    kinds = recorders()
    if "arrow" not in kinds:
        log("  pyarrow is not installed: ArrowEventLog is not measured (the arrow extra)")
    us = pyperf_group("eventlog", config.micro, quick=config.quick, seed=config.seed)
    base = us["none"]["median"]
    assert base is not None
    own = {kind: spread["median"] - base for kind, spread in us.items() if spread["median"]}
    return {
        "operations": config.eventlog_ops,
        "recorders": kinds,
        "us_per_op": us,
        "own_us_per_op": own,
        "bytes_per_op": {
            kind: _bytes_per_op(kind, config.eventlog_ops) for kind in kinds if kind in WRITERS
        },
        "figures": {f"eventlog {kind}": figure(spread, "us/op") for kind, spread in us.items()},
    }
