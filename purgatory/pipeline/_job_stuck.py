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

- ``stuck``: watched, and no end by ``deadline + grace`` in event time: none read, or one read
  whose time is later than that (``overdue_seconds``: how far past its deadline the watermark
  was when it was reported);
- ``late_end``: the end of an operation reported stuck (``overdue_seconds``: how long after its
  deadline it ended; ``outcome``, ``ended_utc``): at once with its ``stuck`` row if the end was
  read first, else when it comes. A report is never taken back (the table is append-only, as
  Parquet readers need), so a reader that wants "stuck now" takes the ``stuck`` rows without a
  ``late_end`` row. A reported operation is kept `KEEP` seconds of event time for its end,
  then dropped (a later end is then not said).

The rows do not depend on how the records were batched (only a ``stuck`` row's
``reported_utc`` and ``overdue_seconds`` do: when the watermark passed it), and `stuck_now`
computes them in one batch (``analyze --stuck``).

An ``open`` record (a recorder closed with the operation pending) is no end: it counts as a watch.
A record older than the watermark when it is read is dropped by Spark (counted in the progress'
``numRowsDroppedByWatermark``): a watch so late is never reported, an end so late leaves its
operation reported. Raise ``--watermark`` above how late a recorder publishes.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
from pyspark.sql import Column, DataFrame
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
#: An operation's state: its watch, when it was reported (-1: not yet), and an end already
#: read that came after its deadline plus the grace (-1 and null: none).
_STATE: Final = StructType(
    [
        StructField("keys", ArrayType(StringType())),
        StructField("watched_ms", LongType()),
        StructField("deadline_ms", LongType()),
        StructField("reported_ms", LongType()),
        StructField("ended_ms", LongType()),
        StructField("outcome", StringType()),
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
        """Read an operation's records: a watch (or ``open``) record starts its timer; an end
        within the grace forgets it; an end past the grace waits for the timer (the operation
        was stuck at its deadline plus the grace, in event time, however the records were
        batched); an end after the report is said as ``late_end``."""
        watch: dict[str, Any] | None = None
        end: dict[str, Any] | None = None
        for frame in rows:
            for record in frame.to_dict("records"):
                if record["outcome"] in NOT_ENDED:
                    watch = watch or record
                elif end is None or record["ended_ms"] < end["ended_ms"]:
                    end = record
        state = self.op.get() if self.op.exists() else None
        if state is None:
            if watch is None or _missing(watch["deadline_ms"]):
                return  # an end never watched with a record; no finite deadline
            keys = list(watch["keys"]) if watch["keys"] is not None else []
            deadline = int(watch["deadline_ms"])
            late = end is not None and int(end["ended_ms"]) > deadline + self.grace_ms
            if end is not None and not late:
                return  # watched and ended in time, both in this batch: nothing to keep
            self.op.update(
                (
                    keys,
                    int(watch["watched_ms"]),
                    deadline,
                    -1,
                    int(end["ended_ms"]) if end is not None else -1,
                    end["outcome"] if end is not None else None,
                )
            )
            self.handle.registerTimer(deadline + self.grace_ms)
            return
        if end is None or state[4] >= 0:
            return  # another watch or open record, or its end already read
        ended = int(end["ended_ms"])
        if state[3] >= 0:  # reported: the end came late
            self._forget()
            yield self._report(key, state, "late_end", ended, end["outcome"])
        elif ended <= state[2] + self.grace_ms:
            self._forget()  # in time
        else:  # past the grace, before the report: reported with it when the timer fires
            self.op.update((*state[:4], ended, end["outcome"]))

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Any]:
        """Deadline plus grace passed with no end in time: report it (and its late end, if
        read already); a reported operation's keeping timer: forget it."""
        if not self.op.exists():
            return
        state = self.op.get()
        assert state is not None
        if state[3] >= 0:  # reported long enough ago: forgotten
            self.op.clear()
            return
        now = timerValues.getCurrentWatermarkInMs()
        yield self._report(key, state, "stuck", now, None)
        if state[4] >= 0:
            self.op.clear()
            yield self._report(key, state, "late_end", state[4], state[5])
            return
        self.op.update((*state[:3], now, -1, None))
        self.handle.registerTimer(now + self.keep_ms)

    def _forget(self) -> None:
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        self.op.clear()

    def _report(self, key: Any, state: Any, status: str, at: int, outcome: str | None) -> Any:
        """One report as a pandas frame of one row (`at`: the watermark that reported it, or
        the end's time for a ``late_end``)."""
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
                "outcome": [outcome],
                "ended_ms": pd.array([at if status == "late_end" else None], "Int64"),
            }
        )

    def close(self) -> None:
        pass


