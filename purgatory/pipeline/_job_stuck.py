"""``analyze --follow --stuck``: the operations watched whose end has not come by their deadline
plus a grace, reported live: lost wake-ups, and the pending operations of a process that died.

Recorders made with ``watch_records=True`` write a *watch record* (outcome ``watched``) as each
operation is watched, then its end record as usual. The stream reads both (the data source's
``watchRecords`` option) and keys them by operation: purgatory, recorder (the file name's
``<prefix>-<token>``, so two processes' counters from 0 do not meet) and id. Spark's
``transformWithStateInPandas`` keeps, per operation, its watch until its end arrives, in the
checkpoint's state store (RocksDB, which ``transformWithState`` requires in Spark 4), with an
**event-time** timer at its deadline plus the grace. Event time is each record's own time (the
watch's, or the end's), and the watermark trails the newest record read by the job's
``watermark`` seconds, as the windows' does: a timer fires once the watermark passes it, so an
operation is reported once records ``deadline + grace + watermark`` or later have been read
(from any recorder of the directory). No wall clock is read: the same files give the same
report, whenever and however they are read.

What the report says (``stuck/batch-<id>.parquet``, a row per report, `STUCK_SCHEMA`):

- ``stuck``: watched, and no end by ``deadline + grace`` (``overdue_seconds``: how far past
  its deadline the watermark was when it was reported);
- ``late_end``: an operation reported stuck whose end then arrived (``overdue_seconds``: how
  long after its deadline it ended; ``outcome``, ``ended_utc``). A report is never taken back
  (the table is append-only, as Parquet readers need); the late end is a row of its own, so a
  reader that wants "stuck now" takes the ``stuck`` rows without a ``late_end`` row. A reported
  operation's state is kept `KEEP` seconds of event time after its report for that, then
  dropped (a later end is then not said).

An ``open`` record (a recorder closed with the operation pending) is no end: it counts as a watch.
A record older than the watermark when it is read is dropped by Spark (counted in the progress'
``numRowsDroppedByWatermark``): a watch so late is never reported, an end so late leaves its
operation reported. Raise ``--watermark`` above how late a recorder publishes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from ._eventfile import NOT_ENDED

if TYPE_CHECKING:
    from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

__all__ = (
    "GRACE_TICKS",
    "KEEP",
    "ROCKSDB",
    "STUCK_SCHEMA",
    "StuckOperations",
    "grace_from_lateness",
    "stuck_now",
    "stuck_operations",
)

#: The state store ``transformWithState`` needs in Spark 4.
ROCKSDB: Final = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Ticks of the purgatory's timer in the default grace (an expiry is settled on a tick after its
#: deadline, and its timer pass takes a little more).
GRACE_TICKS: Final = 4
#: Seconds of event time a reported operation's state is kept for its late end.
KEEP: Final = 3600.0

_UTC: Final = pa.timestamp("us", tz="UTC")
#: The columns of ``stuck/``.
STUCK_SCHEMA: Final = pa.schema(
    [
        ("purgatory", pa.string()),
        ("recorder", pa.string()),
        ("id", pa.string()),
        ("keys", pa.list_(pa.string())),
        ("status", pa.string()),
        ("window_start", pa.float64()),
        ("window_utc", _UTC),
        ("watched_utc", _UTC),
        ("deadline_utc", _UTC),
        ("reported_utc", _UTC),
        ("overdue_seconds", pa.float64()),
        ("grace_seconds", pa.float64()),
        ("outcome", pa.string()),
        ("ended_utc", _UTC),
    ]
)

#: What the processor writes per report (times in ms since the epoch; null where none).
_REPORT: Final = StructType(
    [
        StructField("purgatory", StringType()),
        StructField("recorder", StringType()),
        StructField("id", StringType()),
        StructField("keys", ArrayType(StringType())),
        StructField("status", StringType()),
        StructField("watched_ms", LongType()),
        StructField("deadline_ms", LongType()),
        StructField("reported_ms", LongType()),
        StructField("outcome", StringType()),
        StructField("ended_ms", LongType()),
    ]
)
#: An operation's state: its watch, and when it was reported (-1: not yet).
_STATE: Final = StructType(
    [
        StructField("keys", ArrayType(StringType())),
        StructField("watched_ms", LongType()),
        StructField("deadline_ms", LongType()),
        StructField("reported_ms", LongType()),
    ]
)


class StuckOperations(StatefulProcessor):
    """Per operation (the grouping key: purgatory, recorder, id): its watch kept until its end,
    and an event-time timer at ``deadline + grace`` that reports it if the end has not come.

    Args:
        grace_ms: Milliseconds past the deadline an end may come without a report.
        keep_ms: Milliseconds of event time a reported operation is remembered for its late
            end.
    """

    def __init__(self, grace_ms: int, keep_ms: int) -> None:
        self.grace_ms = grace_ms
        self.keep_ms = keep_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.op = handle.getValueState("op", _STATE)

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[Any]:
        watch: dict[str, Any] | None = None
        end: dict[str, Any] | None = None
        for frame in rows:
            for record in frame.to_dict("records"):
                if record["outcome"] in NOT_ENDED:
                    watch = watch or record
                elif end is None or record["ended_ms"] < end["ended_ms"]:
                    end = record
        state = self.op.get() if self.op.exists() else None
        if end is not None:
            if state is None:
                return  # watched and ended in this batch (or never watched with a record)
            for timer in list(self.handle.listTimers()):
                self.handle.deleteTimer(timer)
            self.op.clear()
            if state[3] >= 0:
                yield self._report(key, state, "late_end", end["ended_ms"], end)
            return
        if watch is None or state is not None or watch["deadline_ms"] is None:
            return  # (a later watch or open record of a known operation; no finite deadline)
        keys = list(watch["keys"]) if watch["keys"] is not None else []
        deadline = int(watch["deadline_ms"])
        self.op.update((keys, int(watch["watched_ms"]), deadline, -1))
        self.handle.registerTimer(deadline + self.grace_ms)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Any]:
        if not self.op.exists():
            return
        state = self.op.get()
        assert state is not None
        if state[3] >= 0:  # reported long enough ago: forgotten
            self.op.clear()
            return
        now = timerValues.getCurrentWatermarkInMs()
        self.op.update((state[0], state[1], state[2], now))
        self.handle.registerTimer(now + self.keep_ms)
        yield self._report(key, state, "stuck", now, None)

    def _report(
        self, key: Any, state: Any, status: str, at: int, end: dict[str, Any] | None
    ) -> Any:
        """One report as a pandas frame of one row."""
        import pandas as pd  # type: ignore[import-untyped]

        purgatory, recorder, ident = key
        return pd.DataFrame(
            {
                "purgatory": [purgatory],
                "recorder": [recorder],
                "id": [ident],
                "keys": [list(state[0])],
                "status": [status],
                "watched_ms": [state[1]],
                "deadline_ms": [state[2]],
                "reported_ms": [at],
                "outcome": [None if end is None else end["outcome"]],
                "ended_ms": pd.array([None if end is None else end["ended_ms"]], "Int64"),
            }
        )

    def close(self) -> None:
        pass


def _ms(column: str) -> Any:
    return F.floor(F.unix_micros(F.col(column)) / 1000).cast("long")


def _utc(column: str) -> Any:
    return F.timestamp_millis(F.col(column))


def stuck_operations(
    records: DataFrame, *, grace: float, watermark: float, window: float, keep: float = KEEP
) -> DataFrame:
    """The reports (`STUCK_SCHEMA`'s columns) of a stream of records read with watch records
    (``watchRecords``) and UTC times (``requireUtc``).

    Args:
        grace: Seconds past its deadline an operation's end may come unreported.
        watermark: Seconds the event-time watermark trails the newest record read.
        window: Seconds per window: a report's window is the one holding its deadline.
        keep: Seconds of event time a reported operation waits for a late end.
    """
    outcome = F.col("outcome")
    at = F.when(outcome.isin(*NOT_ENDED), F.col("watched_utc")).otherwise(F.col("ended_utc"))
    recorder = F.regexp_extract(F.col("file"), r"([^/]+)-[0-9]+\.(jsonl|arrows)$", 1)
    prepared = (
        records.select(
            "purgatory",
            recorder.alias("recorder"),
            "id",
            "keys",
            "outcome",
            at.alias("_t"),
            _ms("watched_utc").alias("watched_ms"),
            _ms("deadline_utc").alias("deadline_ms"),
            _ms("ended_utc").alias("ended_ms"),
        )
        .where(F.col("_t").isNotNull())
        .withWatermark("_t", f"{round(watermark * 1000)} milliseconds")
    )
    reports = prepared.groupBy("purgatory", "recorder", "id").transformWithStateInPandas(
        StuckOperations(round(grace * 1000), round(keep * 1000)),
        _REPORT,
        "Append",
        "EventTime",
    )
    deadline = F.col("deadline_ms") / 1000
    return reports.select(
        "purgatory",
        "recorder",
        "id",
        "keys",
        "status",
        (F.floor(deadline / window) * window).alias("window_start"),
        F.timestamp_seconds(F.floor(deadline / window) * window).alias("window_utc"),
        _utc("watched_ms").alias("watched_utc"),
        _utc("deadline_ms").alias("deadline_utc"),
        _utc("reported_ms").alias("reported_utc"),
        ((F.coalesce(F.col("ended_ms"), F.col("reported_ms")) - F.col("deadline_ms")) / 1000).alias(
            "overdue_seconds"
        ),
        F.lit(float(grace)).alias("grace_seconds"),
        "outcome",
        _utc("ended_ms").alias("ended_utc"),
    )


def grace_from_lateness(records: DataFrame, tick: float) -> tuple[float, float | None]:
    """The default grace: `GRACE_TICKS` ticks plus the p99 of how late the expired operations
    of `records` (a batch read) ended after their deadlines; and that p99 (``None``: no expired
    operation, none added). Exact (``percentile``), on what the logs hold when the job starts."""
    late = records.where(F.col("outcome") == "expired").select(
        F.greatest(F.col("ended_at") - F.col("deadline"), F.lit(0.0)).alias("late")
    )
    row = late.agg(F.percentile("late", 0.99).alias("p99")).first()
    p99 = None if row is None or row["p99"] is None else float(row["p99"])
    return GRACE_TICKS * tick + (p99 or 0.0), p99


def stuck_now(records: DataFrame, *, grace: float, watermark: float, window: float) -> DataFrame:
    """The batch counterpart of `stuck_operations`: over every record at once (read with watch
    records and UTC times), the operations watched with no end record whose deadline plus
    `grace` the follow job's watermark would have passed (the newest record's time less
    `watermark` seconds). What a ``--once`` job reads of the same files reports as ``stuck``
    the same operations, less those it then saw end late (``late_end``), which are ended here."""
    outcome = F.col("outcome")
    at = F.when(outcome.isin(*NOT_ENDED), F.col("watched_utc")).otherwise(F.col("ended_utc"))
    recorder = F.regexp_extract(F.col("file"), r"([^/]+)-[0-9]+\.(jsonl|arrows)$", 1)
    key = ["purgatory", "recorder", "id"]
    timed = records.select(
        "purgatory",
        recorder.alias("recorder"),
        "id",
        "keys",
        "outcome",
        _ms("watched_utc").alias("watched_ms"),
        _ms("deadline_utc").alias("deadline_ms"),
        F.floor(F.unix_micros(at) / 1000).cast("long").alias("_t"),
    ).where(F.col("_t").isNotNull())
    cut = timed.agg((F.max("_t") - round(watermark * 1000)).alias("reported_ms"))
    ended = timed.where(~outcome.isin(*NOT_ENDED)).select(*key).distinct()
    watched = (
        timed.where(outcome.isin(*NOT_ENDED) & F.col("deadline_ms").isNotNull())
        .groupBy(*key)
        .agg(
            F.first("keys").alias("keys"),
            F.min("watched_ms").alias("watched_ms"),
            F.min("deadline_ms").alias("deadline_ms"),
        )
    )
    deadline = F.col("deadline_ms") / 1000
    return (
        watched.join(ended, key, "left_anti")
        .crossJoin(cut)
        .where(F.col("deadline_ms") + round(grace * 1000) <= F.col("reported_ms"))
        .select(
            *key,
            "keys",
            F.lit("stuck").alias("status"),
            (F.floor(deadline / window) * window).alias("window_start"),
            F.timestamp_seconds(F.floor(deadline / window) * window).alias("window_utc"),
            _utc("watched_ms").alias("watched_utc"),
            _utc("deadline_ms").alias("deadline_utc"),
            _utc("reported_ms").alias("reported_utc"),
            ((F.col("reported_ms") - F.col("deadline_ms")) / 1000).alias("overdue_seconds"),
            F.lit(float(grace)).alias("grace_seconds"),
            F.lit(None).cast("string").alias("outcome"),
            F.lit(None).cast("timestamp").alias("ended_utc"),
        )
    )
