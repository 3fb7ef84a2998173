"""The replay job with each group split into time shards (`purgatory.pipeline._shards`).

With the direct read (the default where the tasks can read the trace's files themselves:
`purgatory.pipeline._direct`), the driver reads each purgatory's ids, arrivals and timeouts
(and its conditions, for a purge interval above 0) from the files once, with pyarrow, and
checks there what needs every row of a purgatory (unique ids) or rows no shard reads
(`driver_columns`); no Spark job reads the trace. It plans each group's shards from them: equal
operation counts, and under a purge interval above 0 the unsplit replay's purges foreseen and
carried into each shard's warm-up (`purgatory.pipeline._purge_carry`). Each shard's task needs
its warm-up, its own range and the first operation of the next shard, and reads them itself
(`shard_input`: the row groups outside the range skipped, checked as the groups job's tasks
check theirs, sorted in the task); the tasks, one per partition of a ``range``, look their
shards up in the plan by their partition's id (no shuffle), and the summary is computed from the
shards' rows the driver collects: two Spark jobs in all, the replay and the summary's write
(and a second replay for boundaries that fall back). What the tasks find
wrong comes back as the groups job's tasks say it, and is raised as `load_trace`'s error.

With Spark's read (``read="spark"``, or where the tasks cannot read the files), `load_trace`
checks the trace, and the trace is joined with the plan, shuffled and sorted; the driver plans
from its own read of the columns where the path is local, or else from one aggregation over the
trace (count, longest timeout, ``percentile_approx`` of the arrivals, which are arrivals of the
trace), and the purge counter is then not carried.

The shards are dealt over the partitions as the groups are (`_balance.assign`). Each task
replays its shards (`replay_shards`) inside ``mapInArrow``. The driver then checks every
boundary's fingerprints, replays the shards either side of a mismatched one again as one task
(`_shards.settle`), says so on stderr (or to `boundaries`), and merges each group's shards into
its summary row (`merge_shards`), which the summary is computed from as in the unsplit job.
`phases` receives where the driver's time went (`Phase`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final, Literal

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ._balance import assign, partition_keys
from ._checks import InputError, horizon_limits, local_path
from ._direct import (
    ShardRead,
    decode_problems,
    driver_columns,
    in_system_pool,
    shard_input,
    trace_problem,
)
from ._frames import first_line, read_errors, spark_schema, task_errors
from ._job_replay import (
    PROBLEM,
    TASK_SCHEMA,
    Phase,
    Phases,
    ReplayTask,
    _direct_files,
    _parallelism,
    _reported,
    read_summary,
    summary_rows,
    task_slots,
    warmed,
    with_problems,
    write_summary,
)
from ._job_trace import load_trace
from ._load import CostProfile
from ._purge_carry import carry, trace_columns
from ._replay import ReplayConfig
from ._shards import (
    SHARD_SCHEMA,
    Boundary,
    Key,
    ShardRange,
    gather_parts,
    merge_shards,
    plan_ranges,
    replay_shards,
    settle,
    shard_bounds,
    warmup_seconds,
)
from ._spark import atomic_output

__all__ = ("print_boundaries", "replay_split")

_TASK_SCHEMA = pa.schema([*SHARD_SCHEMA, *TASK_SCHEMA])
#: The job's rows: the shards' (and their operations'), and what a task found wrong (JSON).
_JOB_SCHEMA = pa.schema([*_TASK_SCHEMA, pa.field(PROBLEM, pa.string())])


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
    read: Literal["auto", "direct", "spark"] = "auto",
    phases: Callable[[Sequence[Phase]], object] | None = None,
) -> DataFrame:
    """`replay` with each group split into `shards` time shards (see the module docstring).

    Args:
        shards: Time shards per group (fewer if its arrivals repeat so that no more distinct
            boundaries exist).
        warmup: Seconds of replay time added to each shard's warm-up beyond the longest timeout
            (a loaded core's backlog: the warm-up should reach back to a moment it was idle).
        boundaries: Called with every boundary checked (`Boundary`); default: a line each on
            stderr; ``None``: nothing.
        read: ``"direct"``: the driver and the tasks read the trace's files themselves;
            ``"spark"``: Spark reads and checks the trace, and shuffles each shard's rows to
            its task; ``"auto"``: direct where the tasks can read the files.
        phases: Called with where the driver's time went (`Phase`, in order).

    Other arguments and the result as for `purgatory.pipeline.replay`.
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, not {shards}")
    if not warmup >= 0 or not math.isfinite(warmup):
        raise ValueError(f"warmup must be a finite number of seconds >= 0, not {warmup!r}")
    timed = Phases()
    by_id = dict(enumerate(configs))
    carried = costs is None and shards > 1 and any(c.purge_interval > 0 for c in configs)
    with timed("files"):
        files = _direct_files(spark, trace_path, read) if read != "spark" else None
    # (With the direct read the driver reads and plans before any Spark job: the executors'
    # first work meanwhile, waited for before the replay's job.)
    with warmed(spark, _parallelism(spark) if files is not None else 0, out) as ready:
        return _replay_planned(
            spark,
            trace_path,
            out,
            files=files,
            by_id=by_id,
            shards=shards,
            warmup=warmup,
            partitions=partitions,
            overwrite=overwrite,
            costs=costs,
            operations=operations,
            tasks=tasks,
            boundaries=boundaries,
            phases=phases,
            carried=carried,
            timed=timed,
            ready=ready,
        )


def _replay_planned(
    spark: SparkSession,
    trace_path: str,
    out: str,
    *,
    files: Sequence[str] | None,
    by_id: Mapping[int, ReplayConfig],
    shards: int,
    warmup: float,
    partitions: int | None,
    overwrite: bool,
    costs: CostProfile | None,
    operations: bool,
    tasks: Callable[[Sequence[ReplayTask]], object] | None,
    boundaries: Callable[[Sequence[Boundary]], object] | None,
    phases: Callable[[Sequence[Phase]], object] | None,
    carried: bool,
    timed: Phases,
    ready: Callable[[], None] | None,
) -> DataFrame:
    """`replay_split` from its plan on: `ready` (if any) is waited for before its first Spark
    job."""
    warming = ready
    configs = list(by_id.values())
    trace, (ranges, longest, counts) = _plan(
        spark, trace_path, files, configs, shards, carried=carried, timed=timed
    )
    _check_result_size(spark, sum(counts.values()) * len(configs))
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
            files=(files, trace_path) if files is not None else None,
        )
        if operations:  # read twice: the shards' rows, then the operations'
            result = result.persist(StorageLevel.MEMORY_AND_DISK)
        rounds.append((result, set(todo)))
        nonlocal warming
        if warming is not None:  # (the executors' first work: see `warmed`)
            with timed("warm"):
                warming()
            warming = None
        with timed("tasks"), task_errors(), _out_of_memory_said(todo, counts, n_tasks):
            # (Arrow: the shards' waits, 8 bytes per operation, in parts of 8 MiB.)
            found = result.where(F.col("op_id").isNull()).toArrow().to_pylist()
        problems = [p for r in found if r[PROBLEM] is not None for p in decode_problems(r[PROBLEM])]
        error = trace_problem(problems, trace_path)
        if error is not None:
            raise error
        return dict(gather_parts(found))

    try:
        final, rows, checked = settle(ranges, run)
        with timed("merge"):
            by_group: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
            for key in sorted(final):
                by_group.setdefault((key[0], key[1]), []).append(rows[key])
            merged = [
                merge_shards(group_rows, costs is not None) for group_rows in by_group.values()
            ]
        with (
            timed("write"),
            atomic_output(spark, out, overwrite=overwrite) as staging,
            read_errors("trace file", trace_path),
        ):
            if operations:
                _operations(spark, rounds, set(final)).write.parquet(f"{staging}/operations")
            write_summary(spark, summary_rows(merged, by_id), staging)
    finally:
        for result, _ in rounds:
            result.unpersist()
    if boundaries is not None:
        boundaries(checked)
    if tasks is not None:
        tasks(_tasks([rows[key] for key in sorted(final)]))
    if phases is not None:
        phases(timed.done)
    return read_summary(spark, out)


