"""What checking a valid trace costs: `load_trace` now against the single aggregation it replaced.

``python -m benchmarks.validation [--operations 2000000] [--repetitions 3]`` (needs the
``spark`` extra and Java 17). It writes a seeded W1 trace of ``--operations`` operations (8
purgatories, as `benchmarks.pipeline` does) and, on one ``local[1]`` session, times the call to
`purgatory.pipeline.load_trace` (which runs its checks eagerly) against the baseline kept here,
`_load_trace_reference`: the same reading, column and type checks, then the one aggregation that
checked both bad rows and duplicate ids before (``groupBy(purgatory, op_id)`` with a count,
``first`` of the problem and of the row, and ``collect_set`` of the file), as it was in
``purgatory/pipeline/_job_trace.py``. Also timed: each of the two checks of `load_trace` alone, and
``one-scan``, both checks in one hash aggregation (a count and a bad-row flag per id hash),
the alternative measured against splitting them.

One warm-up of each, then ``--repetitions`` rounds alternating them; medians and ratios to the
reference. Absolute times on this shared 2-core machine drift with the other users' load (the
load average is printed before and after).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .environment import describe_environment, load_average


def _load_trace_reference(spark: Any, path: str) -> Any:
    """The previous `load_trace`: one aggregation by id for bad rows and duplicates alike."""
    from pyspark.sql import functions as F

    from purgatory.pipeline import TraceError, _job_trace

    trace = _job_trace._cast(_job_trace._read_trace(spark, path), file=True)
    found = (
        trace.withColumn("_problem", _job_trace._row_problem(()))
        .groupBy("purgatory", "op_id")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.first("_problem", ignorenulls=True).alias("problem"),
            F.first(
                F.when(F.col("_problem").isNotNull(), F.struct(*_job_trace._ROW)), ignorenulls=True
            ).alias("row"),
            F.collect_set("_file").alias("files"),
        )
        .where(F.col("problem").isNotNull() | (F.col("n") > 1))
        .orderBy(F.col("problem").isNull(), "purgatory", "op_id")
        .limit(5)
        .collect()
    )
    if found:
        raise TraceError(f"reference: {found[0]}")
    return trace.drop("_file")


def _one_scan(spark: Any, path: str) -> None:
    """Both checks in one scan: per id hash, a count and whether any row is bad."""
    from pyspark.sql import functions as F

    from purgatory.pipeline import TraceError, _job_trace

    trace = _job_trace._cast(_job_trace._read_trace(spark, path))
    problem = _job_trace._row_problem(())
    (found,) = (
        trace.select(
            _job_trace.id_hash().alias("_hash"), problem.isNotNull().cast("int").alias("_bad")
        )
        .groupBy("_hash")
        .agg(F.count(F.lit(1)).alias("n"), F.max("_bad").alias("bad"))
        .agg(F.max("n").alias("n"), F.max("bad").alias("bad"))
        .collect()
    )
    if found["bad"] or found["n"] > 1:
        raise TraceError(f"one-scan: {found}")


def _rows_only(spark: Any, path: str) -> None:
    from purgatory.pipeline import _job_trace

    with_file = _job_trace._cast(_job_trace._read_trace(spark, path), file=True)
    _job_trace._check_rows(with_file, _job_trace._row_problem(()), path)


def _ids_only(spark: Any, path: str) -> None:
    from purgatory.pipeline import _job_trace

    raw = _job_trace._read_trace(spark, path)
    _job_trace._check_unique_ids(_job_trace._cast(raw), _job_trace._cast(raw, file=True), path)


def _timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.validation")
    parser.add_argument("--operations", type=int, default=2_000_000)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--work", default=None, help="directory for the trace (default: temp)")
    args = parser.parse_args(argv)

    from purgatory.pipeline import W1, generate, get_session, load_trace

    env = describe_environment()
    print(
        f"{env['date']}; Python {env['python']}, {env['cpu_model']}, {env['cpu_count']} CPUs "
        f"(shared); {env['git']}; load before {load_average()}"
    )
    work = Path(args.work or tempfile.mkdtemp(prefix="purgatory-validation-"))
    trace = str(work / "trace")
    w1 = W1(purgatories=8, operations=args.operations // 8, chunk=250_000)
    spark = get_session(
        "local[1]",
        "purgatory-bench-validation",
        {"spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false"},
    )
    seconds = _timed(lambda: generate(spark, w1, trace, overwrite=True))
    print(f"generated {w1.purgatories * w1.operations:,} operations in {seconds:.1f} s (local[1])")

    variants: dict[str, Callable[[], object]] = {
        "reference": lambda: _load_trace_reference(spark, trace),
        "load_trace": lambda: load_trace(spark, trace),
        "rows only": lambda: _rows_only(spark, trace),
        "ids only": lambda: _ids_only(spark, trace),
        "one-scan": lambda: _one_scan(spark, trace),
    }
    for run in variants.values():
        run()  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repetitions):
        for name, run in variants.items():
            samples[name].append(_timed(run))
    spark.stop()

    reference = statistics.median(samples["reference"])
    print(f"load after {load_average()}; medians of {args.repetitions}, local[1]:")
    for name, values in samples.items():
        median = statistics.median(values)
        print(
            f"  {name:<11} {median:7.2f} s  {reference / median:5.2f}x faster than reference  "
            f"({', '.join(f'{x:.2f}' for x in values)})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
