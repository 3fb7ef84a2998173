"""The replay jobs' fixed cost: what the driver does itself instead of Spark jobs of its own.

On a cluster every Spark job is seconds of scheduling, and the first is also the executors'
Python workers' start. The groups job and the split job run two Spark jobs each on a local
trace that the driver can list: the replay (the tasks placed one per partition of a ``range``,
no shuffle) and the summary's write. The driver lists the trace's files and reads their schema
itself only where it finds what Spark's read would (`listed_files`, else Spark's read and its
errors); it computes the summary from the groups' rows the replay brings back (`summary_rows`,
equal to Spark's `_summary` on the same rows); and the summary returned is read back only when
the caller uses it. That the results are the same on every path: test_pipeline_balance.py,
test_pipeline_shards.py, test_pipeline.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from spark_support import CONFIGS, small_w1, write_trace

from purgatory.pipeline import ReplayConfig, generate, replay, replay_table
from purgatory.pipeline._direct import listed_files
from purgatory.pipeline._frames import spark_schema
from purgatory.pipeline._job_replay import (
    SUMMARY_SCHEMA,
    WARM_SETTING,
    config_grid,
    read_summary,
    summary_rows,
    warmed,
)
from purgatory.pipeline._replay import OUTPUT_SCHEMA
from purgatory.pipeline._shards import Boundary
from purgatory.pipeline._summary import COUNTS, GAUGES, REPLAY_SUMMARY_COLUMNS, STATS, share


@pytest.fixture(scope="module")
def trace(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A W1 trace of 2 purgatories, as `generate` writes it (files, ``_SUCCESS``, ``.crc``)."""
    path = tmp_path_factory.mktemp("jobs") / "trace"
    generate(spark, small_w1(1500, seed=4, chunk=500), str(path))
    return path


def _summary(groups: DataFrame, grid: DataFrame) -> DataFrame:
    """The summary as Spark computes it from each group's own row (what the replay computed so
    before `summary_rows`): the reference `summary_rows` and `SUMMARY_SCHEMA` are held to."""
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


def test_the_driver_lists_the_files_spark_lists(spark: SparkSession, trace: Path) -> None:
    found = listed_files(str(trace))
    assert found is not None
    assert found == sorted(spark.read.parquet(str(trace)).inputFiles())
    one = found[0].removeprefix("file://")
    assert listed_files(one) == spark.read.parquet(one).inputFiles()


@pytest.mark.parametrize(
    "case",
    [
        "partition directory",
        "summary file",
        "space in a name",
        "schemas differ",
        "unsigned ids",
        "decimal arrivals",
        "missing column",
        "not parquet",
        "no files",
        "no such path",
    ],
)
def test_whatever_spark_might_read_otherwise_is_left_to_spark(tmp_path: Path, case: str) -> None:
    """Each of these traces is listed by Spark's read (``None`` here): a schema it might read
    otherwise, a listing it might make otherwise, or an error only it words."""
    root = tmp_path / "trace"
    write_trace(root / "part-0.parquet")
    assert listed_files(str(root)) is not None  # (the case below is what changes it)
    if case == "partition directory":
        write_trace(root / "purgatory=q" / "part-1.parquet", purgatory=None)
    elif case == "summary file":
        pq.write_metadata(pq.read_schema(root / "part-0.parquet"), root / "_metadata")
    elif case == "space in a name":
        write_trace(root / "part 1.parquet")
    elif case == "schemas differ":
        write_trace(root / "part-1.parquet", op_id=pa.array([2, 3], pa.int32()))
    elif case == "unsigned ids":
        write_trace(root / "part-0.parquet", op_id=pa.array([0, 1], pa.uint32()))
    elif case == "decimal arrivals":
        write_trace(root / "part-0.parquet", arrival=pa.array([0, 1], pa.decimal128(5, 2)))
    elif case == "missing column":
        write_trace(root / "part-0.parquet", keys=None)
    elif case == "not parquet":
        (root / "part-1.parquet").write_text("not parquet")
    elif case == "no files":
        (root / "part-0.parquet").unlink()
    else:
        root = tmp_path / "elsewhere"
    assert listed_files(str(root)) is None


def test_hidden_files_are_skipped_as_spark_skips_them(tmp_path: Path) -> None:
    root = tmp_path / "trace"
    write_trace(root / "part-0.parquet")
    (root / "_SUCCESS").write_text("")
    (root / ".part-0.parquet.crc").write_text("")
    assert listed_files(str(root)) == [f"file://{root / 'part-0.parquet'}"]
    assert listed_files(f"file://{root}") == [f"file://{root / 'part-0.parquet'}"]


