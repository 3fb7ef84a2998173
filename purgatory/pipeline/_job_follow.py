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

With ``stuck``, a second query of the same files (its checkpoint ``<checkpoint>/stuck``)
reports the operations whose end has not come by their deadline plus a grace into
``stuck/batch-<id>.parquet``, written the same way (``._job_stuck`` says how).
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ._datasource import EVENTS_FORMAT, register_data_sources
from ._frames import task_errors
from ._job_eventlog import WINDOW_KINDS, window_counts, window_events
from ._job_stuck import (
    ROCKSDB,
    STUCK_SCHEMA,
    grace_from_lateness,
    input_counts,
    stuck_operations,
    warn_without_watch_records,
)

__all__ = ("STATE_PARTITIONS", "WINDOWS_SCHEMA", "follow", "stuck_file", "window_file")

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
#: The name of the metrics each micro-batch reports: the windows (reports) it wrote.
_OBSERVED: Final = "purgatory_windows"
_OBSERVED_STUCK: Final = "purgatory_stuck"
_OBSERVED_STUCK_INPUT: Final = "purgatory_stuck_input"
#: Where the grace of a checkpoint's stuck query is kept (a restart keeps its timers' grace).
_GRACE_FILE: Final = "stuck/grace.json"


def window_file(out: str, batch_id: int) -> str:
    """Where micro-batch `batch_id` writes its windows."""
    return f"{out.rstrip('/')}/windows/batch-{batch_id:06d}.parquet"


def stuck_file(out: str, batch_id: int) -> str:
    """Where micro-batch `batch_id` of the stuck query writes its reports."""
    return f"{out.rstrip('/')}/stuck/batch-{batch_id:06d}.parquet"


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in path:
        path = os.path.abspath(path.removeprefix("file:"))
    fs, where = pafs.FileSystem.from_uri(path)
    return fs, str(where)


def _writer(
    out: str,
    seen: dict[int, list[dict[str, Any]]],
    schema: pa.Schema = WINDOWS_SCHEMA,
    where: Callable[[str, int], str] = window_file,
    order: tuple[str, ...] = ("purgatory", "window_start"),
) -> Callable[[DataFrame, int], None]:
    """The function each micro-batch's windows (or reports) go through, run where Spark runs
    the query's driver: this process (classic: what it wrote is also kept in `seen`, for the
    report), or a Spark Connect server (a copy of it there: `seen` stays empty here)."""

    def write(batch: DataFrame, batch_id: int) -> None:
        table = batch.toArrow()
        if not table.num_rows:
            return
        table = table.select(schema.names).cast(schema)
        table = table.sort_by([(name, "ascending") for name in order])
        seen[batch_id] = table.to_pylist()
        fs, target = _filesystem(where(out, batch_id))
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
    stuck: bool = False,
    grace: float | None = None,
    tick: float = 0.001,
    report_stuck: Callable[[dict[str, Any], list[dict[str, Any]] | None], None] | None = None,
) -> float | None:
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
        stuck: Also report the operations whose end has not come by their deadline plus
            `grace` into ``out/stuck/`` (a second query, checkpoint ``<checkpoint>/stuck``;
            the logs need watch records: recorders made with ``watch_records=True``).
        grace: Seconds past its deadline an operation may end unreported. Default: the one
            the checkpoint keeps, else `GRACE_TICKS` ticks of `tick` seconds plus the p99 of
            how late the expired operations of the logs already there ended (measured once,
            when the checkpoint is new, then kept in it: a restart reports by the same rule).
        tick: The purgatories' tick, for the default grace.
        report_stuck: As `report`, for the stuck query's micro-batches and reports.

    Returns:
        The grace the stuck query used (``None`` without `stuck`).

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
    operations = (
        spark.readStream.format(EVENTS_FORMAT)
        .option("requireUtc", "true")
        .load(log_path)
        .select(*_READ)
    )
    used: float | None = None
    if stuck:
        used = _grace(spark, log_path, checkpoint, grace, tick)
    # (The watermark is on each window's start: a window is written once the newest window
    # started `watermark` seconds after it, i.e. ended that long after it.)
    windows = window_counts(
        window_events(operations, window).withWatermark("window_utc", _delay(watermark)), window
    ).observe(_OBSERVED, F.count(F.lit(1)).alias("rows"))
    written: dict[int, list[dict[str, Any]]] = {}
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
    watched: list[_Watched] = []
    with task_errors():
        try:
            spark.conf.set(key, str(partitions))  # (a query keeps what it started with)
            try:
                watched.append(
                    _Watched(writer.start(), report=report, written=written, where=window_file)
                )
                if used is not None:
                    watched.append(
                        _start_stuck(
                            spark,
                            log_path=log_path,
                            out=out,
                            checkpoint=checkpoint,
                            grace=used,
                            watermark=watermark,
                            window=window,
                            once=once,
                            interval=interval,
                            report=report_stuck,
                        )
                    )
            finally:
                spark.conf.set(key, before or "200")
            _watch(spark, watched, out, poll=poll)
        finally:
            for one in watched:
                if one.query.isActive:
                    one.query.stop()
    return used


