"""The replay's direct read alone (`purgatory.pipeline._direct`, no Spark).

A task's input read from the trace's files is its groups' rows in the order Spark's read hands
them over (the engine's output equal to the plain replay's); only the row groups whose statistics
may hold a purgatory are read; what the tasks find wrong merges into the error `load_trace` gives
for the whole trace. That both read paths give the same rows, summaries and errors on Spark:
test_pipeline.py and test_pipeline_balance.py.
"""

from __future__ import annotations

import math
import random
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from spark_support import CONFIGS, bad_trace, write_trace

from purgatory.pipeline import W1, replay_table
from purgatory.pipeline._checks import horizon_limits
from purgatory.pipeline._direct import (
    BATCH_ROWS,
    WORK_COLUMNS,
    decode_problems,
    direct_read_problem,
    driver_columns,
    encode_problems,
    first_duplicate,
    in_system_pool,
    purgatory_counts,
    system_pool,
    task_input,
    trace_problem,
)
from purgatory.pipeline._frames import TraceError
from purgatory.pipeline._generate import chunk_plan, generate_chunk
from purgatory.pipeline._replay import replay_batches

W1_DIRECT = W1(
    purgatories=3,
    operations=1000,
    rate=2000.0,
    timeout=0.1,
    p50=0.04,
    p75=0.09,
    keys=20,
    seed=11,
    chunk=400,
)


def uri(path: Path) -> str:
    """A file as Spark's ``inputFiles`` names it."""
    return path.resolve().as_uri()


@pytest.fixture(scope="module")
def shuffled(tmp_path_factory: pytest.TempPathFactory) -> tuple[pa.Table, list[str]]:
    """A trace of 3 purgatories, its rows shuffled over 3 files of row groups of 250 rows
    (every row group mixes purgatories, and a path with a space); (the table, its files)."""
    table = pa.concat_tables(
        pa.Table.from_batches([generate_chunk(W1_DIRECT, chunk)]) for chunk in chunk_plan(W1_DIRECT)
    )
    order = list(range(table.num_rows))
    random.Random(5).shuffle(order)
    rows = table.take(order)
    directory = tmp_path_factory.mktemp("direct") / "a trace"
    directory.mkdir()
    files = []
    for i in range(3):
        path = directory / f"part-{i}.parquet"
        part = rows.slice(i * 1000, 1000)
        pq.write_table(part, path, row_group_size=250, write_page_checksum=True)
        files.append(uri(path))
    return table, files