Plan = tuple[dict[Key, ShardRange], dict[str, float], dict[str, int]]

#: What the driver receives per operation replayed, at least: its wait (a float64), since the
#: merged summary's percentiles are exact (an expired operation's lateness adds 8 more).
RESULT_BYTES_PER_OPERATION: Final = 8
_UNITS: Final = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


#: How Spark tells of an executor that ran out of heap: its error, or its exit code (52).
_OUT_OF_MEMORY: Final = ("java.lang.OutOfMemoryError", "exited with code 52")


@contextmanager
def _out_of_memory_said(
    todo: Mapping[Key, ShardRange], counts: Mapping[str, int], n_tasks: int
) -> Iterator[None]:
    """Say why, where a split's job failed because an executor ran out of memory: each task
    returns its shards' waits, which Spark's executor holds whole (the job's error names only
    a lost executor's exit code)."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        if not any(sign in text for sign in _OUT_OF_MEMORY):
            raise
        replayed = sum(counts[name] for name, _ in {(name, c) for name, c, _ in todo})
        per_task = replayed * RESULT_BYTES_PER_OPERATION / max(1, min(n_tasks, len(todo)))
        said = next((line for line in text.splitlines() if "Job aborted" in line), "")
        raise RuntimeError(
            f"the split replay's job failed: an executor ran out of memory ("
            f"{(said.strip().lstrip(': ') or first_line(exc))[:300]}). Each task of a split replay "
            "returns its shards' waits for the exact percentiles, 8 bytes per operation "
            f"(about {per_task / (1 << 20):,.0f} MiB a task here), which the executor holds "
            "whole with copies of it: raise spark.executor.memory (tasks of 20 M operations "
            "ran 768m executors out of memory in 2 of 6 tries)"
        ) from exc


def _check_result_size(spark: SparkSession, replayed: int) -> None:
    """Refuse, before any task runs, a split whose waits alone are more than
    ``spark.driver.maxResultSize``: Spark would abort it only once its tasks had replayed
    everything (minutes), and the limit is the user's to raise."""
    setting = str(spark.conf.get("spark.driver.maxResultSize", "1g")).strip().lower()
    number = setting.rstrip("kmgtpb")
    unit = setting[len(number) :].removesuffix("b")
    if not number.isdigit() or unit not in _UNITS:
        return  # (a value Spark itself will judge)
    limit = int(number) * _UNITS[unit]
    need = replayed * RESULT_BYTES_PER_OPERATION
    if limit and need > limit:
        raise InputError(
            f"a split replay sends the driver every operation's wait ({replayed:,} operations "
            f"replayed: {need / (1 << 20):,.0f} MiB at least) for the summary's exact "
            f"percentiles, over spark.driver.maxResultSize ({setting}): raise it (e.g. "
            f"--conf spark.driver.maxResultSize={-(-2 * need // (1 << 30))}g, and the driver's "
            "memory with it) or replay unsplit"
        )


