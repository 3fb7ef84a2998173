"""The Spark jobs: generate, validate, replay, analyse.

Every job reads and writes through Spark (local disk, HDFS or an object store alike) and writes
its output whole or not at all (`atomic_output`). Python runs only where it must: the generator
and the replay engine inside ``mapInArrow`` over Arrow batches; the summaries are Spark
aggregations, the same function for a replay's own operations and for a recorded event log.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .._eventlog_arrow import ARROW_VERSION_KEY
from .._recorder import EVENT_LOG_VERSION
from ._checks import horizon_limits
from ._generate import TRACE_SCHEMA, W1, chunk_plan, generate_chunk
from ._load import CostProfile
from ._replay import OUTPUT_SCHEMA, ReplayConfig, replay_batches
from ._spark import atomic_output

__all__ = (
    "EVENT_LOG_SCHEMA",
    "TraceError",
    "analyze",
    "generate",
    "load_event_log",
    "load_trace",
    "outcome_summary",
    "replay",
    "trace_anchors",
    "trace_from_log",
)

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
#: The metadata key, on a trace's ``arrival`` column, of the anchors of the logs it came from.
TRACE_ANCHORS_KEY: Final = "purgatory.anchors"

_OUTCOMES: Final = ("completed", "expired", "cancelled", "refused", "open")
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_NUMERIC = (*_INTEGRAL, T.FloatType, T.DoubleType, T.DecimalType)


class TraceError(ValueError):
    """A trace or an event log that cannot be used as it is; the message names file and row."""


# -- generate ---------------------------------------------------------------------------------


def generate(spark: SparkSession, w1: W1, out: str, *, overwrite: bool = False) -> int:
    """Write a seeded W1 trace of ``w1.purgatories * w1.operations`` rows to `out` (Parquet).

    Returns:
        The number of rows written.
    """
    plan = chunk_plan(w1)
    chunks = spark.createDataFrame(
        plan, "p int, c int, first long, count long, start double, span double"
    ).repartition(len(plan))

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for row in batch.to_pylist():
                chunk = (row["p"], row["c"], row["first"], row["count"], row["start"], row["span"])
                yield generate_chunk(w1, chunk)

    trace = chunks.mapInArrow(run, _spark_schema(TRACE_SCHEMA))
    with atomic_output(spark, out, overwrite=overwrite) as staging:
        trace.write.parquet(staging)
    return w1.purgatories * w1.operations


# -- trace loading and validation --------------------------------------------------------------


def load_trace(spark: SparkSession, path: str, configs: Sequence[ReplayConfig] = ()) -> DataFrame:
    """Read a trace (schema version 1) and check it whole; raise `TraceError` on bad input.

    Checked: the columns and their types (numbers of any width are cast to double, integers to
    long, integer keys to strings); no nulls where none may be; timeouts finite and >= 0, and
    (scaled) within the timer's horizon under each of `configs`; arrivals finite; conditions not
    NaN, not infinite, not before the arrival; keys non-empty; operation ids unique per
    purgatory. A bad row is reported before a duplicate id.

    Runtime cost on a valid trace: one scan with a filter (no shuffle) for the rows, and one
    count per 64-bit hash of (purgatory, op_id) over those two columns (a lean hash aggregation).
    The detailed queries that name files and rows run only when something was found.

    Returns:
        The trace with exactly the columns of `TRACE_SCHEMA`, in that order.
    """
    raw = _read_trace(spark, path)
    trace, with_file = _cast(raw), _cast(raw, file=True)
    _check_rows(with_file, _row_problem(configs))
    _check_unique_ids(trace, with_file)
    return trace


def _read_trace(spark: SparkSession, path: str) -> DataFrame:
    """The trace as stored; raises `TraceError` at once for what the schema alone shows.

    That is: unreadable, a missing column, a wrong type. What needs the data is left to the
    checks.
    """
    try:
        raw = spark.read.parquet(path)
    except AnalysisException as exc:
        raise TraceError(f"trace {path}: cannot read it as Parquet: {_first_line(exc)}") from None
    files = raw.inputFiles()
    where = files[0] if len(files) == 1 else path
    columns = {field.name: field.dataType for field in raw.schema.fields}
    for name in TRACE_SCHEMA.names:
        if name not in columns:
            raise TraceError(
                f"trace {where}: missing column {name!r} (it has {sorted(columns)}; "
                "see docs/pipeline-schemas.md)"
            )

    def wrong(name: str, expected: str) -> TraceError:
        return TraceError(
            f"trace {where}: column {name!r} has type {columns[name].simpleString()}, "
            f"expected {expected}"
        )

    if not isinstance(columns["purgatory"], T.StringType):
        raise wrong("purgatory", "string")
    if not isinstance(columns["op_id"], _INTEGRAL):
        raise wrong("op_id", "an integer")
    for name in ("arrival", "timeout", "condition_at"):
        if not isinstance(columns[name], _NUMERIC):
            raise wrong(name, "a number (seconds)")
    keys_type = columns["keys"]
    if not (
        isinstance(keys_type, T.ArrayType)
        and isinstance(keys_type.elementType, (T.StringType, *_INTEGRAL))
    ):
        raise wrong("keys", "a list of strings")
    return raw


def _cast(raw: DataFrame, *, file: bool = False) -> DataFrame:
    """The columns of `TRACE_SCHEMA`, cast to its types; with ``file``, each row's file too.

    Only the checks that name a file read it: the file path is a metadata column that Spark
    does not prune once selected, so the trace handed on to the replay leaves it out.
    """
    return raw.select(
        F.col("purgatory"),
        F.col("op_id").cast("long").alias("op_id"),
        F.col("arrival").cast("double").alias("arrival"),
        F.col("keys").cast("array<string>").alias("keys"),
        F.col("timeout").cast("double").alias("timeout"),
        F.col("condition_at").cast("double").alias("condition_at"),
        *([F.col("_metadata.file_path").alias("_file")] if file else []),
    )


def _row_problem(configs: Sequence[ReplayConfig]) -> Column:
    """The message of a trace row's first problem, null for a good row."""
    return _first_problem(
        [
            (F.col("purgatory").isNull(), "column 'purgatory' is null"),
            (F.col("op_id").isNull(), "column 'op_id' is null"),
            (F.col("arrival").isNull(), "column 'arrival' is null"),
            (_not_finite(F.col("arrival")), "column 'arrival' is not finite"),
            (F.col("timeout").isNull(), "column 'timeout' is null"),
            (_not_finite(F.col("timeout")), "column 'timeout' is not finite"),
            (F.col("timeout") < 0, "column 'timeout' is negative"),
            *(
                (
                    F.col("timeout") * F.lit(scale) > F.lit(limit),
                    f"column 'timeout' is beyond the timer's horizon ({label})",
                )
                for scale, limit, label in horizon_limits(configs)
            ),
            (F.col("keys").isNull(), "column 'keys' is null"),
            (F.size("keys") == 0, "column 'keys' is empty"),
            (F.exists("keys", lambda k: k.isNull()), "column 'keys' holds a null key"),
            (
                F.col("condition_at").isNotNull() & _not_finite(F.col("condition_at")),
                "column 'condition_at' is not finite (use null for never)",
            ),
            (
                F.col("condition_at") < F.col("arrival"),
                "column 'condition_at' is before the arrival",
            ),
        ]
    )