def _missing(value: Any) -> bool:
    """A null of a pandas column (an integer column with nulls is a float one: NaN)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


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
    return _reports(reports, grace, window)


def input_counts() -> tuple[Column, Column]:
    """What a stuck job counts of the records it reads (observed, no pass of its own): all of
    them, and the watch records among them."""
    return (
        F.count(F.lit(1)).alias("records"),
        F.count_if(F.col("outcome") == "watched").alias("watches"),
    )


def warn_without_watch_records(counts: Mapping[str, Any]) -> bool:
    """Say on stderr that no operation can be reported stuck if the records read (`counts`, as
    `input_counts` names them) hold no watch record: else a job over a recorder made without
    them reports nothing, which reads as "nothing stuck". Whether it said so."""
    records, watches = int(counts.get("records") or 0), int(counts.get("watches") or 0)
    if records == 0 or watches:
        return False
    print(
        f"purgatory.pipeline: --stuck: {records} records read, none of them a watch record: no "
        "operation can be reported stuck (the recorders need watch_records=True)",
        file=sys.stderr,
        flush=True,
    )
    return True


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
    """The batch counterpart of `stuck_operations`, over every record at once (read with watch
    records and UTC times): the operations with a watch record whose deadline plus `grace` the
    follow job's watermark would have passed (the newest record's time less `watermark`
    seconds) with no end by then: ``stuck``, and ``late_end`` for those whose end came after.
    What a ``--once`` follow job of the same files reports, row for row (``reported_utc`` and a
    ``stuck`` row's ``overdue_seconds``: at the newest record less `watermark`, where the job
    says when its watermark passed)."""
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
        _ms("ended_utc").alias("ended_ms"),
        F.floor(F.unix_micros(at) / 1000).cast("long").alias("_t"),
    ).where(F.col("_t").isNotNull())
    cut = timed.agg((F.max("_t") - round(watermark * 1000)).alias("_cut"))
    ends = (
        timed.where(~outcome.isin(*NOT_ENDED))
        .groupBy(*key)
        .agg(F.min_by("outcome", "ended_ms").alias("outcome"), F.min("ended_ms").alias("ended_ms"))
    )
    due = F.col("deadline_ms") + round(grace * 1000)
    operations = (
        timed.where(outcome.isin(*NOT_ENDED) & F.col("deadline_ms").isNotNull())
        .groupBy(*key)
        .agg(
            F.first("keys").alias("keys"),
            F.min("watched_ms").alias("watched_ms"),
            F.min("deadline_ms").alias("deadline_ms"),
        )
        .join(ends, key, "left")
        .crossJoin(cut)
        .where((due <= F.col("_cut")) & (F.col("ended_ms").isNull() | (F.col("ended_ms") > due)))
    )
    stuck = operations.select(
        *key, "keys", "watched_ms", "deadline_ms", F.lit("stuck").alias("status"),
        F.col("_cut").alias("reported_ms"), F.lit(None).cast("string").alias("outcome"),
        F.lit(None).cast("long").alias("ended_ms"),
    )  # fmt: skip
    late = operations.where(F.col("ended_ms").isNotNull()).select(
        *key, "keys", "watched_ms", "deadline_ms", F.lit("late_end").alias("status"),
        F.col("ended_ms").alias("reported_ms"), "outcome", "ended_ms",
    )  # fmt: skip
    return _reports(stuck.unionByName(late), grace, window)


def _reports(reports: DataFrame, grace: float, window: float) -> DataFrame:
    """`STUCK_SCHEMA`'s columns of the processor's rows (`_REPORT`)."""
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