def ops(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(
        table.to_pylist(), key=lambda r: (r["purgatory"], r["config_id"], r["op_id"] or -1)
    )


def test_a_task_replays_its_groups_as_the_plain_replay_does(
    shuffled: tuple[pa.Table, list[str]],
) -> None:
    table, files = shuffled
    assert purgatory_counts(files, "trace") == {"p0000": 1000, "p0001": 1000, "p0002": 1000}
    configs = dict(enumerate(CONFIGS))
    groups: dict[str | None, list[int]] = {
        "p0002": [1, 0],
        "p0000": [1],
    }  # the plan's order does not matter
    problems: list[dict[str, Any]] = []
    batches = list(task_input(files, "trace", groups, horizon_limits(CONFIGS), problems))
    assert problems == []
    assert all(b.schema.names == list(WORK_COLUMNS) and b.num_rows <= BATCH_ROWS for b in batches)
    seen = [(b["purgatory"][0].as_py(), b["config_id"][0].as_py()) for b in batches]
    assert list(dict.fromkeys(seen)) == [("p0000", 1), ("p0002", 0), ("p0002", 1)]
    got = pa.Table.from_batches(list(replay_batches(batches, configs)))
    plain = replay_table(table, configs)
    wanted = plain.filter(
        pc.is_in(
            pc.binary_join_element_wise(
                plain["purgatory"], pc.cast(plain["config_id"], pa.string()), "@"
            ),
            pa.array(["p0000@1", "p0002@0", "p0002@1"]),
        )
    )
    assert got.num_rows == wanted.num_rows == 3 * 1000 + 3
    assert ops(got) == ops(wanted)


def corrupt(path: Path, row_group: int) -> None:
    """Zero a stretch of the first data page of `row_group`'s ``op_id`` column."""
    column = pq.read_metadata(path).row_group(row_group).column(1)
    start = column.data_page_offset + 40
    data = bytearray(path.read_bytes())
    data[start : start + 200] = bytes(200)
    path.write_bytes(data)


def test_only_the_row_groups_that_may_hold_a_purgatory_are_read(tmp_path: Path) -> None:
    """A file of one purgatory per row group, the second row group corrupted: purgatory a is
    read (its row group alone), b's read is reported naming the file, as Spark's read does."""
    n = 400
    table = pa.table(
        {
            "purgatory": ["a"] * n + ["b"] * n,
            "op_id": pa.array(range(2 * n), pa.int64()),
            "arrival": [i * 0.001 for i in range(2 * n)],
            "keys": pa.array([["k"]] * (2 * n), pa.list_(pa.string())),
            "timeout": [0.1] * (2 * n),
            "condition_at": pa.nulls(2 * n, pa.float64()),
        }
    )
    path = tmp_path / "trace" / "part-0.parquet"
    path.parent.mkdir()
    pq.write_table(table, path, row_group_size=n, write_page_checksum=True)
    corrupt(path, 1)
    limits = horizon_limits(CONFIGS)
    batches = list(task_input([uri(path)], str(path.parent), {"a": [0]}, limits, []))
    assert sum(b.num_rows for b in batches) == n
    problems: list[dict[str, Any]] = []
    assert (
        list(task_input([uri(path)], str(path.parent), {"b": [0], "c": [0]}, limits, problems))
        == []
    )
    assert [p["kind"] for p in problems] == ["file"]  # (and the task's input ended)
    assert str(trace_problem(problems, str(path.parent))) == (
        f"trace file {path.parent}/part-0.parquet: a Parquet page fails its checksum "
        "(the file is corrupted)"
    )


def found_by(files: list[str], root: str, tasks: list[dict[str | None, list[int]]]) -> list[Any]:
    """What tasks with these groups report, through the job's JSON."""
    said = []
    for groups in tasks:
        problems: list[dict[str, Any]] = []
        assert list(task_input(files, root, groups, horizon_limits(CONFIGS[:1]), problems)) == []
        said += decode_problems(encode_problems(problems)) if problems else []
    return said


def test_the_tasks_findings_merge_into_load_traces_error(tmp_path: Path) -> None:
    files = bad_trace(tmp_path / "bad")
    root = str(tmp_path / "bad")
    assert purgatory_counts(files, root) == {"a": 3, "b": 4, "c": 2, None: 1}
    # a's rows in one task, b's (under two configurations) in two: one report each.
    said = found_by(files, root, [{"a": [0], "b": [0]}, {"b": [1], "c": [0]}])
    error = trace_problem(said, root)
    assert str(error) == (
        f"trace file {root}/part-0.parquet: row purgatory='a' op_id=2: column 'keys' is empty "
        "(arrival=0.0, timeout=1.0, condition_at=None); 4+ more bad rows"
    )
    # With the row without a purgatory (checked by one task): it comes first, as Spark sorts.
    said += found_by(files, root, [{None: []}])
    assert str(trace_problem(said, root)).startswith(
        f"trace file {root}/part-0.parquet: row purgatory=None op_id=3: column 'purgatory' is null"
    )
    # Without the bad rows, the first duplicate id (by purgatory, then id), with its files.
    duplicates = [p for p in said if p["kind"] == "duplicate"]
    assert [p["purgatory"] for p in duplicates] == ["c"]  # b's duplicate hides behind bad rows
    assert str(trace_problem(duplicates, root)) == (
        f"trace file {root}/part-0.parquet, {root}/part-1.parquet: duplicate op_id 4 in "
        "purgatory 'c' (2 rows; an operation id must be unique within its purgatory)"
    )
    assert trace_problem([], root) is None


def test_a_task_that_found_a_problem_replays_nothing_more(tmp_path: Path) -> None:
    """Purgatory a has a bad row: its task still checks z (good), but yields none of its rows
    (the job fails); z's own task replays it."""
    directory = tmp_path / "t"
    directory.mkdir()
    path = directory / "part-0.parquet"
    pq.write_table(
        pa.table(
            {
                "purgatory": ["a", "z", "z"],
                "op_id": pa.array([0, 0, 1], pa.int64()),
                "arrival": [0.0, 0.0, 0.1],
                "keys": pa.array([[], ["k"], ["k"]], pa.list_(pa.string())),
                "timeout": [1.0, 1.0, 1.0],
                "condition_at": pa.nulls(3, pa.float64()),
            }
        ),
        path,
    )
    limits = horizon_limits(CONFIGS[:1])
    problems: list[dict[str, Any]] = []
    assert (
        list(task_input([uri(path)], str(directory), {"a": [0], "z": [0]}, limits, problems)) == []
    )
    assert [(p["kind"], p["purgatory"]) for p in problems] == [("rows", "a")]
    problems = []
    rows = list(task_input([uri(path)], str(directory), {"z": [0]}, limits, problems))
    assert problems == []
    assert [b.num_rows for b in rows] == [2]


def test_files_the_tasks_cannot_read_are_named_with_why(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "a b" / "part-0.parquet")
    assert direct_read_problem([uri(path), str(path)]) is None
    assert "%20" in uri(path)  # Spark's names are URIs: the direct read unquotes them
    said = direct_read_problem([uri(path), "s3a://bucket/trace/part-0.parquet"])
    assert str(said).startswith("pyarrow cannot open s3a://bucket/trace/part-0.parquet: ")
    assert direct_read_problem(["file://elsewhere/x"]) == (
        "pyarrow cannot open file://elsewhere/x: a file on another host (elsewhere)"
    )
    # A trace written with partitionBy("purgatory"): that column is in the directories' names.
    inner = write_trace(tmp_path / "by" / "purgatory=p" / "part-0.parquet", purgatory=None)
    assert direct_read_problem([uri(inner)]) == (
        f"{uri(inner)} holds no column 'purgatory' (Spark reads it from the directories' names)"
    )


def test_the_split_drivers_columns_are_each_purgatorys_in_the_files_order(
    shuffled: tuple[pa.Table, list[str]],
) -> None:
    """The split replay's driver reads each purgatory's arrivals and timeouts (and conditions
    when asked) from every file, cast to doubles, in the files' order, and its longest
    timeout; the shuffled rows are grouped by purgatory."""
    _, files = shuffled
    read = pa.concat_tables(
        pq.read_table(urllib.parse.unquote(file.removeprefix("file://"))) for file in files
    )
    limits = horizon_limits(CONFIGS)
    found = driver_columns(files, "trace", limits, conditions=True)
    plain = driver_columns(files, "trace", limits, conditions=False)
    assert found.counts() == plain.counts() == {"p0000": 1000, "p0001": 1000, "p0002": 1000}
    assert plain.conditions == {}
    for name in ("p0000", "p0001", "p0002"):
        mine = read.filter(pc.equal(read["purgatory"], name))
        assert found.arrivals[name].tolist() == mine["arrival"].to_pylist()
        assert plain.timeouts[name].tolist() == mine["timeout"].to_pylist()
        conditions = [math.nan if c is None else c for c in mine["condition_at"].to_pylist()]
        assert found.conditions[name].tolist() == pytest.approx(conditions, nan_ok=True)
        assert found.longest[name] == max(mine["timeout"].to_pylist())
        arrival, _, condition = found.for_carry()[name]
        assert arrival is found.arrivals[name]
        assert condition is found.conditions[name]


@pytest.mark.parametrize(
    ("without", "first"),
    [
        ((), "row purgatory=None op_id=3: column 'purgatory' is null"),
        ((None,), "row purgatory='a' op_id=2: column 'keys' is empty"),
        ((None, "a", "b"), "duplicate op_id 4 in purgatory 'c' (2 rows;"),
    ],
    ids=["no-purgatory", "bad-rows", "duplicate"],
)
@pytest.mark.parametrize("conditions", [False, True])
def test_what_the_split_drivers_checks_find_is_the_groups_jobs_error(
    tmp_path: Path, without: tuple[str | None, ...], first: str, conditions: bool
) -> None:
    """A row no shard reads (no purgatory, an arrival not a number), a bad row the driver's
    columns show, or a duplicate id across files: the driver raises the error the groups job's
    tasks give for the whole trace (`load_trace`'s, test_pipeline.py)."""
    files = bad_trace(tmp_path / "bad", without)
    root = str(tmp_path / "bad")
    names = purgatory_counts(files, root)
    expected = trace_problem(found_by(files, root, [{name: [0] for name in names}]), root)
    assert expected is not None
    assert first in str(expected)
    with pytest.raises(TraceError) as error:
        driver_columns(files, root, horizon_limits(CONFIGS[:1]), conditions=conditions)
    assert str(error.value) == str(expected)


@pytest.mark.parametrize(
    ("condition", "problem"),
    [
        (math.nan, "column 'condition_at' is not finite (use null for never)"),
        (math.inf, "column 'condition_at' is not finite (use null for never)"),
        (-1.0, "column 'condition_at' is before the arrival"),
    ],
)
def test_the_split_driver_finds_a_bad_condition_among_nulls(
    tmp_path: Path, condition: float, problem: str
) -> None:
    """A condition stored as NaN (not null: never), infinite, or before its arrival, among
    nulls: found by the driver's checks of its columns when it reads the conditions (for the
    purge counter), and said as the tasks say it."""
    (tmp_path / "t").mkdir()
    path = tmp_path / "t" / "part-0.parquet"
    pq.write_table(
        pa.table(
            {
                "purgatory": ["p"] * 3,
                "op_id": pa.array([0, 1, 2], pa.int64()),
                "arrival": [0.0, 0.1, 0.2],
                "keys": pa.array([["k"]] * 3, pa.list_(pa.string())),
                "timeout": [1.0, 1.0, 1.0],
                "condition_at": pa.array([None, condition, 0.5], pa.float64()),
            }
        ),
        path,
    )
    limits = horizon_limits(CONFIGS[:1])
    with pytest.raises(TraceError, match=re.escape(f"op_id=1: {problem}")):
        driver_columns([uri(path)], str(tmp_path / "t"), limits, conditions=True)
    found = driver_columns([uri(path)], str(tmp_path / "t"), limits, conditions=False)
    assert found.counts() == {"p": 3}  # (without the conditions: the tasks find it)


def test_a_split_purgatorys_bad_rows_are_merged_from_its_shards() -> None:
    """Each shard reports its own range's first rows; the error shows the first of them all
    and counts up to 4 more, as `load_trace` does over the whole trace."""

    def row(op_id: int) -> dict[str, Any]:
        return {
            "_file": "file:/t/part-0.parquet",
            "purgatory": "p",
            "op_id": op_id,
            "_problem": "column 'keys' is empty",
            "arrival": float(op_id),
            "timeout": 1.0,
            "condition_at": None,
        }

    said = [
        {"kind": "rows", "purgatory": "p", "shard": 0, "rows": [row(7), row(9)]},
        {"kind": "rows", "purgatory": "p", "shard": 1, "rows": [row(3), row(4), row(8)]},
        {"kind": "rows", "purgatory": "p", "shard": 2, "rows": [row(11)]},
    ]
    error = trace_problem(said, "/t")
    assert str(error) == (
        "trace file /t/part-0.parquet: row purgatory='p' op_id=3: column 'keys' is empty "
        "(arrival=3.0, timeout=1.0, condition_at=None); 4+ more bad rows"
    )
    one = trace_problem(said[2:], "/t")
    assert str(one).endswith("condition_at=None)")


def test_the_first_duplicate_id_sorted_or_not() -> None:
    assert first_duplicate(np.arange(10)) is None
    assert first_duplicate(np.array([5, 1, 9, 1, 5])) == 1
    assert first_duplicate(np.array([0, 1, 2, 2, 3])) == 2
    assert first_duplicate(np.array([], np.int64)) is None


@pytest.mark.parametrize(
    ("second", "duplicate"),
    [([5, 6, 7, 8, 9], None), ([3, 4, 5, 6, 7], 3), ([9, 8, 7, 6, 5], None)],
    ids=["increasing", "restarting", "decreasing"],
)
def test_ids_increasing_file_after_file_are_unique_and_others_are_checked(
    tmp_path: Path, second: list[int], duplicate: int | None
) -> None:
    """Two files of one purgatory, ids 0..4 then `second`: ids that go on increasing need no
    sort; others are checked whole (a duplicate found, or none)."""
    (tmp_path / "t").mkdir()
    files = []
    for i, ids in enumerate(([0, 1, 2, 3, 4], second)):
        path = tmp_path / "t" / f"part-{i}.parquet"
        pq.write_table(
            pa.table(
                {
                    "purgatory": ["p"] * 5,
                    "op_id": pa.array(ids, pa.int64()),
                    "arrival": [float(i * 5 + k) for k in range(5)],
                    "keys": pa.array([["k"]] * 5, pa.list_(pa.string())),
                    "timeout": [1.0] * 5,
                    "condition_at": pa.nulls(5, pa.float64()),
                }
            ),
            path,
        )
        files.append(uri(path))
    limits = horizon_limits(CONFIGS[:1])
    if duplicate is None:
        found = driver_columns(files, str(tmp_path / "t"), limits, conditions=True)
        assert found.arrivals["p"].tolist() == [float(k) for k in range(10)]
        return
    with pytest.raises(TraceError, match=f"duplicate op_id {duplicate} in purgatory 'p'"):
        driver_columns(files, str(tmp_path / "t"), limits, conditions=False)


def test_a_task_reads_on_the_system_allocator_and_gives_the_default_back() -> None:
    """The read allocates from the C library's allocator (pyarrow's default, mimalloc, served
    a trace's large buffers far slower: `system_pool`), only while it runs: the default pool is
    the caller's again once the block ends, the task's batches are all read, or the task is
    closed early; buffers made inside keep working after."""
    default = pa.default_memory_pool()
    system = pa.system_memory_pool().backend_name
    with system_pool():
        assert pa.default_memory_pool().backend_name == system
        kept = pa.array(range(1000))
    assert pa.default_memory_pool().backend_name == default.backend_name
    assert kept.to_pylist()[-1] == 999

    def batches() -> Iterator[pa.RecordBatch]:
        for i in range(3):
            assert pa.default_memory_pool().backend_name == system  # (each batch made inside)
            yield pa.record_batch({"i": [i]})

    assert [b["i"][0].as_py() for b in in_system_pool(batches())] == [0, 1, 2]
    assert pa.default_memory_pool().backend_name == default.backend_name
    early = in_system_pool(batches())
    next(early)
    early.close()
    assert pa.default_memory_pool().backend_name == default.backend_name