def _check_rows(with_file: DataFrame, problem: Column) -> None:
    """Raise `TraceError` naming the first bad row (by purgatory, op_id, file) and counting more.

    A filter and a top-5 (Spark's TakeOrderedAndProject): one scan, no shuffle, no aggregation;
    on a valid trace the filter keeps nothing.
    """
    bad = (
        with_file.select(*_ROW, problem.alias("_problem"))
        .where(F.col("_problem").isNotNull())
        .orderBy("purgatory", "op_id", "_file")
        .limit(5)
        .collect()
    )
    if bad:
        first = bad[0]
        raise TraceError(
            f"trace file {first['_file']}: row purgatory={first['purgatory']!r} "
            f"op_id={first['op_id']!r}: {first['_problem']} (arrival={first['arrival']!r}, "
            f"timeout={first['timeout']!r}, condition_at={first['condition_at']!r})"
            + (f"; {len(bad) - 1}+ more bad rows" if len(bad) > 1 else "")
        )


def _check_unique_ids(trace: DataFrame, with_file: DataFrame) -> None:
    """Raise `TraceError` for the first duplicate (purgatory, op_id), naming its files.

    Rows are counted per 64-bit hash of the id (`_id_hash`): a hash aggregation on one long
    column, the cheapest Spark has (grouping by the string and the long, let alone collecting
    files, costs more). A hash seen twice is only a candidate, since two ids may share a hash:
    then the exact aggregation by id decides, and names the files. Needs no null ids (the row
    check refuses them first).
    """
    candidates = (
        trace.select(_id_hash().alias("_hash"))
        .groupBy("_hash")
        .count()
        .where(F.col("count") > 1)
        .limit(1)
        .collect()
    )
    if not candidates:
        return
    found = (
        with_file.groupBy("purgatory", "op_id")
        .agg(F.count(F.lit(1)).alias("n"), F.collect_set("_file").alias("files"))
        .where(F.col("n") > 1)
        .orderBy("purgatory", "op_id")
        .limit(1)
        .collect()
    )
    if found:
        first = found[0]
        raise TraceError(
            f"trace file {', '.join(sorted(first['files']))}: duplicate op_id "
            f"{first['op_id']!r} in purgatory {first['purgatory']!r} ({first['n']} rows; "
            "an operation id must be unique within its purgatory)"
        )