def _plan(
    spark: SparkSession,
    trace_path: str,
    files: Sequence[str] | None,
    configs: Sequence[ReplayConfig],
    shards: int,
    *,
    carried: bool,
    timed: Phases,
) -> tuple[DataFrame | None, Plan]:
    """The trace as Spark reads it (``None`` with the direct read: `files`), and the shards'
    ranges, each purgatory's longest timeout and operation count."""
    by_id = dict(enumerate(configs))
    if files is not None:  # the driver's read: checked, exact bounds, no Spark job
        with timed("columns"):
            found = driver_columns(files, trace_path, horizon_limits(configs), conditions=carried)
        with timed("plan"):
            ranges = plan_ranges(
                {(name, c): found.arrivals[name] for name in found.arrivals for c in by_id},
                shards,
            )
            if carried:
                ranges = carry(ranges, found.for_carry(), found.longest, by_id)
        return None, (ranges, found.longest, found.counts())
    # (Read again by each job rather than cached: on one group of a million operations, the
    # cached trace cost the JVM more garbage collection than the second read, 21.7 against
    # 19.1 CPU seconds in one run each on a loaded machine: within its noise, and less memory.)
    with timed("load_trace"):
        trace = load_trace(spark, trace_path, configs)
    with timed("plan"):
        local = _local_columns(trace_path) if shards > 1 else None
        if local is None:
            if carried:
                print(
                    f"replay: the purge counter is not carried into the shards (the driver "
                    f"cannot read {trace_path}); their boundaries fall back to sequential",
                    file=sys.stderr,
                )
            return trace, _planned(trace, by_id, shards)
        columns, longest = local  # exact bounds from the driver's read: no Spark job
        counts = {name: len(values[0]) for name, values in columns.items()}
        ranges = plan_ranges(
            {(name, c): columns[name][0] for name in columns for c in by_id}, shards
        )
        if carried:
            ranges = carry(ranges, columns, longest, by_id)
    return trace, (ranges, longest, counts)


def _local_columns(
    trace_path: str,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], dict[str, float]] | None:
    """Each purgatory's arrivals, timeouts and conditions, and its longest timeout, read by the
    driver itself from the trace's files (24 bytes per operation: the shards' bounds, exact, and
    Kafka's purge counter foreseen, with no Spark job) with Spark's read; ``None`` if its files
    are not local (`local_path`) or pyarrow cannot read them."""
    import pyarrow.parquet as pq

    local = local_path(trace_path)
    if local is None:
        return None
    try:
        table = pq.read_table(
            local,
            columns=["purgatory", "arrival", "timeout", "condition_at"],
            read_dictionary=["purgatory"],
        )
    except (OSError, ValueError, pa.ArrowException):
        return None
    return trace_columns(table)


