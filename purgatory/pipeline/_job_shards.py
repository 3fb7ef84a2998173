"""The replay job with each group split into time shards (`purgatory.pipeline._shards`).

The driver plans each group's shards from its arrival quantiles (one aggregation over the
trace: count, longest timeout, ``percentile_approx`` of the arrivals, which are arrivals of the
trace), and joins the trace with that small plan so that each shard's task gets its warm-up, its
own range and the first operation of the next shard; the shards are dealt over the partitions
as the groups are (`_balance.assign`). Each task replays its shards (`replay_shards`) inside
``mapInArrow``. The driver then checks every boundary's fingerprints, replays the shards either
side of a mismatched one again as one task (`_shards.settle`), says so on stderr (or to
`boundaries`), and merges each group's shards into its summary row (`merge_shards`), which
the summary is computed from as in the unsplit job.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ._balance import assign, partition_keys
from ._checks import local_path
from ._frames import read_errors, spark_schema
from ._job_replay import TASK_SCHEMA, ReplayTask, _parallelism, _reported, _summary
from ._job_trace import load_trace, read_parquet
from ._load import CostProfile
from ._purge_carry import carry, trace_columns
from ._replay import OUTPUT_SCHEMA, ReplayConfig
from ._shards import (
    SHARD_SCHEMA,
    Boundary,
    Key,
    ShardRange,
    merge_shards,
    replay_shards,
    settle,
    shard_bounds,
    warmup_seconds,
)
from ._spark import atomic_output

__all__ = ("print_boundaries", "replay_split")

_JOB_SCHEMA = pa.schema([*SHARD_SCHEMA, *TASK_SCHEMA])


def print_boundaries(boundaries: Sequence[Boundary]) -> None:
    """Each boundary's line on stderr: matched, or replayed sequentially and why."""
    for boundary in boundaries:
        print(f"replay: {boundary.describe()}", file=sys.stderr)