def _id_hash() -> Column:
    """A 64-bit hash of (purgatory, op_id): equal ids, equal hashes (not the converse)."""
    return F.xxhash64("purgatory", "op_id")


_ROW: Final = ("_file", "purgatory", "op_id", "arrival", "timeout", "condition_at")


def _not_finite(column: Column) -> Column:
    return F.isnan(column) | (F.abs(column) == F.lit(math.inf))


def _first_problem(checks: Sequence[tuple[Column, str | None]]) -> Column:
    """The message of the first check that holds (a ``None`` message: no problem, stop)."""
    expr: Any = F
    for condition, message in checks:
        expr = expr.when(condition, F.lit(message))
    result: Column = expr
    return result


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


# -- replay -----------------------------------------------------------------------------------


def replay(
    spark: SparkSession,
    trace_path: str,
    out: str,
    configs: Sequence[ReplayConfig],
    *,
    event_log: str | None = None,
    partitions: int | None = None,
    overwrite: bool = False,
    costs: CostProfile | None = None,
    operations: bool = True,
) -> DataFrame:
    """Replay a trace under every configuration; write ``summary/`` (and ``operations/``) to `out`.

    Each (purgatory, configuration) is one group: the trace is crossed with the configurations,
    hash-partitioned by group and sorted by arrival inside each partition, and `replay_batches`
    streams each partition's batches (see its module for what it holds in memory).

    Args:
        partitions: Spark partitions of the replay; default four per core.
        event_log: A directory every executor can write to (a local path in local mode), where
            each group writes its event log.
        costs: A cost profile (the load model: each group served by one core); ``None``: the
            purgatory's work costs nothing, and ``utilisation`` and the pass lateness are 0.
        operations: Also write every operation's row (``operations/``); the summary does not
            need them (each group's is computed inside its task), and the job runs faster
            without.

    Returns:
        The summary, read back from `out`.
    """
    if not configs:
        raise ValueError("replay needs at least one configuration")
    trace = load_trace(spark, trace_path, configs)
    by_id = dict(enumerate(configs))
    grid = spark.createDataFrame(
        [
            (i, c.tick, c.wheel_size, c.purge_interval, c.timeout_scale, c.rate_scale, c.trigger)
            for i, c in by_id.items()
        ],
        "config_id int, tick double, wheel_size int, purge_interval int, timeout_scale double, "
        "rate_scale double, trigger string",
    )
    if partitions is None:
        # A group never spans two partitions (hash partitioning keeps equal keys together), so
        # extra partitions are only empty; a few per core let a long group not hold up the rest.
        partitions = 4 * spark.sparkContext.defaultParallelism
    work = (
        trace.crossJoin(F.broadcast(grid.select("config_id")))
        .repartition(partitions, "purgatory", "config_id")
        .sortWithinPartitions("purgatory", "config_id", "arrival", "op_id")
        .select("purgatory", "config_id", "op_id", "arrival", "keys", "timeout", "condition_at")
    )

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return replay_batches(
            batches, by_id, event_log_dir=event_log, costs=costs, operations=operations
        )

    result = work.mapInArrow(run, _spark_schema(OUTPUT_SCHEMA))
    if operations:  # read twice: the operations, then the summary rows
        result = result.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # Each group's summary comes from its own task (the engine's last row for the group).
        groups = result.where(F.col("op_id").isNull())
        summary = (
            groups.select(
                "purgatory",
                "config_id",
                "operations",
                "completed",
                "expired",
                *(F.lit(0).cast("long").alias(name) for name in _COUNTS[3:]),
                _share("expired"),
                "missed",
                _share("missed"),
                *_STATS,
                "peak_delayed",
                "peak_watched",
                "timer_passes",
                "purges",
                "purged_entries",
                "attempts",
                F.col("busy").alias("busy_seconds"),
                F.when(F.col("span") > 0, F.col("busy") / F.col("span"))
                .otherwise(0.0)
                .alias("utilisation"),
                F.col("pass_late_p50").alias("pass_lateness_p50"),
                F.col("pass_late_p99").alias("pass_lateness_p99"),
                F.col("pass_late_max").alias("pass_lateness_max"),
            )
            .join(grid, "config_id")
            .select(*REPLAY_SUMMARY_COLUMNS)
            .orderBy("purgatory", "config_id")
        )
        with atomic_output(spark, out, overwrite=overwrite) as staging:
            if operations:
                result.where(F.col("op_id").isNotNull()).select(
                    "purgatory",
                    "config_id",
                    "op_id",
                    "outcome",
                    "watched_at",
                    "deadline",
                    "ended_at",
                    (F.col("ended_at") - F.col("watched_at")).alias("wait"),
                ).write.parquet(f"{staging}/operations")
            summary.coalesce(1).write.parquet(f"{staging}/summary")
    finally:
        if operations:
            result.unpersist()
    return spark.read.parquet(f"{out}/summary").orderBy("purgatory", "config_id")


