"""The replay job: a trace under every configuration of a grid, on Spark.

Each (purgatory, configuration) is one group: the trace is crossed with the configurations,
hash-partitioned by group and sorted by arrival inside each partition, and the replay engine
(`purgatory.pipeline._replay.replay_batches`) streams each partition's batches inside
``mapInArrow``. Each group's summary comes from its own task, so the job needs no aggregation
over every operation; writing every operation's row is optional.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ._frames import read_errors, spark_schema
from ._job_trace import load_trace, read_parquet
from ._load import CostProfile
from ._replay import OUTPUT_SCHEMA, ReplayConfig, replay_batches
from ._spark import atomic_output
from ._summary import COUNTS, GAUGES, REPLAY_SUMMARY_COLUMNS, STATS, share

__all__ = ("replay",)


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

    Args:
        partitions: Spark partitions of the replay; default: Spark's shuffle partitions, which
            adaptive query execution coalesces by size.
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
    # A group never spans two partitions (hash partitioning keeps equal keys together). By
    # default the shuffle's partitions are Spark's (spark.sql.shuffle.partitions), which
    # adaptive execution coalesces by size while keeping every core busy: a small replay does
    # not pay for a task per empty partition.
    crossed = trace.crossJoin(F.broadcast(grid.select("config_id")))
    if partitions is None:
        crossed = crossed.repartition("purgatory", "config_id")
    else:
        crossed = crossed.repartition(partitions, "purgatory", "config_id")
    work = crossed.sortWithinPartitions("purgatory", "config_id", "arrival", "op_id").select(
        "purgatory", "config_id", "op_id", "arrival", "keys", "timeout", "condition_at"
    )

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return replay_batches(
            batches, by_id, event_log_dir=event_log, costs=costs, operations=operations
        )

    result = work.mapInArrow(run, spark_schema(OUTPUT_SCHEMA))
    if operations:  # read twice: the operations, then the summary rows
        result = result.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        summary = _summary(result.where(F.col("op_id").isNull()), grid)
        with (
            atomic_output(spark, out, overwrite=overwrite) as staging,
            read_errors("trace file", trace_path),
        ):
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
    return read_parquet(spark, f"{out}/summary").orderBy("purgatory", "config_id")


def _summary(groups: DataFrame, grid: DataFrame) -> DataFrame:
    """The summary rows of `REPLAY_SUMMARY_COLUMNS` from each group's own row (its task's)."""
    return (
        groups.select(
            "purgatory",
            "config_id",
            "operations",
            "completed",
            "expired",
            *(F.lit(0).cast("long").alias(name) for name in COUNTS[3:]),
            share("expired"),
            "missed",
            share("missed"),
            *STATS,
            "peak_delayed",
            *GAUGES,
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