def test_the_summary_rows_are_sparks_summary_of_the_same_rows(spark: SparkSession) -> None:
    """`summary_rows` against `_summary` (Spark's columns) on the groups' rows of a replay
    under two configurations, and on rows at the edges of its divisions: no operations, a
    span of 0, a NaN span (greater than 0 to Spark), a null busy time."""
    table = _trace(small_w1(400, seed=9))
    by_id = dict(enumerate(CONFIGS))
    replayed = replay_table(table, by_id)
    groups = replayed.filter(pc.is_null(replayed["op_id"])).to_pylist()
    edge = dict(groups[0])
    extra = [
        {**edge, "purgatory": "z0", "operations": 0, "expired": 0, "missed": 0},
        {**edge, "purgatory": "z1", "span": 0.0},
        {**edge, "purgatory": "z2", "span": math.nan},
        {**edge, "purgatory": "z3", "busy": None, "span": 2.0},
        {**edge, "purgatory": "z4", "busy": None, "span": None},
    ]
    rows = [*groups, *extra]
    frame = spark.createDataFrame(
        [tuple(r[name] for name in OUTPUT_SCHEMA.names) for r in rows],
        spark_schema(OUTPUT_SCHEMA),
    )
    grid = config_grid(spark, CONFIGS)
    assert _summary(frame, grid).schema == SUMMARY_SCHEMA  # (the schema written: Spark's)
    theirs = [tuple(row) for row in _summary(frame, grid).collect()]
    mine = summary_rows(rows, by_id)
    assert len(mine) == len(groups) + len(extra)
    assert _same(mine, theirs)


def _same(mine: list[tuple[Any, ...]], theirs: list[tuple[Any, ...]]) -> bool:
    """Equal row by row, value by value (NaN equal to NaN, a float's bits compared)."""

    def key(value: Any) -> Any:
        if isinstance(value, float):
            return ("nan",) if math.isnan(value) else value.hex()
        return value

    return [tuple(map(key, row)) for row in mine] == [tuple(map(key, row)) for row in theirs]


def _trace(w1: Any) -> pa.Table:
    from purgatory.pipeline._generate import chunk_plan, generate_chunk

    return pa.Table.from_batches([generate_chunk(w1, chunk) for chunk in chunk_plan(w1)])


def _jobs(spark: SparkSession, group: str) -> Iterator[int]:
    yield from spark.sparkContext.statusTracker().getJobIdsForGroup(group)


@pytest.mark.parametrize("shards", [1, 2])
def test_two_spark_jobs_the_replay_and_the_summarys_write(
    spark: SparkSession, trace: Path, tmp_path: Path, shards: int
) -> None:
    """On a trace the driver lists itself, the groups job (and the split job) runs the
    replay and the summary's write, no other Spark job; the summary it returns is read when
    used, with the schema of the file written."""
    sc = spark.sparkContext
    group = f"replay-jobs-{shards}"
    sc.setJobGroup(group, "the replay's jobs")
    checked: list[Boundary] = []
    try:
        summary = replay(
            spark,
            str(trace),
            str(tmp_path / "out"),
            # (Purges at every pass: the warm-ups rebuild the state, every boundary matches.)
            [ReplayConfig(purge_interval=0), ReplayConfig(tick=0.01, purge_interval=0)],
            operations=False,
            tasks=None,
            shards=shards,
            boundaries=checked.extend,
            read="direct",
        )
        ran = len(list(_jobs(spark, group)))
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert all(boundary.matched for boundary in checked)
    assert len(checked) == (4 if shards == 2 else 0)
    assert ran == 2
    written = spark.read.parquet(str(tmp_path / "out" / "summary"))
    assert summary.schema == written.schema
    assert [tuple(r) for r in summary.collect()] == [
        tuple(r) for r in written.orderBy("purgatory", "config_id").collect()
    ]
    assert [(r["purgatory"], r["config_id"]) for r in summary.collect()] == [
        (p, c) for p in ("p0000", "p0001") for c in (0, 1)
    ]
    assert read_summary(spark, str(tmp_path / "out")).schema == written.schema


class _StubContext:
    master = "spark://127.0.0.1:7077"

    def setJobDescription(self, value: str) -> None:
        pass


class _StubSession:
    """A classic session on a cluster, as `warmed` sees one: its warm-up job fails at once."""

    def __init__(self) -> None:
        self.sparkContext = _StubContext()
        self.asked: list[int] = []

    def range(self, start: int, end: int, step: int, partitions: int) -> DataFrame:
        self.asked.append(partitions)
        raise RuntimeError("no cluster here")


def test_the_warm_up_runs_on_a_cluster_only_and_its_failure_is_ignored(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster `warmed` starts one task per core and yields the wait for it; its job
    failing costs the replay nothing. Not on local[N], nor with PURGATORY_SPARK_WARMUP=off."""
    cluster: Any = _StubSession()
    monkeypatch.delenv(WARM_SETTING, raising=False)
    with warmed(cluster, 3, "out") as ready:
        assert ready is not None
        ready()
    assert cluster.asked == [3]
    with warmed(spark, 2, "out") as ready:
        assert ready is None
    monkeypatch.setenv(WARM_SETTING, "off")
    with warmed(cluster, 3, "out") as ready:
        assert ready is None
    assert cluster.asked == [3]