_COUNTS: Final = ("operations", "completed", "expired", "cancelled", "refused", "open")
_STATS: Final = (
    "wait_p50",
    "wait_p99",
    "wait_max",
    "lateness_p50",
    "lateness_p99",
    "lateness_max",
)
#: The columns a replay's summary and an event log's analysis share, computed the same way.
SHARED_SUMMARY_COLUMNS: Final = ("purgatory", *_COUNTS, *_STATS, "peak_delayed")
REPLAY_SUMMARY_COLUMNS: Final = (
    "purgatory",
    "config_id",
    "tick",
    "wheel_size",
    "purge_interval",
    "timeout_scale",
    "rate_scale",
    "trigger",
    *_COUNTS,
    "expired_share",
    "missed",
    "missed_share",
    *_STATS,
    "peak_delayed",
    "peak_watched",
    "timer_passes",
    "purges",
    "purged_entries",
    "attempts",
    "busy_seconds",
    "utilisation",
    "pass_lateness_p50",
    "pass_lateness_p99",
    "pass_lateness_max",
)


def outcome_summary(ops: DataFrame, by: Sequence[str]) -> DataFrame:
    """Counts by outcome, wait and expiry-lateness percentiles per group of `by`.

    `ops` has ``outcome``, ``watched_at``, ``deadline`` and ``ended_at``. The wait (end minus
    watch) is taken over completed and expired operations; the lateness (end minus deadline)
    over expired ones. Percentiles are ``percentile_disc`` (nearest rank: an observed value, the
    same whatever the partitioning), so two summaries of the same operations are equal.
    """
    outcome = F.col("outcome")
    ended = outcome.isin("completed", "expired")
    wait = F.when(ended, F.col("ended_at") - F.col("watched_at"))
    late = F.when(outcome == "expired", F.col("ended_at") - F.col("deadline"))
    counts = [F.sum(F.when(outcome == name, 1).otherwise(0)).alias(name) for name in _COUNTS[1:]]
    return (
        ops.withColumn("_wait", wait)
        .withColumn("_late", late)
        .groupBy(*by)
        .agg(
            F.count(F.lit(1)).alias("operations"),
            *counts,
            _pdisc(0.5, "_wait").alias("wait_p50"),
            _pdisc(0.99, "_wait").alias("wait_p99"),
            F.max("_wait").alias("wait_max"),
            _pdisc(0.5, "_late").alias("lateness_p50"),
            _pdisc(0.99, "_late").alias("lateness_p99"),
            F.max("_late").alias("lateness_max"),
        )
        .withColumn("expired_share", _share("expired"))
    )