def replay_split(
    spark: SparkSession,
    trace_path: str,
    out: str,
    configs: Sequence[ReplayConfig],
    shards: int,
    *,
    warmup: float = 0.0,
    partitions: int | None = None,
    overwrite: bool = False,
    costs: CostProfile | None = None,
    operations: bool = True,
    tasks: Callable[[Sequence[ReplayTask]], object] | None = None,
    boundaries: Callable[[Sequence[Boundary]], object] | None = print_boundaries,
) -> DataFrame:
    """`replay` with each group split into `shards` time shards (see the module docstring).

    Args:
        shards: Time shards per group (fewer if its arrivals repeat so that no more distinct
            boundaries exist).
        warmup: Seconds of replay time added to each shard's warm-up beyond the longest timeout
            (a loaded core's backlog: the warm-up should reach back to a moment it was idle).
        boundaries: Called with every boundary checked (`Boundary`); default: a line each on
            stderr; ``None``: nothing.

    Other arguments and the result as for `purgatory.pipeline.replay`.
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, not {shards}")
    if not warmup >= 0 or not math.isfinite(warmup):
        raise ValueError(f"warmup must be a finite number of seconds >= 0, not {warmup!r}")
    # (Read again by each job rather than cached: on one group of a million operations, the
    # cached trace cost the JVM more garbage collection than the second read, 21.7 against
    # 19.1 CPU seconds in one run each on a loaded machine: within its noise, and less memory.)
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
    fractions = [k / shards for k in range(1, shards)] or [0.5]
    stats = (
        trace.groupBy("purgatory")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.max("timeout").alias("longest"),
            F.min("arrival").alias("first"),
            F.percentile_approx("arrival", fractions, 100_000).alias("quantiles"),
        )
        .collect()
    )
    ranges: dict[Key, ShardRange] = {}
    longest: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in stats:
        name = row["purgatory"]
        longest[name] = float(row["longest"])
        counts[name] = int(row["n"])
        points = [float(row["first"]), *(float(q) for q in row["quantiles"])] if shards > 1 else []
        # (`shard_bounds` of the quantiles: distinct arrivals past the first.)
        bounds = shard_bounds(np.sort(points), len(points)) if points else []
        starts = [-math.inf, *bounds]
        ends = [*starts[1:], math.inf]
        for config_id in by_id:
            for k, (start, end) in enumerate(zip(starts, ends, strict=True)):
                ranges[(name, config_id, k)] = ShardRange(k, start, end)
    if costs is None and shards > 1 and any(c.purge_interval > 0 for c in configs):
        ranges = _carried(trace_path, ranges, by_id, longest)
    n_tasks = partitions or max(1, min(_parallelism(spark), len(ranges)))
    rounds: list[tuple[DataFrame, set[Key]]] = []

    def run(todo: Mapping[Key, ShardRange]) -> dict[Key, Mapping[str, Any]]:
        result = _run(
            spark,
            trace,
            by_id=by_id,
            todo=todo,
            longest=longest,
            counts=counts,
            n_tasks=n_tasks,
            warmup=warmup,
            costs=costs,
            operations=operations,
        )
        rows: dict[Key, Mapping[str, Any]] = {
            (r["purgatory"], r["config_id"], r["shard"]): r.asDict()
            for r in result.where(F.col("op_id").isNull()).collect()
        }
        rounds.append((result, set(todo)))
        return rows

    try:
        final, rows, checked = settle(ranges, run)
        by_group: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
        for key in sorted(final):
            by_group.setdefault((key[0], key[1]), []).append(rows[key])
        merged = [merge_shards(group_rows, costs is not None) for group_rows in by_group.values()]
        groups = spark.createDataFrame(
            [tuple(m[name] for name in OUTPUT_SCHEMA.names) for m in merged],
            spark_schema(OUTPUT_SCHEMA),
        )
        summary = _summary(groups, grid)
        with (
            atomic_output(spark, out, overwrite=overwrite) as staging,
            read_errors("trace file", trace_path),
        ):
            if operations:
                _operations(spark, rounds, set(final)).write.parquet(f"{staging}/operations")
            summary.coalesce(1).write.parquet(f"{staging}/summary")
    finally:
        for result, _ in rounds:
            result.unpersist()
    if boundaries is not None:
        boundaries(checked)
    if tasks is not None:
        tasks(_tasks([rows[key] for key in sorted(final)]))
    return read_parquet(spark, f"{out}/summary").orderBy("purgatory", "config_id")


def _carried(
    trace_path: str,
    ranges: Mapping[Key, ShardRange],
    by_id: Mapping[int, ReplayConfig],
    longest: Mapping[str, float],
) -> dict[Key, ShardRange]:
    """`ranges` with Kafka's purge counter carried into each shard (`_purge_carry.carry`), from
    the trace's arrivals, timeouts and conditions read in the driver (24 bytes per operation,
    no Spark job); unchanged, and said, if the driver cannot read the trace's files itself."""
    import pyarrow.parquet as pq

    local = local_path(trace_path)
    try:
        if local is None:
            raise OSError("not a local path")
        table = pq.read_table(
            local,
            columns=["purgatory", "arrival", "timeout", "condition_at"],
            read_dictionary=["purgatory"],
        )
    except (OSError, ValueError, pa.ArrowException) as exc:
        print(
            f"replay: the purge counter is not carried into the shards (the driver cannot read "
            f"{trace_path}: {exc}); their boundaries fall back to sequential",
            file=sys.stderr,
        )
        return dict(ranges)
    columns, _ = trace_columns(table)
    return carry(ranges, columns, longest, by_id)


