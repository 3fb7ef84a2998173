"""The replay job: a trace under every configuration of a grid, on Spark.

Each (purgatory, configuration) is one group. The driver counts each purgatory's operations and
assigns the groups to the job's partitions, balanced by operation count (`_balance.assign`).
Then, by default (the direct read, `purgatory.pipeline._direct`), each task, one per partition
of a ``range`` (`task_slots`), looks its groups up in the plan by its partition's id, reads their
rows from the trace's Parquet files with pyarrow, checks and sorts them, and streams them
through the replay engine (`purgatory.pipeline._replay.replay_batches`) inside ``mapInArrow``:
the JVM carries only the engine's rows. With Spark's read (``read="spark"``, the job before),
the trace, checked by `load_trace` and joined with the plan (which also crosses it with the
configurations), is repartitioned so that each partition holds exactly its groups, sorted by
arrival inside each partition, and the engine streams each partition's batches. Each group's
summary comes from its own task, so the job needs no aggregation over every operation; writing
every operation's row is optional.

On a cluster each Spark job costs seconds of scheduling, so the job runs as few as it can: with
the direct read of a trace the driver can list (`listed_files`), two: the replay, whose groups'
rows the driver collects (their problems, the summary: `summary_rows`, and the tasks' report
come from them), and the summary's write. The summary returned is read back only when used.

Each task also says what it did: its partition, where it ran (host, Python worker), its groups,
and the wall and CPU seconds of its Python worker, of which getting its input (reading, checking
and sorting its rows; or the JVM's Arrow batches, and waiting for them). The driver gathers
these from the groups' rows after the job (`ReplayTask`) and prints one line per task on stderr,
or hands them to `tasks`.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import pyarrow as pa
from pyspark import StorageLevel, TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ._balance import assign, partition_keys
from ._checks import horizon_limits
from ._direct import (
    WORK_COLUMNS,
    decode_problems,
    direct_read_problem,
    encode_problems,
    in_system_pool,
    listed_files,
    purgatory_counts,
    task_input,
    trace_problem,
)
from ._frames import read_errors, spark_schema, task_errors
from ._job_trace import _read_trace, load_trace, read_parquet
from ._load import CostProfile
from ._replay import OUTPUT_SCHEMA, ReplayConfig, replay_batches
from ._spark import _files_of, atomic_output, is_connect, is_local_master
from ._summary import COUNTS, GAUGES, REPLAY_SUMMARY_COLUMNS, STATS

if TYPE_CHECKING:
    from ._shards import Boundary

__all__ = ("Phase", "ReplayTask", "print_tasks", "replay")

#: What each task adds to its groups' rows (null on the operations' rows): where the group ran,
#: and the seconds its Python worker spent on it (wall, CPU; of which reading its input).
TASK_SCHEMA: Final = pa.schema(
    [
        pa.field("task_partition", pa.int32()),
        pa.field("task_host", pa.string()),
        pa.field("task_pid", pa.int64()),
        pa.field("task_seconds", pa.float64()),
        pa.field("task_cpu_seconds", pa.float64()),
        pa.field("task_input_seconds", pa.float64()),
        pa.field("task_input_cpu_seconds", pa.float64()),
    ]
)
_JOB_SCHEMA: Final = pa.schema([*OUTPUT_SCHEMA, *TASK_SCHEMA])
#: The direct read's rows add what a task found wrong in the trace (JSON; null on every other
#: row): one row at the task's end, if it found anything.
PROBLEM: Final = "task_problem"
_DIRECT_SCHEMA: Final = pa.schema([*_JOB_SCHEMA, pa.field(PROBLEM, pa.string())])
#: How `replay` reads the trace (`replay`'s ``read``).
READ_PATHS: Final = ("auto", "direct", "spark")


@dataclass(frozen=True, slots=True)
class ReplayTask:
    """What one task of a replay did, from its groups' rows.

    Attributes:
        partition: The Spark partition (one task each).
        host: The host of its Python worker.
        pid: Its Python worker's process id (one per executor core in use).
        groups: Its groups, ``"<purgatory>@<config_id>"``, in the order it replayed them.
        operations: The operations it replayed (over its groups).
        seconds: Wall seconds in its Python worker, from its first input batch asked for to its
            last group's summary.
        cpu_seconds: CPU seconds of its Python worker in that time.
        input_seconds: Of `seconds`, waiting for and decoding its input batches (the JVM reads,
            shuffles and sorts; Arrow carries the batches over).
        input_cpu_seconds: Of `cpu_seconds`, decoding its input batches in Python.
    """

    partition: int
    host: str
    pid: int
    groups: tuple[str, ...]
    operations: int
    seconds: float
    cpu_seconds: float
    input_seconds: float
    input_cpu_seconds: float

    def describe(self, shown: int = 8) -> str:
        """One line: partition, worker, groups (the first `shown`), operations and seconds."""
        names = ", ".join(self.groups[:shown])
        if len(self.groups) > shown:
            names += f", ... ({len(self.groups) - shown} more)"
        return (
            f"task of partition {self.partition} (Python worker {self.pid} on {self.host}): "
            f"{len(self.groups)} group{'s' if len(self.groups) != 1 else ''} ({names}), "
            f"{self.operations:,} operations, {self.seconds:.1f} s wall, "
            f"{self.cpu_seconds:.1f} s CPU (input: {self.input_seconds:.1f} s wall, "
            f"{self.input_cpu_seconds:.1f} s CPU)"
        )


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of a job as its driver saw it (the split replay's `replay(..., phases=...)`).

    Attributes:
        name: What the driver did: ``files`` (Spark lists the trace's files and checks their
            schema), ``columns`` (the driver reads and checks the columns it plans from),
            ``load_trace`` (Spark's read checks the trace), ``plan`` (the shards' bounds and the
            purge counter carried), ``tasks`` (the Spark job replaying the shards, until their
            rows are back: each job's, added up), ``merge`` (each group's summary from its
            shards), ``write`` (the summary, and the operations, written).
        seconds: Its wall seconds.
        cpu_seconds: The driver's Python's CPU seconds in it (not the JVM's, nor the tasks').
    """

    name: str
    seconds: float
    cpu_seconds: float

    def describe(self) -> str:
        return f"{self.name} {self.seconds:.1f} s ({self.cpu_seconds:.1f} s driver CPU)"