def _share(count: str) -> Column:
    """``<count>_share``: `count` over the operations (0 when there are none)."""
    return (F.col(count) / F.greatest(F.col("operations"), F.lit(1))).alias(f"{count}_share")


def _pdisc(p: float, column: str) -> Column:
    return F.expr(f"percentile_disc({p}) WITHIN GROUP (ORDER BY {column})")


# -- event logs -------------------------------------------------------------------------------


def load_event_log(spark: SparkSession, path: str) -> DataFrame:
    """Read every event log under `path`: ``*.jsonl`` and ``*.arrows`` files (``*.part`` files,
    still being written, skipped).

    Each operation's row has the record's fields and ``utc_offset``: seconds to add to its times
    (``watched_at``, ``deadline``, ``ended_at``) for UTC seconds since the epoch, from its file's
    anchor at or before its watch (the file's first anchor if none is); null when its file has
    no anchor (schema version 1, or a recorder that could not anchor: its times stay seconds of
    the purgatory's clock).

    Raises:
        TraceError: No file, a malformed line, a line of another schema version, or a line
            missing a field its outcome requires.
    """
    return _load_event_log(_raw_event_log(spark, path)).drop("_file")


def _raw_event_log(spark: SparkSession, path: str) -> DataFrame:
    """Every record (operations and anchors) of both formats, checked, with its ``_file``."""
    try:
        lines = (
            spark.read.schema(EVENT_LOG_SCHEMA)
            .option("mode", "FAILFAST")
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", "*.jsonl")
            .json(path)
        )
        lines = lines.withColumn("_file", F.col("_metadata.file_path"))
        raw = lines.unionByName(_arrow_records(spark, path))
    except AnalysisException as exc:
        raise TraceError(f"event log {path}: {_first_line(exc)}") from None
    is_anchor = F.col("anchor").isNotNull()
    problem = _first_problem(
        [
            (
                F.col("v").isNull() | ~F.col("v").isin(1, EVENT_LOG_VERSION),
                f"field 'v' is not 1 or {EVENT_LOG_VERSION} (schema version)",
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
    )
    try:
        bad = (
            raw.withColumn("_problem", problem)
            .where(F.col("_problem").isNotNull())
            .select("_file", "purgatory", "id", "_problem")
            .limit(1)
            .collect()
        )
    except Exception as exc:  # noqa: BLE001 - Spark's errors for malformed input, re-worded
        raise TraceError(f"event log {path}: {_worker_error(exc)}") from None
    if bad:
        row = bad[0]
        raise TraceError(
            f"event log file {row['_file']}: line of purgatory={row['purgatory']!r} "
            f"id={row['id']!r}: {row['_problem']}"
        )
    return raw


def _load_event_log(raw: DataFrame) -> DataFrame:
    """The operations of `_raw_event_log`, each with its ``utc_offset`` and ``_file``."""
    is_anchor = F.col("anchor").isNotNull()
    anchors = raw.where(is_anchor).select(
        "_file", F.col("anchor.clock").alias("clock"), F.col("anchor.utc").alias("utc")
    )
    return _with_utc_offset(raw.where(~is_anchor).drop("anchor"), anchors)


def _worker_error(exc: BaseException) -> str:
    """The one useful line of an error, out of a Python worker's traceback if need be."""
    text = str(exc)
    for line in reversed(text.splitlines()):
        if line.startswith(_ArrowStreamError.__name__ + ": "):
            return line.split(": ", 1)[1]
    return _first_line(exc)


class _ArrowStreamError(ValueError):
    """An ``.arrows`` file that is not an `ArrowEventLog` stream (raised in a Python worker)."""


_ARROW_RECORDS: Final = T.StructType(
    [*EVENT_LOG_SCHEMA.fields, T.StructField("_file", T.StringType())]
)


def _arrow_records(spark: SparkSession, path: str) -> DataFrame:
    """The records of every ``*.arrows`` file under `path`, shaped as JSON lines are read.

    Spark has no reader for Arrow IPC streams: each file is read whole (``binaryFile``, any
    file system Spark knows) and parsed by pyarrow in a Python worker. An operation's row keeps
    its columns; the distinct anchors its batches carry become anchor records.
    """
    files = (
        spark.read.format("binaryFile")
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.arrows")
        .load(path)
        .select("path", "content")
    )
    out = _arrow_out_schema()

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for name, content in zip(
                batch.column("path").to_pylist(), batch.column("content").to_pylist(), strict=True
            ):
                yield from _parse_arrow_file(name, content, out)

    return files.mapInArrow(parse, _ARROW_RECORDS)


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
            ("_file", pa.string()),
        ]
    )


