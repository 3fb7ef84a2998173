"""The event-log jobs: read recorded event logs (JSON Lines and Arrow streams) and `analyze` them.

Both formats are read by the ``purgatory-events`` data source (`._datasource`): one row per
operation, checked file by file as it is read, with its file's UTC anchor applied. A malformed
line stops the job with its file, its line number and what is wrong with it. The summary per
purgatory is `outcome_summary`, the same function a replay's summary is checked against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ._datasource import EVENTS_FORMAT, register_data_sources
from ._eventfile import LOG_VERSIONS, OUTCOMES
from ._frames import task_errors
from ._job_stuck import grace_from_lateness, stuck_now, warn_without_watch_records
from ._spark import atomic_output, utc_timestamps
from ._summary import SHARED_SUMMARY_COLUMNS, outcome_summary

__all__ = (
    "LOG_VERSIONS",
    "OUTCOMES",
    "WINDOW_KINDS",
    "analyze",
    "event_log_anchors",
    "events",
    "load_event_log",
    "window_counts",
)

#: What a window counts: operations watched in it, and those that ended in it, by outcome.
WINDOW_KINDS: Final = ("watched", "completed", "expired", "cancelled", "drained")
#: The outcomes of an operation that waited in the timer (all but a refused watch).
_WAITED: Final = ("completed", "expired", "cancelled", "drained", "open")


def events(
    spark: SparkSession, path: str, *, include_part_files: bool = False, require_utc: bool = False
) -> DataFrame:
    """The operations of every event log under `path`, as the ``purgatory-events`` data source
    reads them (lazily: a bad line fails the first action that reads its file)."""
    register_data_sources(spark)
    reader = spark.read.format(EVENTS_FORMAT)
    if include_part_files:
        reader = reader.option("includePartFiles", "true")
    if require_utc:
        reader = reader.option("requireUtc", "true")
    return reader.load(path)


def load_event_log(
    spark: SparkSession, path: str, *, include_part_files: bool = False
) -> DataFrame:
    """Read every event log under `path`, checked whole before it is returned: ``*.jsonl`` and
    ``*.arrows`` files (``*.part`` files, still being written, only with `include_part_files`,
    up to their last whole line or batch).

    One row per operation, with the record's fields (docs/pipeline-schemas.md), ``utc_offset``
    (seconds to add to its times for UTC seconds since the epoch, from its file's anchor at or
    before its watch, the file's first anchor if none is), its times as UTC timestamps
    (``watched_utc``, ``deadline_utc``, ``ended_utc``) and its ``file``. Times and offsets are
    null for a file without an anchor (schema version 1, or a recorder that could not anchor:
    its times stay seconds of the purgatory's clock).

    Raises:
        TraceError: No such path, a malformed line (named by file and line), a line of another
            schema version, or a line missing a field its outcome requires.
    """
    frame = events(spark, path, include_part_files=include_part_files)
    with task_errors():
        frame.select("file").count()  # (the check: every file read once)
    return frame


def event_log_anchors(spark: SparkSession, path: str) -> list[dict[str, float]]:
    """The distinct UTC anchors of the event logs under `path`, by UTC (a trace's metadata)."""
    register_data_sources(spark)
    anchors = spark.read.format(EVENTS_FORMAT).option("anchors", "true").load(path)
    with task_errors():
        rows = anchors.select("clock", "utc").distinct().orderBy("utc", "clock").collect()
    return [{"clock": row["clock"], "utc": row["utc"]} for row in rows]


def _delayed_events(log: DataFrame, by: Sequence[str]) -> DataFrame:
    """+1 at the watch and -1 at the end of every operation that waited in the timer.

    An operation completed at the instant of its watch completed inside the watch call and never
    waited. At one instant, operations that end come before those watched (a replay expires and
    triggers before it admits the next arrival), except one that ends at the instant of its own
    watch (a zero timeout), which comes right after its watch; ties go by operation id.
    """
    waited = log.where(
        F.col("outcome").isin(*_WAITED)
        & ~((F.col("outcome") == "completed") & (F.col("ended_at") == F.col("watched_at")))
    ).withColumn("_idl", F.col("id").cast("long"))
    starts = waited.select(
        *by,
        F.col("watched_at").alias("_t"),
        F.lit(1).alias("_after"),
        "_idl",
        "id",
        F.lit(1).alias("_phase"),
        F.lit(1).alias("_delta"),
    )
    ends = waited.where(F.col("ended_at").isNotNull()).select(
        *by,
        F.col("ended_at").alias("_t"),
        F.when(F.col("ended_at") > F.col("watched_at"), 0).otherwise(1).alias("_after"),
        "_idl",
        "id",
        F.lit(2).alias("_phase"),
        F.lit(-1).alias("_delta"),
    )
    window = (
        Window.partitionBy(*by)
        .orderBy("_t", "_after", "_idl", "id", "_phase")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return starts.unionByName(ends).withColumn("_level", F.sum("_delta").over(window))


def analyze(
    spark: SparkSession,
    log_path: str,
    out: str,
    *,
    window: float = 60.0,
    since: datetime | None = None,
    until: datetime | None = None,
    overwrite: bool = False,
    stuck: bool = False,
    grace: float | None = None,
    tick: float = 0.001,
    watermark: float = 0.0,
) -> DataFrame:
    """Analyse event logs: ``summary/``, ``keys/``, ``windows/`` and ``waits/`` under `out`
    (and ``stuck/`` with `stuck`).

    - summary: per purgatory, the columns a replay's summary shares (`SHARED_SUMMARY_COLUMNS`),
      computed the same way (``peak_delayed`` from the watch and end times), and ``drained``;
    - keys: per (purgatory, key): operations, outcomes, mean and max wait, peak waiters;
    - windows: per (purgatory, window of `window` seconds): watched, completed, expired,
      cancelled and drained operations (by their end); in UTC (``time_base`` ``"utc"``,
      ``window_utc`` a timestamp, written as UTC-adjusted microseconds so every Parquet reader
      keeps the zone) for operations whose log carries an anchor, else in seconds of the
      purgatory's clock (``time_base`` ``"clock"``, ``window_utc`` null);
    - waits: per (purgatory, outcome): counts of waits by power-of-two milliseconds bucket.

    `since` and `until` (aware datetimes; naive ones are taken as UTC) keep the operations
    watched in ``[since, until)``; every log must then carry an anchor.

    `stuck`: also ``stuck/`` (``._job_stuck.stuck_now``, the columns of ``analyze --follow
    --stuck``'s table): the operations with a watch record and no end whose deadline plus
    `grace` is at or before the newest record's time less `watermark` seconds (what a
    ``--once`` follow job of the same files reports as stuck and did not see end late). Every
    log must carry an anchor; `grace` defaults to `GRACE_TICKS` ticks of `tick` plus the p99
    lateness of the expired operations; not with `since` or `until` (a range would part
    watches from their ends).

    Returns:
        The summary, read back from `out`.
    """
    if not (window > 0 and math.isfinite(window)):
        raise ValueError(f"window must be a finite number of seconds > 0, got {window!r}")
    # Read once: the check's scan (every file read, its UTC anchor applied) fills the cache
    # the four tables read. (A cached plan outlives its files, so it is unpersisted whatever
    # happens.)
    ranged = since is not None or until is not None
    if stuck and ranged:
        raise ValueError("stuck reads every record: not with since or until")
    # With a UTC range every file must carry an anchor: its reader refuses one without.
    log = events(spark, log_path, require_utc=ranged)
    cached = log.select(*_ANALYSED).persist(StorageLevel.MEMORY_AND_DISK)
    log = cached
    try:
        with task_errors():
            operations = log.count()
        if ranged:
            log = _in_utc_range(log, since, until)
        tables = {
            "summary": _summary(log).orderBy("purgatory").coalesce(1),
            "keys": _keys(log).orderBy("purgatory", F.desc("peak_waiters"), "key"),
            "windows": window_counts(window_events(log, window), window).orderBy(
                "purgatory", "time_base", "window_start"
            ),
            "waits": _waits(log).orderBy("purgatory", "outcome", "bucket_ms"),
        }
        if stuck:
            if grace is None:
                with task_errors():
                    grace, _ = grace_from_lateness(log, tick)
            records = spark.read.format(EVENTS_FORMAT).option("requireUtc", "true")
            with_watches = records.option("watchRecords", "true").load(log_path)
            tables["stuck"] = stuck_now(
                with_watches,
                grace=grace,
                watermark=watermark,
                window=window,
            ).orderBy("purgatory", "deadline_utc", "id")
        with (
            task_errors(),
            atomic_output(spark, out, overwrite=overwrite) as staging,
            utc_timestamps(spark),
        ):
            for name, table in tables.items():
                table.write.parquet(f"{staging}/{name}")
        if stuck:
            # (A job that stops at the first watch record: a file's worth when they are there.
            # Spark's Observation would count without a pass, but its result came back empty
            # once in a whole-suite run, failing `get` with an assertion inside Spark.)
            with task_errors():
                watches = with_watches.where(F.col("outcome") == "watched").limit(1).count()
            warn_without_watch_records({"records": operations, "watches": watches})
    finally:
        cached.unpersist()
    return spark.read.parquet(f"{out}/summary").orderBy("purgatory")


#: The columns of an operation the analysis reads.
_ANALYSED: Final = (
    "purgatory",
    "id",
    "keys",
    "watched_at",
    "deadline",
    "outcome",
    "ended_at",
    "utc_offset",
)


def _summary(log: DataFrame) -> DataFrame:
    peaks = (
        _delayed_events(log, ["purgatory"])
        .groupBy("purgatory")
        .agg(F.max("_level").alias("peak_delayed"))
    )
    return (
        outcome_summary(log, ["purgatory"], more=("drained",))
        .join(peaks, "purgatory", "left")
        .na.fill(0, ["peak_delayed"])
        .select(*SHARED_SUMMARY_COLUMNS, "drained", "expired_share")
    )


def _keys(log: DataFrame) -> DataFrame:
    by_key = log.withColumn("key", F.explode("keys"))
    key_peaks = (
        _delayed_events(by_key, ["purgatory", "key"])
        .groupBy("purgatory", "key")
        .agg(F.max("_level").alias("peak_waiters"))
    )
    outcome = F.col("outcome")
    wait = F.when(outcome.isin("completed", "expired"), F.col("ended_at") - F.col("watched_at"))
    return (
        by_key.groupBy("purgatory", "key")
        .agg(
            F.count(F.lit(1)).alias("operations"),
            F.sum(F.when(outcome == "completed", 1).otherwise(0)).alias("completed"),
            F.sum(F.when(outcome == "expired", 1).otherwise(0)).alias("expired"),
            F.avg(wait).alias("wait_mean"),
            F.max(wait).alias("wait_max"),
        )
        .join(key_peaks, ["purgatory", "key"], "left")
        .na.fill(0, ["peak_waiters"])
    )


def window_events(log: DataFrame, window: float) -> DataFrame:
    """Each operation's watch and end as events of a window of `window` seconds: columns
    ``purgatory``, ``time_base``, ``_w`` (the window's number), ``window_utc`` (its start as a
    timestamp; null for the clock time base) and ``_kind`` (``watched`` or the outcome).

    One pass over `log` (a stream's micro-batch reads each file once): each operation becomes
    its one or two events by ``explode``.
    """
    base = F.when(F.col("utc_offset").isNull(), "clock").otherwise("utc").alias("time_base")
    shift = F.coalesce(F.col("utc_offset"), F.lit(0.0))
    event = [F.lit("watched").alias("_kind"), F.col("watched_at").alias("_t")]
    end = [F.col("outcome").alias("_kind"), F.col("ended_at").alias("_t")]
    events = F.array(
        F.struct(*event),
        F.when(F.col("ended_at").isNotNull(), F.struct(*end)),
    )
    exploded = log.select(
        "purgatory", base, "utc_offset", F.explode(F.filter(events, lambda e: e.isNotNull()))
    ).select(
        "purgatory",
        "time_base",
        F.floor((F.col("col._t") + shift) / window).alias("_w"),
        F.col("col._kind").alias("_kind"),
    )
    utc = F.when(F.col("time_base") == "utc", F.timestamp_seconds(F.col("_w") * window))
    return exploded.withColumn("window_utc", utc)


def window_counts(events: DataFrame, window: float) -> DataFrame:
    """The ``windows/`` table of `window_events`: per (purgatory, time base, window), the
    operations watched in it and those that ended in it, by outcome (`WINDOW_KINDS`)."""
    kind = F.col("_kind")
    return (
        events.groupBy("purgatory", "time_base", "_w", "window_utc")
        .agg(*(F.sum(F.when(kind == k, 1).otherwise(0)).alias(k) for k in WINDOW_KINDS))
        .select(
            "purgatory",
            "time_base",
            (F.col("_w") * window).alias("window_start"),
            "window_utc",
            F.lit(window).alias("window_seconds"),
            *WINDOW_KINDS,
        )
    )


def _waits(log: DataFrame) -> DataFrame:
    return (
        log.where(F.col("outcome").isin("completed", "expired"))
        .withColumn("_ms", (F.col("ended_at") - F.col("watched_at")) * 1000)
        .withColumn(
            "bucket_ms",
            F.when(F.col("_ms") <= 1, 1.0).otherwise(
                F.pow(F.lit(2.0), F.ceil(F.log2(F.col("_ms"))))
            ),
        )
        .groupBy("purgatory", "outcome", "bucket_ms")
        .agg(F.count(F.lit(1)).alias("operations"))
    )


def _in_utc_range(log: DataFrame, since: datetime | None, until: datetime | None) -> DataFrame:
    """The operations watched in ``[since, until)`` (UTC)."""
    utc = F.col("watched_at") + F.col("utc_offset")
    if since is not None:
        log = log.where(utc >= _epoch(since))
    if until is not None:
        log = log.where(utc < _epoch(until))
    return log


def _epoch(moment: datetime) -> float:
    """Seconds since the epoch of `moment`; a naive datetime is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
