"""The manifest: every workload of the suite, in the order a run takes them.

Like pyperformance's ``MANIFEST``, one table names every benchmark; ``python -m benchmarks
--help`` lists it and ``--only`` picks from it. A workload is a function
``run(config, log) -> dict`` whose result holds its ``figures`` (the spreads a comparison reads,
see `benchmarks.measure.figure`) beside whatever its report section needs. Modules are imported
only when their workload runs, so ``--help`` works without the optional extras (pyarrow, pyspark,
valgrind) that some of them need.

Three workloads belong to modules with their own command line, run here through their
``main``: ``instructions`` (``benchmarks.instructions``, instruction counts under callgrind),
``pipeline`` (``benchmarks.pipeline``, replay on Spark) and ``load-validation``
(``benchmarks.load_validation``, the pipeline's load model against a real loop). Their output
is kept in the results file as they print it; the instruction counts are also read from it as
figures.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import Config
from .measure import figure

__all__ = ("ALIASES", "WORKLOADS", "Workload", "select")

Log = Callable[[str], None]


@dataclass(frozen=True)
class Workload:
    """A named benchmark: what it measures, and where its ``run`` function is."""

    name: str
    summary: str
    target: str
    """``module:function`` inside ``benchmarks``; called as ``function(config, log, *args)``."""
    args: tuple[str, ...] = ()

    def run(self, config: Config, log: Log) -> dict[str, Any]:
        module, function = self.target.split(":")
        found: Callable[..., dict[str, Any]] = getattr(
            importlib.import_module(f"benchmarks.{module}"), function
        )
        return found(config, log, *self.args)


W = Workload
WORKLOADS: tuple[Workload, ...] = (
    W("w1-force", "W1, completion by force_complete: max rate, ours vs A", "w1:run", ("force",)),
    W("w1-key", "W1, completion by check_and_complete(key): max rate", "w1:run", ("key",)),
    W("w1-threshold", "W1 with thresholds: max rate, ours vs A, A-heap", "w1:run", ("threshold",)),
    W("w2", "N pending (1e3-1e6): schedule, complete, expire, memory", "w2:run"),
    W("parked", "1e6 parked: longest GC pause while scheduling, bytes/op, ours vs A", "parked:run"),
    W("idle", "reaper wake-ups with nothing or little due", "idle:run"),
    W("expiry-rate", "expirations/s one core sustains, p99 late <= 5 ms", "expiry_rate:run"),
    W("w1-virtual", "pyperf: W1 in virtual time, CPU per request", "micro:run", ("w1-virtual",)),
    W("expiry-cost", "pyperf: CPU of one expiry in a timer pass", "micro:run", ("expiry-cost",)),
    W("steady", "pyperf: W1's steady state per request, ours and A", "micro:run", ("steady",)),
    W("eventlog", "pyperf: recording cost per operation, each event log", "eventlog:run"),
    W("instructions", "callgrind counts of the hot paths (valgrind)", "workloads:instructions"),
    W(
        "pipeline-engine",
        "the replay engine alone, no Spark: operations/s per core",
        "pipeline:run_engine",
    ),
    W("pipeline", "Spark replay throughput (the spark extra, Java 17)", "workloads:pipeline"),
    W("load-validation", "the replay's load model vs a real loop", "workloads:load_validation"),
)
del W

ALIASES: dict[str, tuple[str, ...]] = {
    "w1": ("w1-force", "w1-key", "w1-threshold"),
    "micro": ("w1-virtual", "expiry-cost", "steady", "eventlog"),
}


def select(text: str) -> tuple[Workload, ...]:
    """The workloads a comma-separated ``--only`` value names (aliases expanded), in run order.

    Raises:
        ValueError: a name that is neither a workload nor an alias, or no name at all.
    """
    names = {w.name for w in WORKLOADS}
    chosen: set[str] = set()
    for part in (p.strip().lower() for p in text.split(",")):
        if part in ALIASES:
            chosen.update(ALIASES[part])
        elif part in names:
            chosen.add(part)
        elif part:
            raise ValueError(f"unknown workload {part!r}; choose from {', '.join(sorted(names))}")
    if not chosen:
        raise ValueError("--only needs at least one workload")
    return tuple(w for w in WORKLOADS if w.name in chosen)


# -- the modules with a command line of their own ---------------------------------------------


class _Tee(io.StringIO):
    """Keeps what is printed and passes it on to stderr, where the run's progress goes."""

    def write(self, text: str) -> int:
        sys.stderr.write(text)
        return super().write(text)


def _through_main(main: Callable[[list[str]], int], argv: list[str]) -> dict[str, Any]:
    """Call a module's ``main(argv)``; its printed output, kept."""
    out = _Tee()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    if status:
        raise RuntimeError(f"exited with status {status}")
    return {"argv": argv, "output": out.getvalue(), "figures": {}}


INSTRUCTION_LINE = re.compile(r"^(\w+)\s+([\d,]+) instructions per operation$", re.MULTILINE)


def instructions(config: Config, log: Log) -> dict[str, Any]:
    from . import instructions as module

    argv = ["--short", "500", "--long", "1500"] if config.quick else []
    found = _through_main(module.main, argv)
    counts = {
        path: int(n.replace(",", "")) for path, n in INSTRUCTION_LINE.findall(found["output"])
    }
    if not counts:
        raise RuntimeError("no 'PATH N instructions per operation' line in its output")
    found["figures"] = {
        f"instructions {path}": figure([n], "instructions/op") for path, n in counts.items()
    }
    return found


def pipeline(config: Config, log: Log) -> dict[str, Any]:
    from . import pipeline as module

    quick = ["--operations", "200000", "--engine-operations", "20000", "--repetitions", "2"]
    return _through_main(module.main, quick if config.quick else [])


def load_validation(config: Config, log: Log) -> dict[str, Any]:
    from . import load_validation as module

    return _through_main(module.main, ["--quick", "--seconds", "0.5"] if config.quick else [])