class Phases:
    """Times a driver's phases: ``with phases("name"): ...``; a name timed again adds up."""

    def __init__(self) -> None:
        self.done: list[Phase] = []

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
            for i, phase in enumerate(self.done):
                if phase.name == name:
                    seconds += phase.seconds
                    cpu_seconds += phase.cpu_seconds
                    self.done[i] = Phase(name, seconds, cpu_seconds)
                    break
            else:
                self.done.append(Phase(name, seconds, cpu_seconds))


def print_tasks(tasks: Sequence[ReplayTask]) -> None:
    """Each task's line on stderr (`replay`'s default report)."""
    for task in tasks:
        print(f"replay: {task.describe()}", file=sys.stderr)


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
    tasks: Callable[[Sequence[ReplayTask]], object] | None = print_tasks,
    balance: bool = True,
    shards: int = 1,
    warmup: float = 0.0,
    boundaries: Callable[[Sequence[Boundary]], object] | Literal["print"] | None = "print",
    read: Literal["auto", "direct", "spark"] = "auto",
    phases: Callable[[Sequence[Phase]], object] | None = None,
) -> DataFrame:
    """Replay a trace under every configuration; write ``summary/`` (and ``operations/``) to `out`.

    Args:
        partitions: Spark partitions (tasks) of the replay; default: the session's default
            parallelism (its executors' cores), at most one per group.
        event_log: A directory every executor can write to (a local path in local mode), where
            each group writes its event log.
        costs: A cost profile (the load model: each group served by one core); ``None``: the
            purgatory's work costs nothing, and ``utilisation`` and the pass lateness are 0.
        operations: Also write every operation's row (``operations/``); the summary does not
            need them (each group's is computed inside its task), and the job runs faster
            without.
        tasks: Called after the job with what each task did (`ReplayTask`, by partition);
            default: `print_tasks` (a line per task on stderr); ``None``: nothing.
        balance: Assign the groups to the partitions by operation count (the default).
            ``False``: Spark's hash partitioning of the groups into Spark's shuffle partitions
            (or `partitions`), which adaptive execution may coalesce; kept to measure against.

        shards: Split each group into this many time shards, replayed by separate tasks with
            the same result (`purgatory.pipeline._shards`: each shard's warm-up is checked at
            its boundary, and a boundary whose check fails is replayed sequentially and said).
            1 (the default): each group is one task.
        warmup: With `shards`: seconds of replay time added to each shard's warm-up beyond the
            longest timeout (a loaded core's backlog).
        boundaries: With `shards`: called with every boundary checked; default: a line each
            on stderr; ``None``: nothing.
        read: How the tasks get their rows. ``"direct"``: each task reads its groups' rows
            from the trace's Parquet files itself (pyarrow; the executors must see the files
            at the same path), checks and sorts them; the JVM carries only the plan and the
            engine's rows (`purgatory.pipeline._direct`). ``"spark"``: Spark reads and checks
            the trace (`load_trace`), shuffles each group's rows to its task and sorts them
            there. ``"auto"`` (the default): direct, unless the tasks cannot read the files
            themselves (`direct_read_problem`; a line on stderr says so), or `balance` is off
            (Spark's read). Both give the same rows, summaries and errors. With `shards`, the
            direct read's driver also reads the columns it plans the shards from, and checks
            the ids there (`purgatory.pipeline._job_shards`).
        phases: With `shards`: called with where the driver's time went (`Phase`: reading,
            planning, the replay's Spark jobs, merging, writing); ``None`` (the default):
            nothing.

    Returns:
        The summary, read back from `out` when it is used (by purgatory, then configuration).
    """
    if not configs:
        raise ValueError("replay needs at least one configuration")
    if partitions is not None and partitions < 1:
        raise ValueError(f"partitions must be >= 1, not {partitions}")
    if read not in READ_PATHS:
        raise ValueError(f"read must be one of {', '.join(READ_PATHS)}, not {read!r}")
    if not balance and read == "direct":
        raise ValueError("balance=False is the Spark read's hash partitioning: read='spark'")
    if shards != 1:
        if event_log is not None:
            raise ValueError("a replay split into time shards writes no event log")
        from ._job_shards import print_boundaries, replay_split

        return replay_split(
            spark,
            trace_path,
            out,
            configs,
            shards,
            warmup=warmup,
            partitions=partitions,
            overwrite=overwrite,
            costs=costs,
            operations=operations,
            tasks=tasks,
            boundaries=print_boundaries if boundaries == "print" else boundaries,
            read=read,
            phases=phases,
        )
    by_id = dict(enumerate(configs))
    files = _direct_files(spark, trace_path, read) if balance and read != "spark" else None

    def engine(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return replay_batches(
            batches, by_id, event_log_dir=event_log, costs=costs, operations=operations
        )

    if files is not None:
        result = _direct(spark, trace_path, files, configs, partitions=partitions, engine=engine)
    else:
        result = _through_spark(
            spark,
            trace_path,
            configs,
            grid=config_grid(spark, configs),
            partitions=partitions,
            balance=balance,
            engine=engine,
        )
    if operations:  # read twice: the groups' rows, then the operations'
        result = result.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # The groups' rows, a few per task: the problems, the summary and the tasks' report,
        # all from this one job (the summary computed here, not by Spark jobs of its own).
        with task_errors(), read_errors("trace file", trace_path):
            found = result.where(F.col("op_id").isNull()).toArrow().to_pylist()
        if files is not None:
            _raise_problems(found, trace_path)
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
            write_summary(spark, summary_rows(found, by_id), staging)
    finally:
        if operations:
            result.unpersist()
    if tasks is not None:
        tasks(_tasks(found))
    return read_summary(spark, out)


def write_summary(spark: SparkSession, rows: Sequence[tuple[Any, ...]], staging: str) -> None:
    """Write the summary `rows` (`summary_rows`) to ``staging/summary`` as one file, in
    `SUMMARY_SCHEMA` (the schema Spark's own summary query gives, without asking Spark's
    analyser for it)."""
    frame = spark.createDataFrame(list(rows), SUMMARY_SCHEMA)
    frame.coalesce(1).write.parquet(f"{staging}/summary")


def read_summary(spark: SparkSession, out: str) -> DataFrame:
    """The summary written to `out`, read back lazily: its schema given (nullable, as Spark
    reads Parquet), so no Spark job infers it; read only when the caller uses it.

    Ordered by purgatory and configuration in one partition (a row per group: small), so
    that its first use is one Spark job, not a sort's sampling and shuffle (three).
    """
    nullable = T.StructType([T.StructField(f.name, f.dataType, True) for f in SUMMARY_SCHEMA])
    frame = read_parquet(spark, f"{out}/summary", nullable)
    return frame.coalesce(1).sortWithinPartitions("purgatory", "config_id")


#: The configurations' table (`config_grid`): what a Spark summary joins each group's row with.
GRID_SCHEMA: Final = T.StructType(
    [
        T.StructField("config_id", T.IntegerType()),
        T.StructField("tick", T.DoubleType()),
        T.StructField("wheel_size", T.IntegerType()),
        T.StructField("purge_interval", T.IntegerType()),
        T.StructField("timeout_scale", T.DoubleType()),
        T.StructField("rate_scale", T.DoubleType()),
        T.StructField("trigger", T.StringType()),
    ]
)


def _summary_schema() -> T.StructType:
    """The schema Spark's analyser gives a summary query of the groups' rows (the tests compare
    them): the group's
    key never null, the outcomes no replay gives a literal 0, every other column nullable."""
    types = {f.name: f.dataType for f in [*spark_schema(OUTPUT_SCHEMA).fields, *GRID_SCHEMA]}
    renamed = {
        "busy_seconds": "busy",
        "pass_lateness_p50": "pass_late_p50",
        "pass_lateness_p99": "pass_late_p99",
        "pass_lateness_max": "pass_late_max",
    }
    fields = []
    for name in REPLAY_SUMMARY_COLUMNS:
        if name in COUNTS[3:]:
            fields.append(T.StructField(name, T.LongType(), False))
        elif name in ("expired_share", "missed_share", "utilisation"):
            fields.append(T.StructField(name, T.DoubleType(), True))
        else:
            key = name in ("purgatory", "config_id")
            fields.append(T.StructField(name, types[renamed.get(name, name)], not key))
    return T.StructType(fields)


#: The summary's schema (`REPLAY_SUMMARY_COLUMNS`), as a Spark summary query computes it.
SUMMARY_SCHEMA: Final = _summary_schema()


def config_grid(spark: SparkSession, configs: Sequence[ReplayConfig]) -> DataFrame:
    """The configurations as a table, one row each by ``config_id`` (`GRID_SCHEMA`)."""
    return spark.createDataFrame(
        [
            (i, c.tick, c.wheel_size, c.purge_interval, c.timeout_scale, c.rate_scale, c.trigger)
            for i, c in enumerate(configs)
        ],
        GRID_SCHEMA,
    )


def _through_spark(
    spark: SparkSession,
    trace_path: str,
    configs: Sequence[ReplayConfig],
    *,
    grid: DataFrame,
    partitions: int | None,
    balance: bool,
    engine: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
) -> DataFrame:
    """The job's rows, the trace read through Spark: `load_trace`'s checks, then each group's
    rows shuffled to its partition and sorted there, handed to the engine as Arrow batches."""
    trace = load_trace(spark, trace_path, configs)
    if balance:
        crossed = _balanced(spark, trace, dict(enumerate(configs)), partitions)
    else:
        # Hash partitioning keeps a group in one partition, but places the groups blindly.
        crossed = trace.crossJoin(F.broadcast(grid.select("config_id")))
        if partitions is None:
            crossed = crossed.repartition("purgatory", "config_id")
        else:
            crossed = crossed.repartition(partitions, "purgatory", "config_id")
    work = crossed.sortWithinPartitions("purgatory", "config_id", "arrival", "op_id").select(
        *WORK_COLUMNS
    )

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _reported(batches, engine)

    return work.mapInArrow(run, spark_schema(_JOB_SCHEMA))


def _direct_files(spark: SparkSession, trace_path: str, read: str) -> list[str] | None:
    """The trace's files for the direct read (as Spark lists them), or ``None``: read through
    Spark, said on stderr (``read="auto"`` where the tasks cannot read them: `direct_read_problem`).

    The driver lists the files and reads their footers itself where it can be sure to find
    what Spark's read would (`listed_files`: a local trace, on a session of its own JVM): no
    Spark job. Otherwise the trace's schema is checked as `load_trace` checks it (Spark's
    inference, a job), so a missing or a mistyped column is reported in the same words on
    both paths.
    """
    found = None if is_connect(spark) else listed_files(trace_path)
    files = found if found is not None else sorted(_read_trace(spark, trace_path).inputFiles())
    why = direct_read_problem(files)
    if why is None:
        return files
    if read == "direct":
        raise ValueError(f"the trace cannot be read directly: {why}")
    print(f"replay: reading the trace through Spark, not directly: {why}", file=sys.stderr)
    return None


def _direct(
    spark: SparkSession,
    trace_path: str,
    files: Sequence[str],
    configs: Sequence[ReplayConfig],
    *,
    partitions: int | None,
    engine: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
) -> DataFrame:
    """The job's rows, each task reading its groups' rows from the trace's files itself.

    The driver counts each purgatory's rows (that column alone) and assigns the groups to the
    partitions (`assign`); the plan, each partition's groups, is closed over by the tasks, one
    per partition of `task_slots`, and ``mapInArrow`` over those runs `task_input` into the
    engine. The JVM carries only the rows the engine emits. Rows without a purgatory are checked
    by the first task (they are all bad: the job fails naming the first).
    """
    counts = purgatory_counts(files, trace_path)
    by_id = dict(enumerate(configs))
    weights = {(name, i): n for name, n in counts.items() if name is not None for i in by_id}
    n = partitions if partitions is not None else max(1, min(_parallelism(spark), len(weights)))
    plan: list[dict[str | None, list[int]]] = [{} for _ in range(n)]
    for (name, config_id), p in sorted(assign(weights, n).items()):
        plan[p].setdefault(name, []).append(config_id)
    if None in counts:
        plan[0].setdefault(None, [])
    limits = horizon_limits(configs)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        mine: dict[str | None, list[int]] = {}
        for batch in batches:
            for slot in batch.column("id").to_pylist():
                for name, config_ids in plan[slot].items():
                    mine.setdefault(name, []).extend(config_ids)
        problems: list[dict[str, Any]] = []
        source = task_input(files, trace_path, mine, limits, problems)
        return in_system_pool(with_problems(_reported(source, engine), problems, _DIRECT_SCHEMA))

    return task_slots(spark, n).mapInArrow(run, spark_schema(_DIRECT_SCHEMA))


def task_slots(spark: SparkSession, n: int) -> DataFrame:
    """`n` partitions of one row each, partition p holding ``id`` p: a task per partition of a
    plan that the tasks look up by that id (the plan closed over), placed without a shuffle.

    (A plan of a row per group, repartitioned by `partition_keys`, was a shuffle: a Spark job
    of its own before the replay's, seconds on a cluster.)
    """
    return spark.range(0, n, 1, n)


#: The variable that turns `warmed`'s warm-up job off (``off``), to compare with and without.
WARM_SETTING: Final = "PURGATORY_SPARK_WARMUP"
#: What a warm-up task imports: the modules a replay task's function needs (`warmed`).
WARM_MODULES: Final = (
    "numpy",
    "pyarrow.compute",
    "pyarrow.parquet",
    "purgatory.pipeline._direct",
    "purgatory.pipeline._job_shards",
)


@contextmanager
def warmed(
    spark: SparkSession, n: int, out: str | None = None
) -> Iterator[Callable[[], None] | None]:
    """Run the body while a trivial Spark job of `n` tasks does the executors' first work, on
    a cluster (a classic session whose master is not ``local[...]``; `n` above 0); elsewhere
    just the body. Yields a function that waits for that job (``None`` without one): call it
    before the body's first Spark job.

    A cluster's executors do their first task's work cold: the executor JVM deserialises its
    first task (1.4-1.9 s in a job timeline at 2 M operations, load about 3), starts its Python
    daemon and forks a worker (1.3 s), and takes 3.0 s more before the task's function gets
    its first batch (the Arrow path's first use and the imports); the driver JVM plans its
    first ``mapInArrow`` query (2.9 s). The split job's driver first reads the trace's columns
    and plans its shards (seconds at 20 M operations), with the executors idle. Started here,
    in a thread, a ``mapInArrow`` job of one task per core over a ``range`` (as `task_slots`)
    does that cold work meanwhile, importing `WARM_MODULES` into the Python workers, which
    Spark keeps for the replay's tasks (``spark.python.worker.reuse``, on by default); with
    `out`, it also writes its rows as Parquet beside it, deleted at once (the summary's write
    is otherwise the executors' first Parquet write: 1.7-3.1 s of run for a few rows in the
    same timeline). It computes nothing the replay uses; its failure is ignored (the replay
    then pays the cold start itself). It is waited for before the replay's job (submitted
    first, that job's tasks would take the cores and leave the warm-up's queued behind them)
    and at the body's end, so no job of it outlives the call. Not on ``local[...]``, where the
    driver's JVM is the executor's and the replay's two Spark jobs are all the job runs
    (tests/test_pipeline_jobs.py), nor with ``PURGATORY_SPARK_WARMUP=off``.

    It pays where the driver's own work before the replay's job lasts about as long as the
    warm-up job (7 s at 20 M operations: none of it was left to wait for); on a short trace
    the cold start is moved rather than hidden, and on the tests' cluster (its executors on
    the driver's 2 CPUs) the warm-up job also takes CPU from the driver's read.
    """
    setting = os.environ.get(WARM_SETTING, "").strip().lower()
    off = setting in {"off", "0", "no", "false"}
    if off or n < 1 or is_connect(spark) or is_local_master(spark.sparkContext.master):
        yield None
        return
    thread = threading.Thread(
        target=_warm, args=(spark, n, out), name="purgatory-warm", daemon=True
    )
    thread.start()
    try:
        yield thread.join
    finally:
        thread.join()


def _warm(spark: SparkSession, n: int, out: str | None) -> None:
    """`warmed`'s job: each task imports `WARM_MODULES` and returns one row (with `out`,
    written beside it as Parquet and deleted)."""
    modules = WARM_MODULES

    def warm(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import importlib

        for module in modules:
            importlib.import_module(module)
        rows = sum(batch.num_rows for batch in batches)
        yield pa.RecordBatch.from_pydict({"rows": [rows]})

    try:
        spark.sparkContext.setJobDescription("purgatory: the executors' first work (warm-up)")
        frame = task_slots(spark, n).mapInArrow(warm, "rows long")
        if out is None:
            frame.collect()
            return
        scratch = f"{out.rstrip('/')}.warm-{uuid.uuid4().hex[:8]}"
        try:
            frame.write.parquet(scratch)
        finally:
            _files_of(spark)("delete", scratch)
    except Exception:  # noqa: BLE001 (an optimisation only: the replay pays the cold start)
        pass


def with_problems(
    batches: Iterator[pa.RecordBatch], problems: Sequence[Mapping[str, Any]], schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """A task's `batches` with `schema`'s last column, `PROBLEM`, null; then, if `problems`
    holds anything once they are done, one row saying it (JSON; the other columns null, or a
    placeholder where they cannot be: the group's, no group's values)."""
    for batch in batches:
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, pa.nulls(batch.num_rows, pa.string())], schema=schema
        )
    if problems:
        said = [
            pa.array([""] if field.type == pa.string() else [-1], field.type)
            if not field.nullable
            else pa.nulls(1, field.type)
            for field in list(schema)[:-1]
        ]
        yield pa.RecordBatch.from_arrays(
            [*said, pa.array([encode_problems(problems)], pa.string())], schema=schema
        )


def _raise_problems(found: Sequence[Mapping[str, Any]], trace_path: str) -> None:
    """Raise what the direct read's tasks found in the trace (`trace_problem`), if anything,
    from the job's groups' rows (`found`; a task's problems in a row of their own)."""
    said = [row[PROBLEM] for row in found if row[PROBLEM] is not None]
    problems = [problem for text in said for problem in decode_problems(text)]
    error = trace_problem(problems, trace_path)
    if error is not None:
        raise error


def _balanced(
    spark: SparkSession,
    trace: DataFrame,
    by_id: dict[int, ReplayConfig],
    partitions: int | None,
) -> DataFrame:
    """The trace crossed with the configurations, each group in the partition `assign` gave it.

    The plan is a small table (purgatory, config_id, partition key) broadcast to the trace's
    join; the join on ``purgatory`` alone also crosses each operation with every configuration.
    ``repartition(n, key)`` with an explicit count is placed by ``pmod(hash(key), n)``, which
    `partition_keys` inverts, and is not coalesced by adaptive execution.
    """
    counts = {
        row["purgatory"]: int(row["count"]) for row in trace.groupBy("purgatory").count().collect()
    }
    weights = {(name, config_id): n for name, n in counts.items() for config_id in by_id}
    n = partitions if partitions is not None else max(1, min(_parallelism(spark), len(weights)))
    plan = assign(weights, n)
    keys = partition_keys(n)
    mapping = spark.createDataFrame(
        [(name, config_id, keys[p]) for (name, config_id), p in sorted(plan.items())],
        "purgatory string, config_id int, _partition_key int",
    )
    joined = trace.join(F.broadcast(mapping), "purgatory")
    return joined.repartition(n, "_partition_key")


def _parallelism(spark: SparkSession) -> int:
    """The session's default parallelism: its executors' cores (local[N]: N).

    Spark Connect has no SparkContext in the client: there it is the partition count of a
    ``range`` (a leaf's default parallelism, the same figure on the server).
    """
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    parts = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p"))
    probe = parts.agg(F.max("p").alias("last"))  # (not max(spark_partition_id()): refused)
    return int(probe.first()["last"]) + 1  # type: ignore[index]


def _reported(
    batches: Iterator[pa.RecordBatch],
    engine: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: pa.Schema = _JOB_SCHEMA,
) -> Iterator[pa.RecordBatch]:
    """Run `engine` on `batches` in a task; add `TASK_SCHEMA`'s columns to its batches.

    A group's row gets the seconds since the previous group's row (the first: since the task
    asked for its first batch), of which those spent in the input iterator (the engine reads a
    batch ahead, so a batch that starts a group is counted to the group before).
    """
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else -1
    host, pid = socket.gethostname(), os.getpid()
    input_wall = input_cpu = 0.0

    def timed() -> Iterator[pa.RecordBatch]:
        nonlocal input_wall, input_cpu
        source = iter(batches)
        while True:
            wall, cpu = time.perf_counter(), time.process_time()
            batch = next(source, None)
            input_wall += time.perf_counter() - wall
            input_cpu += time.process_time() - cpu
            if batch is None:
                return
            yield batch

    last_wall, last_cpu = time.perf_counter(), time.process_time()
    for batch in engine(timed()):
        n = batch.num_rows
        if batch.column("op_id").null_count < n:  # the operations' rows
            extra = [pa.nulls(n, field.type) for field in TASK_SCHEMA]
        else:  # a group's row
            wall, cpu = time.perf_counter(), time.process_time()
            values = [
                partition,
                host,
                pid,
                wall - last_wall,
                cpu - last_cpu,
                input_wall,
                input_cpu,
            ]
            extra = [pa.array([v] * n, f.type) for v, f in zip(values, TASK_SCHEMA, strict=True)]
            last_wall, last_cpu = wall, cpu
            input_wall = input_cpu = 0.0
        yield pa.RecordBatch.from_arrays([*batch.columns, *extra], schema=schema)


def _tasks(found: Sequence[Mapping[str, Any]]) -> list[ReplayTask]:
    """Each task's `ReplayTask`, from its groups' rows (in the order it replayed them)."""
    by_partition: dict[int, list[Mapping[str, Any]]] = {}
    for row in sorted(found, key=lambda r: (r["purgatory"], r["config_id"])):
        if row.get(PROBLEM) is None:
            by_partition.setdefault(row["task_partition"], []).append(row)
    return [
        ReplayTask(
            partition=partition,
            host=mine[0]["task_host"],
            pid=mine[0]["task_pid"],
            groups=tuple(f"{r['purgatory']}@{r['config_id']}" for r in mine),
            operations=sum(r["operations"] for r in mine),
            seconds=sum(r["task_seconds"] for r in mine),
            cpu_seconds=sum(r["task_cpu_seconds"] for r in mine),
            input_seconds=sum(r["task_input_seconds"] for r in mine),
            input_cpu_seconds=sum(r["task_input_cpu_seconds"] for r in mine),
        )
        for partition, mine in sorted(by_partition.items())
    ]


def summary_rows(
    groups: Sequence[Mapping[str, Any]], by_id: Mapping[int, ReplayConfig]
) -> list[tuple[Any, ...]]:
    """The summary's rows (`REPLAY_SUMMARY_COLUMNS`, by purgatory then configuration) from
    each group's own row (its task's, or its shards' merged): the columns a Spark summary
    query gives, computed here as Spark computes them (a share and the utilisation are IEEE
    divisions of the same doubles), without a Spark job per step."""

    def share(count: int | None, operations: int | None) -> float | None:
        if count is None or operations is None:
            return None
        return count / max(operations, 1)

    def utilisation(busy: float | None, span: float | None) -> float | None:
        if span is None or not (span > 0 or math.isnan(span)):  # (Spark: NaN > 0)
            return 0.0
        return None if busy is None else busy / span

    rows = []
    for g in sorted(groups, key=lambda r: (r["purgatory"], r["config_id"])):
        if g.get(PROBLEM) is not None:
            continue
        c = by_id[g["config_id"]]
        values = {
            "purgatory": g["purgatory"],
            "config_id": g["config_id"],
            "tick": c.tick,
            "wheel_size": c.wheel_size,
            "purge_interval": c.purge_interval,
            "timeout_scale": c.timeout_scale,
            "rate_scale": c.rate_scale,
            "trigger": c.trigger,
            **{name: g[name] for name in COUNTS[:3]},
            **dict.fromkeys(COUNTS[3:], 0),
            "expired_share": share(g["expired"], g["operations"]),
            "missed": g["missed"],
            "missed_share": share(g["missed"], g["operations"]),
            **{name: g[name] for name in (*STATS, "peak_delayed", *GAUGES)},
            "busy_seconds": g["busy"],
            "utilisation": utilisation(g["busy"], g["span"]),
            "pass_lateness_p50": g["pass_late_p50"],
            "pass_lateness_p99": g["pass_late_p99"],
            "pass_lateness_max": g["pass_late_max"],
        }
        rows.append(tuple(values[name] for name in REPLAY_SUMMARY_COLUMNS))
    return rows
