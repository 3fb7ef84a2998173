"""A replay's groups spread over its tasks: balanced by operation count, placed exactly.

The assignment alone (`purgatory.pipeline._balance`): longest processing time first, and the
hash keys that Spark's hash partitioning sends to each partition (checked against Spark's own
``hash`` and ``repartition``). Then the replay job on the tests' local[2] session: each task
holds exactly the groups assigned to it, the job has as many tasks as partitions (adaptive
execution does not coalesce them), and the summary is the one hash partitioning and the plain
in-process replay give.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from spark_support import CONFIGS

from purgatory.pipeline import W1, ReplayConfig, replay, replay_table
from purgatory.pipeline._balance import assign, murmur3_int, partition_keys
from purgatory.pipeline._generate import chunk_plan, generate_chunk
from purgatory.pipeline._job_replay import ReplayTask

#: Operations of purgatory i in the uneven trace: 100, 150, ..., 450 (2,200 in all).
SIZES = [100 + 50 * i for i in range(8)]


def loads(plan: dict[str, int], weights: dict[str, int], partitions: int) -> list[int]:
    totals = [0] * partitions
    for item, p in plan.items():
        totals[p] += weights[item]
    return totals


def test_eight_equal_groups_over_two_partitions_are_four_and_four() -> None:
    weights = {f"p{i}": 1000 for i in range(8)}
    plan = assign(weights, 2)
    assert sorted(plan) == sorted(weights)
    assert sorted(list(plan.values()).count(p) for p in (0, 1)) == [4, 4]
    assert loads(plan, weights, 2) == [4000, 4000]


def test_eight_uneven_groups_over_two_partitions_are_split_evenly_by_operations() -> None:
    weights = {f"p{i}": n for i, n in enumerate(SIZES)}
    plan = assign(weights, 2)
    assert loads(plan, weights, 2) == [1100, 1100]
    assert [list(plan.values()).count(p) for p in (0, 1)] == [4, 4]


def test_the_plan_does_not_depend_on_the_order_of_the_weights() -> None:
    weights = {f"p{i}": n % 3 for i, n in enumerate(SIZES)}  # many ties
    backwards = dict(reversed(list(weights.items())))
    assert assign(weights, 3) == assign(backwards, 3)


@settings(deadline=None, max_examples=60)
@given(
    st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=8),
    st.integers(min_value=1, max_value=3),
)
def test_the_busiest_partition_is_within_graham_s_bound(sizes: list[int], partitions: int) -> None:
    """LPT's busiest partition is at most (4/3 - 1/(3m)) of the best split's (brute force)."""
    weights = {f"g{i}": n for i, n in enumerate(sizes)}
    plan = assign(weights, partitions)
    assert set(plan.values()) <= set(range(partitions))
    best = min(
        max(loads(dict(zip(weights, choice, strict=True)), weights, partitions))
        for choice in itertools.product(range(partitions), repeat=len(sizes))
    )
    assert max(loads(plan, weights, partitions)) * 3 * partitions <= best * (4 * partitions - 1)


def test_assign_refuses_no_partitions() -> None:
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        assign({"p": 1}, 0)
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        partition_keys(0)


def test_murmur3_is_spark_s_hash_of_an_int(spark: SparkSession) -> None:
    values = F.col("id").cast("int")
    rows = (
        spark.range(-1000, 1000)
        .union(spark.range(-(2**31), -(2**31) + 3))
        .union(spark.range(2**31 - 3, 2**31))
        .select(values.alias("k"), F.hash(values).alias("h"))
        .collect()
    )
    assert len(rows) == 2006
    assert [murmur3_int(row["k"]) for row in rows] == [row["h"] for row in rows]


@pytest.mark.parametrize("partitions", [1, 2, 3, 7])
def test_each_partition_key_lands_in_its_partition(spark: SparkSession, partitions: int) -> None:
    keys = partition_keys(partitions)
    frame = spark.createDataFrame([(k,) for k in keys for _ in range(3)], "k int")
    placed = frame.repartition(partitions, "k").select("k", F.spark_partition_id().alias("p"))
    assert sorted({(row["p"], row["k"]) for row in placed.collect()}) == list(enumerate(keys))


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 purgatories of 100, 150, ..., 450 operations (W1 traffic, cut to those sizes)."""
    w1 = W1(purgatories=8, operations=max(SIZES), chunk=max(SIZES), seed=3)
    table = pa.Table.from_batches([generate_chunk(w1, chunk) for chunk in chunk_plan(w1)])
    parts = []
    for i, n in enumerate(SIZES):
        mine = table.filter(pc.equal(table["purgatory"], f"p{i:04d}"))
        parts.append(mine.slice(0, n))
    path = tmp_path_factory.mktemp("uneven") / "trace.parquet"
    pq.write_table(pa.concat_tables(parts), path)
    return path