def _planned(trace: DataFrame, by_id: Mapping[int, ReplayConfig], shards: int) -> Plan:
    """The shards of each group from one aggregation over the trace (count, longest timeout,
    ``percentile_approx`` of the arrivals, which are arrivals of the trace): where the driver
    cannot read the trace's files. Returns the ranges, longest timeouts and counts."""
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
    return ranges, longest, counts


def _run(
    spark: SparkSession,
    trace: DataFrame | None,
    *,
    by_id: Mapping[int, ReplayConfig],
    todo: Mapping[Key, ShardRange],
    longest: Mapping[str, float],
    counts: Mapping[str, int],
    n_tasks: int,
    warmup: float,
    costs: CostProfile | None,
    operations: bool,
    files: tuple[Sequence[str], str] | None = None,
) -> DataFrame:
    """One Spark job replaying the shards of `todo`: with `files` (the trace's files as Spark
    lists them, and its path as given) each task reading its shards' rows itself
    (`shard_input`), else the trace joined with the shards' plan, shuffled to their tasks and
    sorted there."""
    per_group: dict[tuple[str, int], int] = {}
    for name, config_id, _ in todo:
        per_group[(name, config_id)] = per_group.get((name, config_id), 0) + 1
    # The work of a shard: its group's operations over its shards (the warm-ups aside).
    weights = {key: counts[key[0]] // per_group[(key[0], key[1])] + 1 for key in todo}
    n = max(1, min(n_tasks, len(todo)))
    plan = assign(weights, n)
    reporting = min(by_id)  # (one configuration's shards report the bad rows: see shard_input)
    ranges = dict(todo)
    configs = dict(by_id)
    schema = spark_schema(_JOB_SCHEMA)

    def replay(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _reported(
            batches,
            lambda timed: replay_shards(timed, configs, ranges, costs=costs, operations=operations),
            _TASK_SCHEMA,
        )

    if files is not None:  # each task reads its shards' rows itself: no scan, shuffle or sort
        paths, root = files
        limits = horizon_limits(list(by_id.values()))
        slots: list[list[ShardRead]] = [[] for _ in range(n)]
        for (name, config_id, _), shard in sorted(todo.items()):
            slots[plan[(name, config_id, shard.index)]].append(
                ShardRead(
                    purgatory=name,
                    config_id=config_id,
                    shard=shard.index,
                    lo=shard.warmup_start(warmup_seconds(longest[name], by_id[config_id], warmup)),
                    hi=shard.end,
                    start=shard.start,
                    end=shard.end,  # (its input ends at its end: the next shard's first arrival)
                    report=config_id == reporting,
                )
            )

        def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            ids = [slot for batch in batches for slot in batch.column("id").to_pylist()]
            mine = [shard for slot in ids for shard in slots[slot]]
            problems: list[dict[str, Any]] = []
            source = shard_input(paths, root, mine, limits, problems)
            return in_system_pool(with_problems(replay(source), problems, _JOB_SCHEMA))

        return task_slots(spark, n).mapInArrow(read, schema)
    assert trace is not None
    part_keys = partition_keys(n)
    shard_plan = spark.createDataFrame(
        [
            (
                name,
                config_id,
                shard.index,
                shard.warmup_start(warmup_seconds(longest[name], by_id[config_id], warmup)),
                shard.end,
                shard.start,
                config_id == reporting,
                part_keys[plan[(name, config_id, shard.index)]],
            )
            for (name, config_id, _), shard in sorted(todo.items())
        ],
        "purgatory string, config_id int, shard int, lo double, hi double, start double, "
        "report boolean, _partition_key int",
    )
    plan_b = F.broadcast(shard_plan.withColumnRenamed("purgatory", "_p"))
    joined = trace.join(
        plan_b,
        (trace["purgatory"] == F.col("_p"))
        & (trace["arrival"] >= F.col("lo"))
        & (trace["arrival"] <= F.col("hi")),
    )
    columns = ["purgatory", "config_id", "shard", "op_id", "arrival", "keys", "timeout"]
    columns.append("condition_at")
    work = (
        joined.select(*columns, "_partition_key")  # (the plan's columns not shuffled)
        .repartition(n, "_partition_key")
        .sortWithinPartitions("purgatory", "config_id", "shard", "arrival", "op_id")
        .select(*columns)
    )

    def through_spark(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return with_problems(replay(batches), [], _JOB_SCHEMA)

    return work.mapInArrow(through_spark, schema)


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
