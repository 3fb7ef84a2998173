"""The event-log jobs: read recorded event logs (JSON Lines and Arrow streams), and `analyze` them.

Both formats become one DataFrame of records (operations and UTC anchors), checked whole before
anything is computed from it: a malformed line is reported with its file, its line number and
what is wrong with it. The summary per purgatory is `outcome_summary`, the same function a
replay's summary is checked against.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ._frames import TraceError, as_given, first_line, first_problem
from ._spark import atomic_output, utc_timestamps
from ._summary import SHARED_SUMMARY_COLUMNS, outcome_summary

__all__ = (
    "EVENT_LOG_SCHEMA",
    "LOG_VERSIONS",
    "Line",
    "analyze",
    "check_records",
    "event_log_records",
    "find_line",
    "line_problem",
    "load_event_log",
    "operations_of",
)

#: The event-log schema versions this reader knows (docs/pipeline-schemas.md); a line of any
#: other version is refused rather than read by the wrong rules.
LOG_VERSIONS: Final = (1, 2)
#: The schema-metadata key of an Arrow event-log stream holding its version (a format constant
#: of docs/pipeline-schemas.md: Arrow streams exist from version 2 on).
ARROW_VERSION_KEY: Final = b"purgatory.event_log"

#: The event-log line schema (versions 1 and 2) as Spark reads it; ``fields`` is left out.
#: A version-2 line is an operation or an anchor (only ``v`` and ``anchor``).
EVENT_LOG_SCHEMA: Final = T.StructType(
    [
        T.StructField("v", T.IntegerType()),
        T.StructField("purgatory", T.StringType()),
        T.StructField("id", T.StringType()),
        T.StructField("keys", T.ArrayType(T.StringType())),
        T.StructField("watched_at", T.DoubleType()),
        T.StructField("timeout", T.DoubleType()),
        T.StructField("deadline", T.DoubleType()),
        T.StructField("outcome", T.StringType()),
        T.StructField("ended_at", T.DoubleType()),
        T.StructField(
            "anchor",
            T.StructType(
                [T.StructField("clock", T.DoubleType()), T.StructField("utc", T.DoubleType())]
            ),
        ),
    ]
)
_OUTCOMES: Final = ("completed", "expired", "cancelled", "refused", "open")
#: Beside the line's fields: the raw text of a line Spark could not read (`_corrupt`), what
#: is wrong with an Arrow stream (`_broken`), and the record's file.
_EXTRA: Final = (
    T.StructField("_corrupt", T.StringType()),
    T.StructField("_broken", T.StringType()),
    T.StructField("_file", T.StringType()),
)
_RECORDS: Final = T.StructType([*EVENT_LOG_SCHEMA.fields, *_EXTRA])


def load_event_log(spark: SparkSession, path: str) -> DataFrame:
    """Read every event log under `path`: ``*.jsonl`` and ``*.arrows`` files (``*.part`` files,
    still being written, skipped).

    Each operation's row has the record's fields and ``utc_offset``: seconds to add to its times
    (``watched_at``, ``deadline``, ``ended_at``) for UTC seconds since the epoch, from its file's
    anchor at or before its watch (the file's first anchor if none is); null when its file has
    no anchor (schema version 1, or a recorder that could not anchor: its times stay seconds of
    the purgatory's clock).

    Raises:
        TraceError: No file, a malformed line (named by file and line), a line of another
            schema version, or a line missing a field its outcome requires.
    """
    return operations_of(event_log_records(spark, path)).drop("_file")


def event_log_records(spark: SparkSession, path: str) -> DataFrame:
    """Every record (operations and anchors) of both formats, checked, with its ``_file``.

    The check is one scan that keeps nothing on valid logs; the first bad record found is
    reported (a malformed JSON line located by a second look at its file alone).
    """
    records = _read_records(spark, path)
    check_records(spark, records, path)
    return records.drop("_corrupt", "_broken")


def _read_records(spark: SparkSession, path: str) -> DataFrame:
    """The records of both formats as read, unchecked: with ``_corrupt`` (the text of a JSON
    line Spark could not read), ``_broken`` (what is wrong with an Arrow stream) and ``_file``."""
    try:
        lines = (
            spark.read.schema(T.StructType([*EVENT_LOG_SCHEMA.fields, _EXTRA[0]]))
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", "_corrupt")
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", "*.jsonl")
            .json(path)
        )
        lines = lines.select(
            *EVENT_LOG_SCHEMA.names,
            "_corrupt",
            F.lit(None).cast("string").alias("_broken"),
            F.col("_metadata.file_path").alias("_file"),
        )
        return lines.unionByName(_arrow_records(spark, path))
    except AnalysisException as exc:
        raise TraceError(f"event log {path}: {first_line(exc)}") from None


def check_records(spark: SparkSession, records: DataFrame, path: str) -> None:
    """Raise `TraceError` for the first bad record of `_read_records` (of the logs at `path`)."""
    bad = (
        records.withColumn("_problem", _record_problem())
        .where(F.col("_problem").isNotNull())
        .select("_file", "purgatory", "id", "_problem", "_corrupt", "_broken")
        .limit(1)
        .collect()
    )
    if bad:
        raise _refused(spark, bad[0].asDict(), path)


def _record_problem() -> Column:
    """The message of a record's first problem, null for a good record."""
    is_anchor = F.col("anchor").isNotNull()
    versions = " or ".join(str(v) for v in LOG_VERSIONS)
    return F.coalesce(
        F.col("_broken"),
        first_problem(
            [
                (F.col("_corrupt").isNotNull(), "malformed line"),
                (
                    F.col("v").isNull() | ~F.col("v").isin(*LOG_VERSIONS),
                    f"field 'v' is not {versions} (schema version)",
                ),
                (
                    is_anchor & (F.col("anchor.clock").isNull() | F.col("anchor.utc").isNull()),
                    "anchor without 'clock' and 'utc'",
                ),
                (is_anchor, None),
                (F.col("purgatory").isNull(), "field 'purgatory' is missing"),
                (F.col("id").isNull(), "field 'id' is missing"),
                (F.col("watched_at").isNull(), "field 'watched_at' is missing"),
                (F.col("deadline").isNull(), "field 'deadline' is missing"),
                (~F.col("outcome").isin(*_OUTCOMES), "field 'outcome' is not a known outcome"),
                (
                    (F.col("outcome") != "open") & F.col("ended_at").isNull(),
                    "field 'ended_at' is missing",
                ),
            ]
        ),
    )


def _refused(spark: SparkSession, row: dict[str, Any], root: str) -> TraceError:
    """The one-line error for a bad record: its file (as under `root`, the path given), and its
    line for a JSON Lines file."""
    file = as_given(row["_file"], root)
    if row["_broken"] is not None:  # an Arrow stream that is not an event log
        return TraceError(f"event log file {file}: {row['_broken']}")
    what = f"{row['_problem']} (purgatory={row['purgatory']!r}, id={row['id']!r})"
    if row["_corrupt"] is not None:
        what = line_problem(row["_corrupt"])
    elif row["purgatory"] is None and row["id"] is None:
        what = row["_problem"]
    known = row["_corrupt"] is not None or row["purgatory"] is not None or row["id"] is not None
    if not (file.endswith(".jsonl") and known):
        return TraceError(f"event log file {file}: {what}")
    line = _locate(spark, row["_file"], Line(row["_corrupt"], row["purgatory"], row["id"]))
    return TraceError(f"event log file {file}: line {line or '?'}: {what}")


@dataclass(frozen=True, slots=True)
class Line:
    """What identifies a bad line: its text if Spark could not read it, else its record's
    purgatory and id (a line that reads, but misses a field or has a wrong value)."""

    text: str | None
    purgatory: str | None
    id: str | None

    def matches(self, text: str) -> bool:
        if self.text is not None:
            return text == self.text
        try:
            data = json.loads(text)
        except ValueError:
            return False
        if not isinstance(data, dict):
            return False
        ident = data.get("id")
        return (
            data.get("purgatory") == self.purgatory
            and (None if ident is None else str(ident)) == self.id
        )


def _locate(spark: SparkSession, file: str, line: Line) -> int | None:
    """The number of `line` in `file`: read in a task, where the file is (the driver, or a
    Spark Connect client, may not see it). Runs only once a bad line was found."""

    def find(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for content in batch.column("content").to_pylist():
                yield pa.RecordBatch.from_pydict(
                    {"line": [find_line(content, line)]}, schema=pa.schema([("line", pa.int64())])
                )

    rows = (
        spark.read.format("binaryFile")
        .load(file)
        .select("content")
        .mapInArrow(find, "line long")
        .collect()
    )
    return rows[0]["line"] if rows else None


def find_line(content: bytes, line: Line) -> int | None:
    """The 1-based number of the first line of `content` that `line` matches, or ``None``."""
    for number, raw in enumerate(content.split(b"\n"), 1):
        if line.matches(raw.decode("utf-8", errors="replace").removesuffix("\r")):
            return number
    return None


def line_problem(text: str) -> str:
    """What makes an event-log line unreadable by the schema: not JSON, or a field of a type
    its column cannot hold (what Spark's JSON reader refuses, said in one phrase)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg}, column {exc.colno})"
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(data, dict):
        return f"not a JSON object (a JSON {type(data).__name__})"
    return _field_problem(data) or "a field of a type its column cannot hold"


def _field_problem(data: dict[str, Any]) -> str | None:
    """The first field of a decoded line that Spark cannot read as its column's type."""
    version = data.get("v")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        return f"field 'v' is not an integer ({version!r:.40})"
    for name in ("watched_at", "timeout", "deadline", "ended_at"):
        if not _number(data.get(name)):
            return f"field {name!r} is not a number ({data[name]!r:.40})"
    keys = data.get("keys")
    if keys is not None and not isinstance(keys, list):
        return f"field 'keys' is not a list ({keys!r:.40})"
    anchor = data.get("anchor")
    if anchor is not None and not (
        isinstance(anchor, dict) and _number(anchor.get("clock")) and _number(anchor.get("utc"))
    ):
        return f"field 'anchor' is not an object of two numbers ({anchor!r:.60})"
    return None


def _number(value: object) -> bool:
    """Whether Spark reads `value` as a double: a number, null, or a non-finite one's name."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return True
    return isinstance(value, str) and value.lstrip("+-") in ("NaN", "Infinity", "INF")


def _arrow_records(spark: SparkSession, path: str) -> DataFrame:
    """The records of every ``*.arrows`` file under `path`, shaped as JSON lines are read.

    Spark has no reader for Arrow IPC streams: each file is read whole (``binaryFile``, any
    file system Spark knows) and parsed by pyarrow in a Python worker. An operation's row keeps
    its columns; the distinct anchors its batches carry become anchor records; a stream that is
    not an event log becomes one record saying so (``_broken``).
    """
    files = (
        spark.read.format("binaryFile")
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.arrows")
        .load(path)
        .select("path", "content")
    )

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out = _arrow_out_schema()
        for batch in batches:
            for name, content in zip(
                batch.column("path").to_pylist(), batch.column("content").to_pylist(), strict=True
            ):
                yield from parse_arrow_file(name, content, out)

    return files.mapInArrow(parse, _RECORDS)


def _arrow_out_schema() -> pa.Schema:
    return pa.schema(
        [
            ("v", pa.int32()),
            ("purgatory", pa.string()),
            ("id", pa.string()),
            ("keys", pa.list_(pa.string())),
            ("watched_at", pa.float64()),
            ("timeout", pa.float64()),
            ("deadline", pa.float64()),
            ("outcome", pa.string()),
            ("ended_at", pa.float64()),
            ("anchor", pa.struct([("clock", pa.float64()), ("utc", pa.float64())])),
            ("_corrupt", pa.string()),
            ("_broken", pa.string()),
            ("_file", pa.string()),
        ]
    )


_ARROW_KEPT: Final = (
    "purgatory",
    "id",
    "keys",
    "watched_at",
    "timeout",
    "deadline",
    "outcome",
    "ended_at",
)


def parse_arrow_file(name: str, content: bytes, out: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The records of one Arrow event-log stream as batches of `out`; a last record with
    ``_broken`` set if the stream is not (wholly) a readable event log of a known version."""
    anchors: dict[tuple[float, float], None] = {}
    version = 0
    reason: str | None = None

    def records(n: int, columns: list[Any], anchor: Any, broken: str | None) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [
                pa.repeat(pa.scalar(version or None, pa.int32()), n),
                *columns,
                anchor,
                pa.nulls(n, pa.string()),
                pa.repeat(pa.scalar(broken, pa.string()), n),
                pa.repeat(pa.scalar(name, pa.string()), n),
            ],
            schema=out,
        )

    kept = [f for f in out if f.name in _ARROW_KEPT]
    anchor_type = out.field("anchor").type
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(content))
        metadata = reader.schema.metadata or {}
        found = metadata.get(ARROW_VERSION_KEY, b"").decode(errors="replace")
        if not found.isdigit() or int(found) not in LOG_VERSIONS[1:]:
            raise _NotAnEventLog(
                f"not an event-log Arrow stream of a known schema version (its "
                f"{ARROW_VERSION_KEY.decode()} is {found or 'missing'!r})"
            )
        version = int(found)
        for batch in reader:
            n = batch.num_rows
            if not n:
                continue
            anchor = batch.column("anchor")[0].as_py()
            if anchor is not None:
                anchors[anchor["clock"], anchor["utc"]] = None
            yield records(n, [batch.column(f.name) for f in kept], pa.nulls(n, anchor_type), None)
    except _NotAnEventLog as exc:
        reason = str(exc)
    except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
        reason = f"unreadable Arrow stream ({first_line(exc)})"
    if reason is not None:
        yield records(1, [pa.nulls(1, f.type) for f in kept], pa.nulls(1, anchor_type), reason)
        return
    if anchors:
        n = len(anchors)
        values = pa.array([{"clock": c, "utc": u} for c, u in anchors], anchor_type)
        yield records(n, [pa.nulls(n, f.type) for f in kept], values, None)


class _NotAnEventLog(Exception):
    """An Arrow stream without an event log's version in its metadata."""


def operations_of(records: DataFrame) -> DataFrame:
    """The operations of `event_log_records`, each with its ``utc_offset`` and ``_file``."""
    is_anchor = F.col("anchor").isNotNull()
    anchors = records.where(is_anchor).select(
        "_file", F.col("anchor.clock").alias("clock"), F.col("anchor.utc").alias("utc")
    )
    return _with_utc_offset(records.where(~is_anchor).drop("anchor"), anchors)


def _with_utc_offset(ops: DataFrame, anchors: DataFrame) -> DataFrame:
    """`ops` with ``utc_offset`` from the anchor of its ``_file`` in force at its watch.

    An anchor is in force from its clock time to the next anchor's; a file's first anchor also
    covers what was watched before it (the operations of the file's first batch). Anchors are
    few (one per file, one more per step of the system clock): they are broadcast.
    """
    order = Window.partitionBy("_file").orderBy("clock")
    spans = anchors.select(
        F.col("_file").alias("_afile"),
        (F.col("utc") - F.col("clock")).alias("utc_offset"),
        F.when(F.row_number().over(order) == 1, F.lit(-math.inf))
        .otherwise(F.col("clock"))
        .alias("_lo"),
        F.coalesce(F.lead("clock").over(order), F.lit(math.inf)).alias("_hi"),
    )
    watched = F.col("watched_at")
    return ops.join(
        F.broadcast(spans),
        (F.col("_file") == F.col("_afile")) & (watched >= F.col("_lo")) & (watched < F.col("_hi")),
        "left",
    ).drop("_afile", "_lo", "_hi")


def anchors_of(records: DataFrame) -> list[dict[str, float]]:
    """The distinct anchors of `records`, by UTC (for a trace's metadata)."""
    rows = (
        records.where(F.col("anchor").isNotNull())
        .select("anchor.clock", "anchor.utc")
        .distinct()
        .orderBy("utc", "clock")
        .collect()
    )
    return [{"clock": row["clock"], "utc": row["utc"]} for row in rows]


def _delayed_events(log: DataFrame, by: Sequence[str]) -> DataFrame:
    """+1 at the watch and -1 at the end of every operation that waited in the timer.

    An operation completed at the instant of its watch completed inside the watch call and never
    waited. At one instant, operations that end come before those watched (a replay expires and
    triggers before it admits the next arrival), except one that ends at the instant of its own
    watch (a zero timeout), which comes right after its watch; ties go by operation id.
    """
    waited = log.where(
        F.col("outcome").isin("completed", "expired", "cancelled", "open")
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
) -> DataFrame:
    """Analyse event logs: ``summary/``, ``keys/``, ``windows/`` and ``waits/`` under `out`.

    - summary: per purgatory, the columns a replay's summary shares (`SHARED_SUMMARY_COLUMNS`),
      computed the same way (``peak_delayed`` from the watch and end times);
    - keys: per (purgatory, key): operations, outcomes, mean and max wait, peak waiters;
    - windows: per (purgatory, window of `window` seconds): watched, completed, expired and
      cancelled operations (by their end); in UTC (``time_base`` ``"utc"``, ``window_utc`` a
      timestamp, written as UTC-adjusted microseconds so every Parquet reader keeps the zone)
      for operations whose log carries an anchor, else in seconds of the purgatory's clock
      (``time_base`` ``"clock"``, ``window_utc`` null);
    - waits: per (purgatory, outcome): counts of waits by power-of-two milliseconds bucket.

    `since` and `until` (aware datetimes; naive ones are taken as UTC) keep the operations
    watched in ``[since, until)``; every log must then carry an anchor.

    Returns:
        The summary, read back from `out`.
    """
    if not (window > 0 and math.isfinite(window)):
        raise ValueError(f"window must be a finite number of seconds > 0, got {window!r}")
    # Read once: the check's scan fills the cache the analyses read; the operations (after the
    # anchors' join) are cached too, as the four tables read them: 5 Spark jobs and about 1 s
    # fewer on a small log. (A cached plan outlives its files, so both are unpersisted whatever
    # happens, through the very DataFrames cached.)
    raw = _read_records(spark, log_path).persist(StorageLevel.MEMORY_AND_DISK)
    cached = [raw]
    try:
        check_records(spark, raw, log_path)
        log = operations_of(raw.drop("_corrupt", "_broken"))
        if since is not None or until is not None:
            log = _in_utc_range(log, since, until, log_path)
        log = log.drop("_file").persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(log)
        tables = {
            "summary": _summary(log).orderBy("purgatory").coalesce(1),
            "keys": _keys(log).orderBy("purgatory", F.desc("peak_waiters"), "key"),
            "windows": _windows(log, window).orderBy("purgatory", "time_base", "window_start"),
            "waits": _waits(log).orderBy("purgatory", "outcome", "bucket_ms"),
        }
        with atomic_output(spark, out, overwrite=overwrite) as staging, utc_timestamps(spark):
            for name, table in tables.items():
                table.write.parquet(f"{staging}/{name}")
    finally:
        for frame in cached:
            frame.unpersist()
    return spark.read.parquet(f"{out}/summary").orderBy("purgatory")


def _summary(log: DataFrame) -> DataFrame:
    peaks = (
        _delayed_events(log, ["purgatory"])
        .groupBy("purgatory")
        .agg(F.max("_level").alias("peak_delayed"))
    )
    return (
        outcome_summary(log, ["purgatory"])
        .join(peaks, "purgatory", "left")
        .na.fill(0, ["peak_delayed"])
        .select(*SHARED_SUMMARY_COLUMNS, "expired_share")
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


def _windows(log: DataFrame, window: float) -> DataFrame:
    base = F.when(F.col("utc_offset").isNull(), "clock").otherwise("utc").alias("time_base")
    shift = F.coalesce(F.col("utc_offset"), F.lit(0.0))
    watched = log.select(
        "purgatory",
        base,
        F.floor((F.col("watched_at") + shift) / window).alias("_w"),
        F.lit("watched").alias("_kind"),
    )
    ended = log.where(F.col("ended_at").isNotNull()).select(
        "purgatory",
        base,
        F.floor((F.col("ended_at") + shift) / window).alias("_w"),
        F.col("outcome").alias("_kind"),
    )
    kinds = ("watched", "completed", "expired", "cancelled")
    start = F.col("_w") * window
    return (
        watched.unionByName(ended)
        .groupBy("purgatory", "time_base", "_w")
        .agg(*(F.sum(F.when(F.col("_kind") == k, 1).otherwise(0)).alias(k) for k in kinds))
        .select(
            "purgatory",
            "time_base",
            start.alias("window_start"),
            F.when(F.col("time_base") == "utc", F.timestamp_seconds(start)).alias("window_utc"),
            F.lit(window).alias("window_seconds"),
            *kinds,
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


def _in_utc_range(
    log: DataFrame, since: datetime | None, until: datetime | None, root: str
) -> DataFrame:
    """The operations watched in ``[since, until)`` (UTC); refused if a log has no anchor."""
    missing = log.where(F.col("utc_offset").isNull()).select("_file").limit(1).collect()
    if missing:
        raise TraceError(
            f"event log file {as_given(missing[0]['_file'], root)}: no UTC anchor (schema "
            "version 1, or recorded without a wall clock), so --since/--until cannot place its "
            "operations"
        )
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