class _Watched:
    """A running query, what it wrote in this process and whom to tell of each batch."""

    def __init__(
        self,
        query: Any,
        *,
        report: Callable[[dict[str, Any], list[dict[str, Any]] | None], None] | None,
        written: dict[int, list[dict[str, Any]]],
        where: Callable[[str, int], str],
        observed: str = _OBSERVED,
        order: tuple[str, ...] = ("purgatory", "window_start"),
        inputs: str | None = None,
    ) -> None:
        """`inputs`: the name under which a stuck query counts its input (`input_counts`)."""
        self.query = query
        self.report = report
        self.written = written
        self.where = where
        self.observed = observed
        self.order = order
        self.seen = -1
        self.ended = False
        self.inputs = inputs
        self.counted = {"records": 0, "watches": 0}
        self.warned = False

    def count(self, observed: Mapping[str, Any]) -> None:
        """Add a micro-batch's input counts; say once if no watch record came with records."""
        if self.inputs is None or self.warned:
            return
        for name, value in observed.get(self.inputs, {}).items():
            if name in self.counted:
                self.counted[name] += int(value or 0)
        self.warned = warn_without_watch_records(self.counted)


def _start_stuck(
    spark: SparkSession,
    *,
    log_path: str,
    out: str,
    checkpoint: str,
    grace: float,
    watermark: float,
    window: float,
    once: bool,
    interval: float,
    report: Callable[[dict[str, Any], list[dict[str, Any]] | None], None] | None,
) -> _Watched:
    """Start the stuck query: its own read of the files (with watch records), its own
    checkpoint, the RocksDB state store (set for its start only: a query keeps it)."""
    records = (
        spark.readStream.format(EVENTS_FORMAT)
        .option("requireUtc", "true")
        .option("watchRecords", "true")
        .load(log_path)
        .observe(_OBSERVED_STUCK_INPUT, *input_counts())
    )
    reports = stuck_operations(records, grace=grace, watermark=watermark, window=window).observe(
        _OBSERVED_STUCK, F.count(F.lit(1)).alias("rows")
    )
    written: dict[int, list[dict[str, Any]]] = {}
    order = ("purgatory", "deadline_utc", "id", "status")
    writer = (
        reports.writeStream.outputMode("append")
        .option("checkpointLocation", f"{checkpoint.rstrip('/')}/stuck")
        .foreachBatch(_writer(out, written, STUCK_SCHEMA, stuck_file, order))
    )
    writer = (
        writer.trigger(availableNow=True)
        if once
        else writer.trigger(processingTime=_delay(interval))
    )
    key = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(key, None)
    spark.conf.set(key, ROCKSDB)
    try:
        query = writer.start()
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    return _Watched(
        query,
        report=report,
        written=written,
        where=stuck_file,
        observed=_OBSERVED_STUCK,
        order=order,
        inputs=_OBSERVED_STUCK_INPUT,
    )


def _grace(
    spark: SparkSession, log_path: str, checkpoint: str, grace: float | None, tick: float
) -> float:
    """The stuck query's grace: `grace`, else the checkpoint's, else measured (and kept)."""
    if grace is not None:
        if not (grace >= 0 and math.isfinite(grace)):
            raise ValueError(f"grace must be a finite number of seconds >= 0, got {grace!r}")
        return grace
    fs, where = _filesystem(f"{checkpoint.rstrip('/')}/{_GRACE_FILE}")
    if fs.get_file_info(where).type == pafs.FileType.File:
        with fs.open_input_stream(where) as stream:
            kept: float = json.loads(stream.read())["grace"]
        return kept
    register_data_sources(spark)
    with task_errors():
        measured, p99 = grace_from_lateness(spark.read.format(EVENTS_FORMAT).load(log_path), tick)
    fs.create_dir(where.rpartition("/")[0], recursive=True)
    with fs.open_output_stream(where) as stream:
        stream.write(json.dumps({"grace": measured, "tick": tick, "p99_lateness": p99}).encode())
    return measured


def _watch(spark: SparkSession, watched: list[_Watched], out: str, *, poll: float) -> None:
    """Report each finished micro-batch of each query until they all end (raising the first
    error)."""
    while True:
        for one in watched:
            if one.ended:
                continue
            one.ended = one.query.awaitTermination(poll / len(watched))
            for progress in one.query.recentProgress:
                data = progress_of(json.loads(progress.json))
                if data["batchId"] <= one.seen:
                    continue
                one.seen = data["batchId"]
                observed = data.get("observedMetrics", {})
                one.count(observed)
                rows = observed.get(one.observed, {}).get("rows", 0)
                if one.report is not None:
                    one.report(data, _written(spark, out, one.seen, one) if rows else None)
        if all(one.ended for one in watched):
            return


def progress_of(data: dict[str, Any]) -> dict[str, Any]:
    """A micro-batch's progress (Spark's JSON) in the classic session's form, whichever
    session gave it: a Spark Connect client's lacks the batch's ``numInputRows`` (its sources
    have theirs) and gives each observed metric as ``{"values": [...], "schema": {...}}``
    instead of by name. Read as they come, a follow job on Spark Connect said "0 operations
    read" of every batch and never printed a window it wrote."""
    data = dict(data)
    if "numInputRows" not in data:
        data["numInputRows"] = sum(s.get("numInputRows") or 0 for s in data.get("sources", []))
    data["observedMetrics"] = {
        name: _by_name(metric) for name, metric in (data.get("observedMetrics") or {}).items()
    }
    return data


def _by_name(metric: Mapping[str, Any]) -> dict[str, Any]:
    if set(metric) != {"values", "schema"}:
        return dict(metric)
    names = [field["name"] for field in metric["schema"].get("fields", [])]
    return dict(zip(names, metric["values"], strict=True))


def _written(spark: SparkSession, out: str, batch_id: int, one: _Watched) -> list[dict[str, Any]]:
    """The windows (reports) micro-batch `batch_id` wrote: as it wrote them in this process,
    else read where they were written (a Spark Connect server wrote them)."""
    rows = one.written.pop(batch_id, None)
    if rows is not None:
        return rows
    frame = spark.read.parquet(one.where(out, batch_id)).orderBy(*one.order)
    return [row.asDict() for row in frame.collect()]
