"""``analyze --follow``: the ``windows/`` table of `analyze`, kept up to date by Structured
Streaming while recorders go on writing event logs into a directory.

The stream reads each event-log file once, when it is published (``purgatory-events``: the
recorders publish a file by renaming it whole), counts each operation's watch and end into the
windows of `analyze` (`window_events`, `window_counts`: the same arithmetic, so the same rows),
and writes a window when no more of its operations are expected: in Spark's append mode, once
the watermark has passed it. The watermark trails the newest window read by `watermark`
seconds; an operation that turns up later than that, in a window already written, is dropped
by Spark and counted (each batch's line says in how many windows). Every log must carry a UTC
anchor (the windows are UTC windows, shared by every process that writes into the directory).

Each micro-batch's new windows go to one Parquet file, ``windows/batch-<id>.parquet``, written
under a hidden name and renamed whole. With the checkpoint, a job that was killed and is started
again re-runs its unfinished micro-batch with the same input and the same state: it writes that
batch's file again, with the same rows, over the one it may have left, so no window is counted
twice or lost, for any Parquet reader. ``--once`` (Spark's available-now trigger) reads what is
there and stops, for a scheduler.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Callable
from typing import Any, Final

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ._datasource import EVENTS_FORMAT, register_data_sources
from ._frames import task_errors
from ._job_eventlog import WINDOW_KINDS, window_counts, window_events

__all__ = ("STATE_PARTITIONS", "WINDOWS_SCHEMA", "follow", "window_file")

#: The columns of ``windows/``, as batch `analyze` writes them.
WINDOWS_SCHEMA: Final = pa.schema(
    [
        ("purgatory", pa.string()),
        ("time_base", pa.string()),
        ("window_start", pa.float64()),
        ("window_utc", pa.timestamp("us", tz="UTC")),
        ("window_seconds", pa.float64()),
        *((kind, pa.int64()) for kind in WINDOW_KINDS),
    ]
)
_READ: Final = ("purgatory", "watched_at", "outcome", "ended_at", "utc_offset")
#: The most partitions the windows' state gets by default.
STATE_PARTITIONS: Final = 8
#: The name of the metrics each micro-batch reports: the windows it wrote.
_OBSERVED: Final = "purgatory_windows"


def window_file(out: str, batch_id: int) -> str:
    """Where micro-batch `batch_id` writes its windows."""
    return f"{out.rstrip('/')}/windows/batch-{batch_id:06d}.parquet"


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in path:
        path = os.path.abspath(path.removeprefix("file:"))
    fs, where = pafs.FileSystem.from_uri(path)
    return fs, str(where)


def _writer(out: str, seen: dict[int, list[dict[str, Any]]]) -> Callable[[DataFrame, int], None]:
    """The function each micro-batch's windows go through, run where Spark runs the query's
    driver: this process (classic: what it wrote is also kept in `seen`, for the report), or a
    Spark Connect server (a copy of it there: `seen` stays empty here)."""

    def write(batch: DataFrame, batch_id: int) -> None:
        table = batch.toArrow()
        if not table.num_rows:
            return
        table = table.select(WINDOWS_SCHEMA.names).cast(WINDOWS_SCHEMA)
        table = table.sort_by([("purgatory", "ascending"), ("window_start", "ascending")])
        seen[batch_id] = table.to_pylist()
        fs, target = _filesystem(window_file(out, batch_id))
        directory, _, name = target.rpartition("/")
        fs.create_dir(directory, recursive=True)
        staging = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}"
        with fs.open_output_stream(staging) as stream:
            pq.write_table(table, stream)
        fs.move(staging, target)  # whole, under the batch's own name: a re-run replaces it

    return write


def _delay(seconds: float) -> str:
    return f"{round(seconds * 1000)} milliseconds"


def follow(
    spark: SparkSession,
    log_path: str,
    out: str,
    checkpoint: str,
    *,
    window: float = 60.0,
    watermark: float = 120.0,
    once: bool = False,
    interval: float = 10.0,
    report: Callable[[dict[str, Any], list[dict[str, Any]] | None], None] | None = None,
    poll: float = 1.0,
    partitions: int | None = None,
) -> None:
    """Follow the event logs under `log_path` into ``out/windows/`` until stopped (`once`: until
    what is there now has been read).

    Args:
        window: Seconds per window (as `analyze`'s ``window``).
        watermark: How far behind the newest window read a window is written: once the newest
            window read ends `watermark` seconds or more after it ends. Operations of a window
            already written are dropped (and counted in the batch's progress).
        interval: Seconds between micro-batches (a processing-time trigger).
        report: Called after each micro-batch with its progress (Spark's JSON, as a dict) and
            the windows it wrote, as rows (``None`` if it wrote none).
        poll: Seconds between looks at the query's progress.
        partitions: The partitions of the windows' state (fixed by a new checkpoint; one kept
            says its own): default, the session's shuffle partitions up to `STATE_PARTITIONS`.
            Each micro-batch runs a task per partition, and the windows open at a time are
            few: Spark's default of 200 would make every micro-batch 200 small tasks.

    Raises:
        TraceError: A bad event log, or one without a UTC anchor (the query stops).
        ValueError: A window, watermark or interval that is not a finite number > 0 (>= 0 for
            the watermark).
    """
    for name, value, least in (("window", window, 0.0), ("interval", interval, 0.0)):
        if not (value > least and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    if not (watermark >= 0 and math.isfinite(watermark)):
        raise ValueError(f"watermark must be a finite number of seconds >= 0, got {watermark!r}")
    register_data_sources(spark)
    written: dict[int, list[dict[str, Any]]] = {}
    operations = (
        spark.readStream.format(EVENTS_FORMAT)
        .option("requireUtc", "true")
        .load(log_path)
        .select(*_READ)
    )
    # (The watermark is on each window's start: a window is written once the newest window
    # started `watermark` seconds after it, i.e. ended that long after it.)
    windows = window_counts(
        window_events(operations, window).withWatermark("window_utc", _delay(watermark)), window
    ).observe(_OBSERVED, F.count(F.lit(1)).alias("rows"))
    writer = (
        windows.writeStream.outputMode("append")
        .option("checkpointLocation", checkpoint)
        .foreachBatch(_writer(out, written))
    )
    writer = (
        writer.trigger(availableNow=True)
        if once
        else writer.trigger(processingTime=_delay(interval))
    )
    key = "spark.sql.shuffle.partitions"
    before = spark.conf.get(key)
    if partitions is None:
        partitions = min(int(before or STATE_PARTITIONS), STATE_PARTITIONS)
    with task_errors():
        spark.conf.set(key, str(partitions))  # (a query keeps what it started with)
        try:
            query = writer.start()
        finally:
            spark.conf.set(key, before or "200")
        try:
            _watch(spark, query, out, report=report, poll=poll, written=written)
        finally:
            if query.isActive:
                query.stop()


def _watch(
    spark: SparkSession,
    query: Any,
    out: str,
    *,
    report: Callable[[dict[str, Any], list[dict[str, Any]] | None], None] | None,
    poll: float,
    written: dict[int, list[dict[str, Any]]],
) -> None:
    """Report each finished micro-batch until the query ends (raising its error)."""
    seen = -1
    while True:
        ended = query.awaitTermination(poll)
        for progress in query.recentProgress:
            data = json.loads(progress.json)
            if data["batchId"] <= seen:
                continue
            seen = data["batchId"]
            rows = data.get("observedMetrics", {}).get(_OBSERVED, {}).get("rows", 0)
            if report is not None:
                report(data, _written(spark, out, seen, written) if rows else None)
        if ended:
            return


def _written(
    spark: SparkSession, out: str, batch_id: int, written: dict[int, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The windows micro-batch `batch_id` wrote: as it wrote them in this process, else read
    where they were written (a Spark Connect server wrote them)."""
    rows = written.pop(batch_id, None)
    if rows is not None:
        return rows
    frame = spark.read.parquet(window_file(out, batch_id)).orderBy("purgatory", "window_start")
    return [row.asDict() for row in frame.collect()]