def _parse_arrow_file(name: str, content: bytes, out: pa.Schema) -> Iterator[pa.RecordBatch]:
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(content))
        metadata = reader.schema.metadata or {}
        version = metadata.get(ARROW_VERSION_KEY.encode())
        if version != str(EVENT_LOG_VERSION).encode():
            raise _ArrowStreamError(
                f"event log file {name}: not an event-log Arrow stream of schema version "
                f"{EVENT_LOG_VERSION} (metadata {metadata!r})"
            )
        anchors: dict[tuple[float, float], None] = {}
        for batch in reader:
            n = batch.num_rows
            if not n:
                continue
            anchor = batch.column("anchor")[0].as_py()
            if anchor is not None:
                anchors[anchor["clock"], anchor["utc"]] = None
            yield pa.RecordBatch.from_arrays(
                [
                    pa.repeat(pa.scalar(EVENT_LOG_VERSION, pa.int32()), n),
                    *(batch.column(f.name) for f in out if f.name in _ARROW_KEPT),
                    pa.nulls(n, out.field("anchor").type),
                    pa.repeat(pa.scalar(name, pa.string()), n),
                ],
                schema=out,
            )
    except (OSError, pa.ArrowInvalid) as exc:
        raise _ArrowStreamError(f"event log file {name}: unreadable Arrow stream: {exc}") from None
    if anchors:
        n = len(anchors)
        yield pa.RecordBatch.from_arrays(
            [
                pa.repeat(pa.scalar(EVENT_LOG_VERSION, pa.int32()), n),
                *(pa.nulls(n, f.type) for f in out if f.name in _ARROW_KEPT),
                pa.array([{"clock": c, "utc": u} for c, u in anchors], out.field("anchor").type),
                pa.repeat(pa.scalar(name, pa.string()), n),
            ],
            schema=out,
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


def _anchors_of(raw: DataFrame) -> list[dict[str, float]]:
    """The distinct anchors of the records `raw`, by UTC (for a trace's metadata)."""
    rows = (
        raw.where(F.col("anchor").isNotNull())
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
      timestamp) for operations whose log carries an anchor, else in seconds of the
      purgatory's clock (``time_base`` ``"clock"``, ``window_utc`` null);
    - waits: per (purgatory, outcome): counts of waits by power-of-two milliseconds bucket.

    `since` and `until` (aware datetimes; naive ones are taken as UTC) keep the operations
    watched in ``[since, until)``; every log must then carry an anchor.

    Returns:
        The summary, read back from `out`.
    """
    if not (window > 0 and math.isfinite(window)):
        raise ValueError(f"window must be a finite number of seconds > 0, got {window!r}")
    log = _load_event_log(_raw_event_log(spark, log_path))
    if since is not None or until is not None:
        log = _in_utc_range(log, since, until)
    log = log.drop("_file").persist(StorageLevel.MEMORY_AND_DISK)
    try:
        peaks = (
            _delayed_events(log, ["purgatory"])
            .groupBy("purgatory")
            .agg(F.max("_level").alias("peak_delayed"))
        )
        summary = (
            outcome_summary(log, ["purgatory"])
            .join(peaks, "purgatory", "left")
            .na.fill(0, ["peak_delayed"])
        )
        by_key = log.withColumn("key", F.explode("keys"))
        key_peaks = (
            _delayed_events(by_key, ["purgatory", "key"])
            .groupBy("purgatory", "key")
            .agg(F.max("_level").alias("peak_waiters"))
        )
        outcome = F.col("outcome")
        wait = F.when(outcome.isin("completed", "expired"), F.col("ended_at") - F.col("watched_at"))
        keys = (
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
            outcome.alias("_kind"),
        )
        kinds = ("watched", "completed", "expired", "cancelled")
        start = F.col("_w") * window
        windows = (
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
        waits = (
            log.where(outcome.isin("completed", "expired"))
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
        with atomic_output(spark, out, overwrite=overwrite) as staging:
            summary.select(*SHARED_SUMMARY_COLUMNS, "expired_share").orderBy("purgatory").coalesce(
                1
            ).write.parquet(f"{staging}/summary")
            keys.orderBy("purgatory", F.desc("peak_waiters"), "key").write.parquet(
                f"{staging}/keys"
            )
            windows.orderBy("purgatory", "time_base", "window_start").write.parquet(
                f"{staging}/windows"
            )
            waits.orderBy("purgatory", "outcome", "bucket_ms").write.parquet(f"{staging}/waits")
    finally:
        log.unpersist()
    return spark.read.parquet(f"{out}/summary").orderBy("purgatory")


def _in_utc_range(log: DataFrame, since: datetime | None, until: datetime | None) -> DataFrame:
    """The operations watched in ``[since, until)`` (UTC); refused if a log has no anchor."""
    missing = log.where(F.col("utc_offset").isNull()).select("_file").limit(1).collect()
    if missing:
        raise TraceError(
            f"event log file {missing[0]['_file']}: no UTC anchor (schema version 1, or "
            "recorded without a wall clock), so --since/--until cannot place its operations"
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


def trace_from_log(spark: SparkSession, log_path: str, out: str, *, overwrite: bool = False) -> int:
    """Turn recorded event logs into a trace, so a real night of traffic can be replayed.

    A completed operation's condition became true at its completion; any other (expired,
    cancelled, refused, still open) never did as far as the log knows: null. Ids must be
    integers. Nothing is dropped: every line becomes a row. The trace's times stay those of the
    logs (the purgatory's clock); the logs' anchors go with them, as a JSON list of
    ``{"clock", "utc"}`` in the metadata of the ``arrival`` column under `TRACE_ANCHORS_KEY`
    (empty for logs without anchors): `trace_anchors` reads them back.

    Returns:
        The number of rows written.
    """
    raw = _raw_event_log(spark, log_path)
    log = _load_event_log(raw)
    anchors = json.dumps(_anchors_of(raw))
    trace = log.select(
        "purgatory",
        F.col("id").cast("long").alias("op_id"),
        F.col("watched_at").alias("arrival", metadata={TRACE_ANCHORS_KEY: anchors}),
        "keys",
        F.coalesce(F.col("timeout"), F.col("deadline") - F.col("watched_at")).alias("timeout"),
        F.when(F.col("outcome") == "completed", F.col("ended_at")).alias("condition_at"),
        F.col("id").alias("_id"),
        "_file",
    )
    bad = trace.where(F.col("op_id").isNull()).limit(1).collect()
    if bad:
        raise TraceError(
            f"event log file {bad[0]['_file']}: id {bad[0]['_id']!r} of purgatory "
            f"{bad[0]['purgatory']!r} is not an integer; a trace needs integer op ids"
        )
    trace = trace.drop("_id", "_file").persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with atomic_output(spark, out, overwrite=overwrite) as staging:
            trace.write.parquet(staging)
            load_trace(spark, staging)  # the same checks as any trace: fail before publishing
        return trace.count()
    finally:
        trace.unpersist()


def trace_anchors(trace: DataFrame) -> list[dict[str, float]]:
    """The UTC anchors a trace made by `trace_from_log` carries (``[]`` for any other trace)."""
    metadata = trace.schema["arrival"].metadata
    anchors: list[dict[str, float]] = json.loads(metadata.get(TRACE_ANCHORS_KEY, "[]"))
    return anchors


def _spark_schema(schema: pa.Schema) -> T.StructType:
    """The Spark struct for an Arrow schema of the types this package uses."""
    mapping: dict[str, T.DataType] = {
        "string": T.StringType(),
        "int32": T.IntegerType(),
        "int64": T.LongType(),
        "double": T.DoubleType(),
        "list<item: string>": T.ArrayType(T.StringType()),
    }
    return T.StructType([T.StructField(f.name, mapping[str(f.type)], f.nullable) for f in schema])