def summary_rows(path: Path) -> list[dict[str, object]]:
    return sorted(
        pq.read_table(path / "summary").to_pylist(),
        key=lambda r: (r["purgatory"], r["config_id"]),
    )


def test_each_task_holds_the_groups_assigned_to_it(
    spark: SparkSession, uneven: Path, tmp_path: Path
) -> None:
    """On local[2], 8 groups of uneven sizes run in 2 tasks of 1,100 operations each, each
    task exactly the groups `assign` gave its partition, reported after the job (the direct
    read; Spark's read gives its tasks the same groups: the test below)."""
    reported: list[ReplayTask] = []
    replay(
        spark,
        str(uneven),
        str(tmp_path / "out"),
        [ReplayConfig()],
        operations=False,
        tasks=reported.extend,
        read="direct",
    )
    plan = assign({(f"p{i:04d}", 0): n for i, n in enumerate(SIZES)}, 2)
    assert [task.partition for task in reported] == [0, 1]
    for task in reported:
        assert task.groups == tuple(
            f"{name}@{config}" for (name, config), p in sorted(plan.items()) if p == task.partition
        )
        assert task.operations == 1100
        assert len(task.groups) == 4
        assert task.seconds >= task.input_seconds >= 0
        assert task.cpu_seconds >= task.input_cpu_seconds >= 0
        assert task.pid > 0
    assert reported[0].pid != reported[1].pid  # two Python workers at once: two cores
    line = reported[0].describe()
    assert line.startswith("task of partition 0 (Python worker ")
    assert "4 groups (" in line
    assert "1,100 operations" in line


def test_the_balanced_replay_gives_the_hash_partitioned_and_the_plain_summary(
    spark: SparkSession, uneven: Path, tmp_path: Path
) -> None:
    """Under two configurations (16 groups) in 3 partitions, the summary and every operation's
    row are those of Spark's read (balanced, and hash-partitioned) and of the plain replay in
    this process; the direct read's tasks run the groups Spark's read gives them."""
    reported: list[ReplayTask] = []
    through_spark: list[ReplayTask] = []
    configs = dict(enumerate(CONFIGS))
    replay(
        spark,
        str(uneven),
        str(tmp_path / "balanced"),
        CONFIGS,
        partitions=3,
        tasks=reported.extend,
        read="direct",
    )
    replay(
        spark,
        str(uneven),
        str(tmp_path / "spark"),
        CONFIGS,
        partitions=3,
        tasks=through_spark.extend,
        read="spark",
    )
    replay(spark, str(uneven), str(tmp_path / "hashed"), CONFIGS, balance=False, tasks=None)
    assert [task.groups for task in reported] == [task.groups for task in through_spark]
    assert [task.partition for task in reported] == [0, 1, 2]
    assert sum(len(task.groups) for task in reported) == 16
    totals = sorted(task.operations for task in reported)
    assert sum(totals) == 2 * sum(SIZES)
    assert totals[-1] - totals[0] <= max(SIZES)  # within one group of even
    assert summary_rows(tmp_path / "balanced") == summary_rows(tmp_path / "hashed")
    assert summary_rows(tmp_path / "balanced") == summary_rows(tmp_path / "spark")
    ops = ["purgatory", "config_id", "op_id", "outcome", "watched_at", "deadline", "ended_at"]

    def rows(table: pa.Table) -> list[dict[str, object]]:
        return sorted(
            table.select(ops).to_pylist(),
            key=lambda r: (r["purgatory"], r["config_id"], r["op_id"]),
        )

    plain = replay_table(pq.read_table(uneven), configs)
    expected = rows(plain.filter(pc.is_valid(plain["op_id"])))
    assert rows(pq.read_table(tmp_path / "balanced" / "operations")) == expected
    assert rows(pq.read_table(tmp_path / "spark" / "operations")) == expected
    # The same files: the same columns (the wait too), types, metadata and values.
    for part in ("summary", "operations"):
        direct, through = (pq.read_table(tmp_path / out / part) for out in ("balanced", "spark"))
        assert direct.schema == through.schema
        key = ["purgatory", "config_id", *(["op_id"] if part == "operations" else [])]
        order = [(name, "ascending") for name in key]
        assert direct.sort_by(order).to_pylist() == through.sort_by(order).to_pylist()
    assert rows(pq.read_table(tmp_path / "hashed" / "operations")) == expected


def test_the_default_report_is_a_line_per_task_on_stderr(
    spark: SparkSession, uneven: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replay(spark, str(uneven), str(tmp_path / "out"), [ReplayConfig()], operations=False)
    lines = capsys.readouterr().err.splitlines()
    said = [line for line in lines if line.startswith("replay: task of partition")]
    assert [line.split()[4] for line in said] == ["0", "1"]
    assert all("4 groups" in line and "1,100 operations" in line for line in said)
