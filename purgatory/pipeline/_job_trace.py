"""The trace jobs: `generate` a seeded W1 trace or one from event logs, and `load_trace`.

A trace is checked whole when it is loaded (columns, types, every row, unique ids), so the replay
never meets a row it cannot use. Parquet pages are read with their checksums verified: a page
corrupted in a copy fails the read, naming the file, instead of replaying wrong numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Final

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ._checks import TRACE_COLUMNS, horizon_limits
from ._direct import bad_row_message, duplicate_message
from ._frames import (
    TraceError,
    as_given,
    first_line,
    first_problem,
    not_finite,
    read_errors,
    spark_schema,
    task_errors,
)
from ._generate import TRACE_SCHEMA, W1, chunk_plan, generate_chunk
from ._job_eventlog import event_log_anchors, events
from ._replay import ReplayConfig
from ._spark import atomic_output

__all__ = (
    "TRACE_ANCHORS_KEY",
    "generate",
    "load_trace",
    "read_parquet",
    "trace_anchors",
    "trace_from_log",
)

#: The metadata key, on a trace's ``arrival`` column, of the anchors of the logs it came from.
TRACE_ANCHORS_KEY: Final = "purgatory.anchors"
#: Hadoop's option for parquet-mr: verify each page's CRC where the writer stored one (Spark's
#: writer does; pyarrow's only with ``write_page_checksum=True``). Off by default in Spark.
_VERIFY_PAGES: Final = "parquet.page.verify-checksum.enabled"

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_NUMERIC = (*_INTEGRAL, T.FloatType, T.DoubleType, T.DecimalType)
_ROW: Final = ("_file", "purgatory", "op_id", "arrival", "timeout", "condition_at")


def read_parquet(spark: SparkSession, path: str, schema: T.StructType | None = None) -> DataFrame:
    """Read Parquet with page checksums verified (a read option: Spark passes it to the
    reader's Hadoop configuration, on a classic session and on Spark Connect alike). With
    `schema` (the files' own), Spark infers none: no job until the frame is used."""
    reader = spark.read.option(_VERIFY_PAGES, "true")
    return (reader.schema(schema) if schema is not None else reader).parquet(path)


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

    trace = chunks.mapInArrow(run, spark_schema(TRACE_SCHEMA))
    with atomic_output(spark, out, overwrite=overwrite) as staging:
        trace.write.parquet(staging)
    return w1.purgatories * w1.operations


def load_trace(spark: SparkSession, path: str, configs: Sequence[ReplayConfig] = ()) -> DataFrame:
    """Read a trace (schema version 1) and check it whole; raise `TraceError` on bad input.

    Checked: the columns (no more, no fewer) and their types (numbers of any width are cast to
    double, integers to long, integer keys to strings); every page's checksum; no nulls where
    none may be; timeouts finite and >= 0, and (scaled) within the timer's horizon under each
    of `configs`; arrivals finite; conditions not NaN, not infinite, not before the arrival;
    keys non-empty; operation ids unique per purgatory. A bad row is reported before a
    duplicate id.

    Runtime cost on a valid trace: one scan with a filter (no shuffle) for the rows, and one
    count per 64-bit hash of (purgatory, op_id) over those two columns (a lean hash aggregation).
    The detailed queries that name files and rows run only when something was found.

    Returns:
        The trace with exactly the columns of `TRACE_SCHEMA`, in that order.
    """
    raw = _read_trace(spark, path)
    trace, with_file = _cast(raw), _cast(raw, file=True)
    with read_errors("trace file", path):
        _check_rows(with_file, _row_problem(configs), path)
        _check_unique_ids(trace, with_file, path)
    return trace


def _read_trace(spark: SparkSession, path: str) -> DataFrame:
    """The trace as stored; raises `TraceError` at once for what the schema alone shows.

    That is: unreadable, a missing or an unknown column, a wrong type. What needs the data is
    left to the checks.
    """
    try:
        raw = read_parquet(spark, path)
        files = raw.inputFiles()
    except AnalysisException as exc:
        raise TraceError(f"trace {path}: cannot read it as Parquet: {first_line(exc)}") from None
    where = as_given(files[0], path) if len(files) == 1 else path
    columns = {field.name: field.dataType for field in raw.schema.fields}
    for name in TRACE_SCHEMA.names:
        if name not in columns:
            raise TraceError(
                f"trace {where}: missing column {name!r} (it has {sorted(columns)}; "
                "see docs/pipeline-schemas.md)"
            )
    unknown = sorted(set(columns) - set(TRACE_COLUMNS))
    if unknown:
        raise TraceError(
            f"trace {where}: unknown column {unknown[0]!r} (a trace of schema version 1 has "
            f"exactly {', '.join(TRACE_COLUMNS)}; select those to replay it)"
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
    return first_problem(
        [
            (F.col("purgatory").isNull(), "column 'purgatory' is null"),
            (F.col("op_id").isNull(), "column 'op_id' is null"),
            (F.col("arrival").isNull(), "column 'arrival' is null"),
            (not_finite(F.col("arrival")), "column 'arrival' is not finite"),
            (F.col("timeout").isNull(), "column 'timeout' is null"),
            (not_finite(F.col("timeout")), "column 'timeout' is not finite"),
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
                F.col("condition_at").isNotNull() & not_finite(F.col("condition_at")),
                "column 'condition_at' is not finite (use null for never)",
            ),
            (
                F.col("condition_at") < F.col("arrival"),
                "column 'condition_at' is before the arrival",
            ),
        ]
    )


def _check_rows(with_file: DataFrame, problem: Column, root: str) -> None:
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
        raise TraceError(bad_row_message(bad[0].asDict(), len(bad) - 1, root))


def _check_unique_ids(trace: DataFrame, with_file: DataFrame, root: str) -> None:
    """Raise `TraceError` for the first duplicate (purgatory, op_id), naming its files.

    Rows are counted per 64-bit hash of the id (`id_hash`): a hash aggregation on one long
    column, the cheapest Spark has (grouping by the string and the long, let alone collecting
    files, costs more). A hash seen twice is only a candidate, since two ids may share a hash:
    then the exact aggregation by id decides, and names the files. Needs no null ids (the row
    check refuses them first).
    """
    candidates = (
        trace.select(id_hash().alias("_hash"))
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
            duplicate_message(first["purgatory"], first["op_id"], first["n"], first["files"], root)
        )


def id_hash() -> Column:
    """A 64-bit hash of (purgatory, op_id): equal ids, equal hashes (not the converse)."""
    return F.xxhash64("purgatory", "op_id")


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
    log = events(spark, log_path)
    anchors = json.dumps(event_log_anchors(spark, log_path))
    trace = log.select(
        "purgatory",
        F.col("id").cast("long").alias("op_id"),
        F.col("watched_at").alias("arrival", metadata={TRACE_ANCHORS_KEY: anchors}),
        "keys",
        F.coalesce(F.col("timeout"), F.col("deadline") - F.col("watched_at")).alias("timeout"),
        F.when(F.col("outcome") == "completed", F.col("ended_at")).alias("condition_at"),
        F.col("id").alias("_id"),
        F.col("file").alias("_file"),
    )
    with task_errors():
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