def _run(
    spark: SparkSession,
    trace: DataFrame,
    *,
    by_id: Mapping[int, ReplayConfig],
    todo: Mapping[Key, ShardRange],
    longest: Mapping[str, float],
    counts: Mapping[str, int],
    n_tasks: int,
    warmup: float,
    costs: CostProfile | None,
    operations: bool,
) -> DataFrame:
    """One Spark job replaying the shards of `todo` (persisted: read for its shards' rows, then
    for its operations)."""
    per_group: dict[tuple[str, int], int] = {}
    for name, config_id, _ in todo:
        per_group[(name, config_id)] = per_group.get((name, config_id), 0) + 1
    # The work of a shard: its group's operations over its shards (the warm-ups aside).
    weights = {key: counts[key[0]] // per_group[(key[0], key[1])] + 1 for key in todo}
    n = max(1, min(n_tasks, len(todo)))
    plan = assign(weights, n)
    part_keys = partition_keys(n)
    shard_plan = spark.createDataFrame(
        [
            (
                name,
                config_id,
                shard.index,
                shard.warmup_start(warmup_seconds(longest[name], by_id[config_id], warmup)),
                shard.end,
                part_keys[plan[(name, config_id, shard.index)]],
            )
            for (name, config_id, _), shard in sorted(todo.items())
        ],
        "purgatory string, config_id int, shard int, lo double, hi double, _partition_key int",
    )
    plan_b = F.broadcast(shard_plan.withColumnRenamed("purgatory", "_p"))
    joined = trace.join(
        plan_b,
        (trace["purgatory"] == F.col("_p"))
        & (trace["arrival"] >= F.col("lo"))
        & (trace["arrival"] <= F.col("hi")),
    )
    work = (
        joined.repartition(n, "_partition_key")
        .sortWithinPartitions("purgatory", "config_id", "shard", "arrival", "op_id")
        .select(
            "purgatory", "config_id", "shard", "op_id", "arrival", "keys", "timeout", "condition_at"
        )
    )
    ranges = dict(todo)
    configs = dict(by_id)

    def replay(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _reported(
            batches,
            lambda timed: replay_shards(timed, configs, ranges, costs=costs, operations=operations),
            _JOB_SCHEMA,
        )

    return work.mapInArrow(replay, spark_schema(_JOB_SCHEMA)).persist(StorageLevel.MEMORY_AND_DISK)


def _operations(
    spark: SparkSession, rounds: Sequence[tuple[DataFrame, set[Key]]], final: set[Key]
) -> DataFrame:
    """The operations' rows of the shards finally kept, from the job that replayed each."""
    columns = [
        "purgatory",
        "config_id",
        "op_id",
        "outcome",
        "watched_at",
        "deadline",
        "ended_at",
    ]
    parts = []
    # (A shard joined with its successors keeps its key: take each from the last job.)
    latest = {key: i for i, (_, todo) in enumerate(rounds) for key in todo}
    for i, (result, todo) in enumerate(rounds):
        kept = sorted(key for key in todo & final if latest[key] == i)
        if not kept:
            continue
        keys = spark.createDataFrame(
            kept, "purgatory string, config_id int, shard int"
        ).withColumnRenamed("purgatory", "_p")
        ops = result.where(F.col("op_id").isNotNull())
        parts.append(
            ops.join(
                F.broadcast(keys),
                (ops["purgatory"] == F.col("_p"))
                & (ops["config_id"] == keys["config_id"])
                & (ops["shard"] == keys["shard"]),
                "left_semi",
            ).select(*columns)
        )
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    return union.select(*columns, (F.col("ended_at") - F.col("watched_at")).alias("wait"))


def _tasks(rows: Sequence[Mapping[str, Any]]) -> list[ReplayTask]:
    """Each task's `ReplayTask`, from its shards' rows (a shard named ``p@c/k``)."""
    by_partition: dict[int, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_partition.setdefault(row["task_partition"], []).append(row)
    return [
        ReplayTask(
            partition=partition,
            host=mine[0]["task_host"],
            pid=mine[0]["task_pid"],
            groups=tuple(f"{r['purgatory']}@{r['config_id']}/{r['shard']}" for r in mine),
            operations=sum(r["operations"] + r["shard_warmup_ops"] for r in mine),
            seconds=sum(r["task_seconds"] for r in mine),
            cpu_seconds=sum(r["task_cpu_seconds"] for r in mine),
            input_seconds=sum(r["task_input_seconds"] for r in mine),
            input_cpu_seconds=sum(r["task_input_cpu_seconds"] for r in mine),
        )
        for partition, mine in sorted(by_partition.items())
    ]
