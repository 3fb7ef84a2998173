"""The Spark pipeline on a real local SparkSession (one for the whole test session, local[2]).

Covered: replay exactness (the outcome model: complete iff the condition comes before the
deadline rounded up to the tick) and determinism (plain single-process replay, one Spark
partition, one per group); the event log a replay writes, analysed, equals the replay's own
summary, and turns back into a trace that replays the same; bad input is refused with the file
and the row or column named, leaving no output. (A cluster, Spark Connect, and the cluster
recipe, spark-submit with --py-files: test_pipeline_clusters.py.)
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers import FlagOperation, run_process
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual
from spark_support import CONFIGS, bad_trace, small_w1, write_trace

from purgatory import ArrowEventLog, JsonLinesEventLog
from purgatory.pipeline import (
    SHARED_SUMMARY_COLUMNS,
    W1,
    TraceError,
    _job_replay,
    _job_trace,
    analyze,
    generate,
    load_event_log,
    load_trace,
    replay,
    replay_table,
    trace_anchors,
    trace_from_log,
)
from purgatory.pipeline._cli import main
from purgatory.pipeline._generate import TRACE_SCHEMA, chunk_plan, generate_chunk
from purgatory.pipeline._spark import atomic_output

W1_SMALL = small_w1(3000, seed=7, chunk=1000)
OP_COLUMNS = ["purgatory", "config_id", "op_id", "outcome", "watched_at", "deadline", "ended_at"]


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pipeline")


@pytest.fixture(scope="session")
def trace(spark: SparkSession, work: Path) -> str:
    path = str(work / "trace")
    assert generate(spark, W1_SMALL, path) == 6000
    return path


@pytest.fixture(scope="session")
def replayed(spark: SparkSession, work: Path, trace: str) -> tuple[str, str]:
    """The trace replayed on Spark (a partition per group) with an event log; (out, log)."""
    out, log = str(work / "replay"), str(work / "events")
    replay(spark, trace, out, CONFIGS, event_log=log)
    return out, log


def ops_of(table: pa.Table) -> list[dict[str, Any]]:
    """Operation rows (not the gauges rows), sorted, as dicts of `OP_COLUMNS`."""
    if "op_id" in table.column_names:
        table = table.filter(pc.is_valid(table["op_id"]))
    rows = table.select(OP_COLUMNS).to_pylist()
    return sorted(rows, key=lambda r: (r["purgatory"], r["config_id"], r["op_id"]))


def test_replay_is_exact_and_the_same_everywhere(
    spark: SparkSession, work: Path, trace: str, replayed: tuple[str, str]
) -> None:
    table = pq.read_table(trace)
    plain = replay_table(table, dict(enumerate(CONFIGS)), check=True)
    expected = ops_of(plain)
    assert len(expected) == 2 * 6000
    one_partition = str(work / "replay-1")
    replay(spark, trace, one_partition, CONFIGS, partitions=1)
    plain_ops = spark.createDataFrame(plain.filter(pc.is_valid(plain["op_id"]))).select(OP_COLUMNS)
    gauges = [
        "purgatory",
        "config_id",
        "peak_watched",
        "peak_delayed",
        "timer_passes",
        "purges",
        "purged_entries",
        "attempts",
    ]
    plain_gauges = spark.createDataFrame(plain.filter(pc.is_null(plain["op_id"]))).select(gauges)
    for out in (replayed[0], one_partition):
        operations = spark.read.parquet(f"{out}/operations").select(OP_COLUMNS)
        assertDataFrameEqual(operations, plain_ops, rtol=0, atol=0)
        summary = spark.read.parquet(f"{out}/summary").select(gauges)
        assertDataFrameEqual(summary, plain_gauges, rtol=0, atol=0)

    # The outcome model, operation by operation.
    rows = {(r["purgatory"], r["op_id"]): r for r in table.to_pylist()}
    outcomes = {"completed": 0, "expired": 0}
    for op in expected:
        config = CONFIGS[op["config_id"]]
        row = rows[op["purgatory"], op["op_id"]]
        arrival = row["arrival"] / config.rate_scale
        assert op["watched_at"] == arrival
        timeout = row["timeout"] * config.timeout_scale
        assert op["deadline"] == arrival + timeout
        due = math.ceil(op["deadline"] / config.tick - 1e-6) * config.tick
        condition = row["condition_at"]
        if condition is not None and config.rate_scale != 1:
            condition = arrival + (condition - row["arrival"])
        outcomes[op["outcome"]] += 1
        if condition is not None and condition < due:
            assert op["outcome"] == "completed", op
            assert op["ended_at"] == max(condition, arrival)
        else:
            assert op["outcome"] == "expired", op
            assert op["ended_at"] == pytest.approx(due, abs=1e-9)
            assert op["ended_at"] >= op["deadline"] - 1e-9  # never before its deadline
    assert min(outcomes.values()) > 500, outcomes  # both outcomes well exercised


def test_event_log_analysed_equals_the_replay_summary(
    spark: SparkSession, work: Path, replayed: tuple[str, str]
) -> None:
    out, log = replayed
    mine = spark.read.parquet(f"{out}/summary")
    analysed = analyze(spark, log, str(work / "analysis"))
    # The replay's purgatory "p" of configuration 0 is "p@0" in its event log.
    named = F.concat_ws("@", "purgatory", F.col("config_id").cast("string")).alias("purgatory")
    shared = list(SHARED_SUMMARY_COLUMNS[1:])
    assertDataFrameEqual(
        analysed.select(*SHARED_SUMMARY_COLUMNS),
        mine.select(named, *shared),
        rtol=0,
        atol=0,
    )
    assert analysed.count() == 4
    keys = pq.read_table(str(work / "analysis" / "keys"))
    assert pc.sum(keys["operations"]).as_py() == 3 * 2 * 2 * 3000  # 3 keys per operation
    windows = pq.read_table(str(work / "analysis" / "windows"))
    expired = mine.agg(F.sum("expired")).first()
    assert expired is not None
    assert pc.sum(windows["expired"]).as_py() == expired[0]


def test_summary_from_the_tasks_equals_spark_over_the_operations(
    spark: SparkSession, work: Path, trace: str, replayed: tuple[str, str]
) -> None:
    """Each group's summary is computed inside its task; it equals Spark's aggregation of the
    operations' rows, and a replay without the rows writes the same summary."""
    from purgatory.pipeline._summary import outcome_summary

    out, _ = replayed
    by = ["purgatory", "config_id"]
    columns = [*by, *SHARED_SUMMARY_COLUMNS[1:-1], "expired_share"]  # (peak_delayed: a gauge)
    spark_side = outcome_summary(spark.read.parquet(f"{out}/operations"), by).select(columns)
    mine = spark.read.parquet(f"{out}/summary")
    assertDataFrameEqual(mine.select(columns), spark_side, rtol=0, atol=0)
    assert mine.where("expired = 0").count() == 0
    assert mine.count() == 4

    lean = work / "replay-summary-only"
    replay(spark, trace, str(lean), CONFIGS, operations=False)
    assert sorted(p.name for p in lean.iterdir() if not p.name.startswith(".")) == ["summary"]
    assertDataFrameEqual(spark.read.parquet(str(lean / "summary")), mine, rtol=0, atol=0)


def test_summary_only_from_the_command_line(
    work: Path, trace: str, replayed: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``replay --summary-only`` (the default grid is the first configuration) writes only the
    summary, the same as the full replay's."""
    out = work / "replay-cli-summary-only"
    assert main(["replay", "--trace", trace, "--out", str(out), "--summary-only"]) == 0
    assert "missed %" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["summary"]
    full = pq.read_table(f"{replayed[0]}/summary").to_pylist()
    assert pq.read_table(out / "summary").to_pylist() == [
        row for row in full if row["config_id"] == 0
    ]


@pytest.mark.parametrize("n", [1, 2, 3, 10, 99, 100, 101, 1000])
def test_task_percentiles_are_sparks_percentile_disc(spark: SparkSession, n: int) -> None:
    from array import array

    from purgatory.pipeline._replay import _percentiles

    values = [float((i * 7919) % 97) / 8 for i in range(n)]  # duplicates, out of order
    frame = spark.createDataFrame([(v,) for v in values], "v double")
    spark_row = frame.agg(
        F.expr("percentile_disc(0.5) WITHIN GROUP (ORDER BY v)"),
        F.expr("percentile_disc(0.99) WITHIN GROUP (ORDER BY v)"),
        F.max("v"),
    ).collect()[0]
    assert _percentiles(array("d", values)) == list(spark_row)
    assert _percentiles(array("d")) == [None, None, None]


def test_event_log_becomes_a_trace_that_replays_the_same(
    spark: SparkSession, work: Path, trace: str, replayed: tuple[str, str]
) -> None:
    recorded = str(work / "trace-from-log")
    assert trace_from_log(spark, replayed[1], recorded) == 4 * 3000
    table = pq.read_table(recorded)
    table = table.filter(pc.match_substring(table["purgatory"], "@0"))
    again = ops_of(replay_table(table, {0: CONFIGS[0]}))
    original = [
        {**op, "purgatory": f"{op['purgatory']}@0"}
        for op in ops_of(replay_table(pq.read_table(trace), {0: CONFIGS[0]}))
    ]
    assert again == original


# -- wall-clock time ---------------------------------------------------------------------------

NIGHT: Final = datetime(2026, 11, 24, 21, 0, 0, tzinfo=UTC)


def record_night(
    directory: Path,
    name: str,
    clock_start: float,
    *,
    anchored: bool = True,
    recorder: type[JsonLinesEventLog] | type[ArrowEventLog] = JsonLinesEventLog,
) -> JsonLinesEventLog | ArrowEventLog:
    """Ten operations, one a second from `NIGHT`, each completed half a second later, recorded
    by a host whose clock read `clock_start` at `NIGHT` (``time.time`` moved with it)."""
    now = [clock_start]
    wall = NIGHT.timestamp() - clock_start
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: wall + now[0])
        log = recorder(directory, buffer_lines=4, clock=(lambda: now[0]) if anchored else None)
        for i in range(10):
            op = FlagOperation(1.0)
            now[0] = clock_start + i
            log.record_watch(name, op, ("k",), None, now[0], now[0] + 1.0)
            now[0] += 0.5
            log.record_end(name, op, "completed", now[0])
        log.close()
    return log


def test_analyze_puts_two_hosts_on_utc_and_filters_a_utc_range(
    spark: SparkSession, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    assert record_night(logs / "a", "host-a", 1865.0).anchor_error is None
    record_night(logs / "b", "host-b", 52.25)  # another host, another boot
    record_night(logs / "c", "host-c", 7.0, recorder=ArrowEventLog)  # and the columnar format
    record_night(logs / "old", "unanchored", 3000.0, anchored=False)
    (logs / "old" / "v1.jsonl").write_text(  # a file of the first schema version
        '{"v":1,"purgatory":"v1","id":0,"keys":["k"],"thresholds":null,"watched_at":12.5,'
        '"timeout":1.0,"deadline":13.5,"outcome":"expired","ended_at":13.5}\n'
    )
    analyze(spark, str(logs), str(tmp_path / "all"), window=5.0)
    windows = pq.read_table(tmp_path / "all" / "windows").to_pylist()
    seen: dict[str, list[tuple[Any, ...]]] = {}
    for row in windows:
        seen.setdefault(row["purgatory"], []).append(
            (row["time_base"], row["window_start"], row["window_utc"], row["watched"])
        )
    night = NIGHT.timestamp()
    # Both hosts' windows are the same UTC windows, whatever their clocks read; written so that
    # a Parquet reader keeps the zone (not INT96, which reads back naive).
    kind = pq.read_schema(next((tmp_path / "all" / "windows").glob("*.parquet")))
    assert kind.field("window_utc").type == pa.timestamp("us", tz="UTC")
    expected = [
        ("utc", night, NIGHT, 5),
        ("utc", night + 5, NIGHT.replace(second=5), 5),
    ]
    assert seen["host-a"] == seen["host-b"] == seen["host-c"] == expected
    assert seen["unanchored"] == [("clock", 3000.0, None, 5), ("clock", 3005.0, None, 5)]
    assert seen["v1"] == [("clock", 10.0, None, 1)]

    with pytest.raises(TraceError, match=r"old/.*no UTC anchor"):
        analyze(spark, str(logs), str(tmp_path / "refused"), since=NIGHT)
    shutil.rmtree(logs / "old")
    summary = analyze(
        spark,
        str(logs),
        str(tmp_path / "range"),
        since=NIGHT + timedelta(seconds=2),
        until=datetime(2026, 11, 24, 21, 0, 7),  # naive: UTC
    )
    assert {row["purgatory"]: row["operations"] for row in summary.collect()} == {
        "host-a": 5,
        "host-b": 5,
        "host-c": 5,
    }

    recorded = str(tmp_path / "trace")
    assert trace_from_log(spark, str(logs / "a"), recorded) == 10
    (anchor,) = trace_anchors(spark.read.parquet(recorded))
    assert anchor["utc"] - anchor["clock"] == pytest.approx(night - 1865.0)


def log_line(op_id: int, **changes: Any) -> str:
    """An expired operation's event-log line (version 2), some fields replaced."""
    line = {
        "v": 2,
        "purgatory": "p",
        "id": op_id,
        "keys": ["k"],
        "watched_at": 1.0,
        "timeout": 1.0,
        "deadline": 2.0,
        "outcome": "expired",
        "ended_at": 2.0,
        **changes,
    }
    return json.dumps({k: v for k, v in line.items() if v is not None})


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (log_line(1)[:-9], "line 3: not JSON (Unterminated string starting at, column 126)"),
        (log_line(1, watched_at="soon"), "line 3: field 'watched_at' is not a number ('soon')"),
        (log_line(1, ended_at=None), "line 3: field 'ended_at' is missing (purgatory='p', id='1')"),
        (log_line(1, v=3), "line 3: field 'v' is not 1 or 2 (schema version)"),
    ],
)
def test_a_bad_event_log_line_is_named_by_file_and_line(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, said: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "good.jsonl").write_text("".join(log_line(i) + "\n" for i in range(3)))
    (logs / "bad.jsonl").write_text(f"{log_line(7)}\n\n{bad}\n{log_line(8)}\n")
    out = tmp_path / "out"
    assert main(["analyze", "--log", str(logs), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # before the job's result
    assert (
        captured.err.splitlines()
        == [f"purgatory.pipeline analyze: error: event log file file://{logs}/bad.jsonl: {said}"]
        or said in captured.err
    ), captured.err
    assert f"{logs}/bad.jsonl: {said}" in captured.err
    assert len(captured.err.splitlines()) == 1
    assert not out.exists()


def test_an_arrow_stream_that_is_not_an_event_log(spark: SparkSession, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    with pa.ipc.new_stream(logs / "other.arrows", pa.schema([("x", pa.int64())])) as writer:
        writer.write_table(pa.table({"x": [1, 2]}))
    (logs / "broken.arrows").write_bytes(b"\xff\xff\xff\xff" + b"\x00" * 12)
    with pytest.raises(TraceError) as error:
        load_event_log(spark, str(logs)).collect()
    message = str(error.value)
    assert re.fullmatch(
        r"event log file \S+/(broken\.arrows: unreadable Arrow stream \(.+\)|other\.arrows: "
        r"not an event-log Arrow stream of a known schema version \(its purgatory\.event_log "
        r"is 'missing'\))",
        message,
    ), message


@pytest.mark.parametrize("read", ["auto", "spark"])
def test_a_corrupted_parquet_page_is_named_not_replayed(
    tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str], read: str
) -> None:
    """2 KB of a page zeroed, and Hadoop's .crc side files gone (as after a copy by scp or to
    an object store): Spark reads such a page without a word unless told to check its CRC.
    The direct read (auto) names it as Spark's read does."""
    copy = tmp_path / "trace"
    shutil.copytree(trace, copy, ignore=shutil.ignore_patterns(".*"))
    file = sorted(copy.glob("part-*.parquet"))[0]
    data = bytearray(file.read_bytes())
    data[1000:3048] = bytes(2048)
    file.write_bytes(data)
    out = tmp_path / "out"
    assert main(["replay", "--trace", str(copy), "--out", str(out), "--read", read]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"purgatory.pipeline replay: error: trace file {file}: a Parquet page fails its "
        "checksum (the file is corrupted)"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"condition_at": None}, "missing column 'condition_at'"),
        ({"timeout": pa.array(["1", "2"])}, "column 'timeout' has type string"),
        ({"timeout": pa.array([1.0, -0.5])}, "op_id=1: column 'timeout' is negative"),
        ({"timeout": pa.array([math.inf, 1.0])}, "op_id=0: column 'timeout' is not finite"),
        # 2**53 ticks of 1 ms are 9e12 s: the purgatory would refuse it inside a Spark task.
        ({"timeout": pa.array([1e13, 1.0])}, "op_id=0: column 'timeout' is beyond the timer's"),
        ({"op_id": pa.array([3, 3], pa.int64())}, "duplicate op_id 3 in purgatory 'p'"),
        ({"condition_at": pa.array([0.25, 0.4])}, "op_id=1: column 'condition_at' is before"),
        ({"keys": pa.array([["a"], []], pa.list_(pa.string()))}, "column 'keys' is empty"),
        ({"note": pa.array(["x", "y"])}, r"unknown column 'note' \(a trace of schema version 1"),
    ],
)
def test_bad_trace_is_refused_naming_file_and_row(
    spark: SparkSession, tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    file = write_trace(tmp_path / "bad" / "part-0.parquet", **changes)
    out = tmp_path / "out"
    with pytest.raises(TraceError, match=message) as error:
        replay(spark, str(tmp_path / "bad"), str(out), CONFIGS[:1])
    assert "part-0.parquet" in str(error.value), file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # no output, no staging


@pytest.mark.parametrize(
    ("without", "first"),
    [
        ((), "row purgatory=None op_id=3: column 'purgatory' is null"),
        ((None,), "row purgatory='a' op_id=2: column 'keys' is empty"),
        ((None, "a", "b"), "duplicate op_id 4 in purgatory 'c' (2 rows;"),
    ],
    ids=["no-purgatory", "bad-rows", "duplicate"],
)
def test_a_bad_trace_is_reported_the_same_by_both_reads(
    spark: SparkSession, tmp_path: Path, without: tuple[str | None, ...], first: str
) -> None:
    """Bad rows in several purgatories and files, duplicate ids, a row without a purgatory:
    the direct read's tasks, each checking its own purgatories under two configurations,
    give the error Spark's validation of the whole trace gives, and write nothing; so does
    the split replay's direct read (its driver finds these)."""
    bad_trace(tmp_path / "bad", without)
    said = {}
    runs: list[tuple[Literal["spark", "direct"], int]] = [
        ("spark", 1),
        ("direct", 1),
        ("direct", 2),
    ]
    for read, shards in runs:
        out = str(tmp_path / f"{read}{shards}")
        with pytest.raises(TraceError) as error:
            replay(spark, str(tmp_path / "bad"), out, CONFIGS, read=read, shards=shards)
        said[(read, shards)] = str(error.value)
    assert said[("direct", 1)] == said[("spark", 1)] == said[("direct", 2)]
    assert first in said[("direct", 1)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # no output, no staging


def test_read_auto_says_when_it_reads_through_spark(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Where pyarrow has no filesystem for the trace's files, ``auto`` reads through Spark and
    says so on stderr; ``direct`` refuses, naming the file and why."""
    write_trace(tmp_path / "t" / "part-0.parquet")
    why = "pyarrow cannot open s3a://b/t/part-0.parquet: Unrecognized filesystem type in URI"
    monkeypatch.setattr(_job_replay, "direct_read_problem", lambda files: why)
    with pytest.raises(ValueError, match=re.escape(f"cannot be read directly: {why}")):
        replay(spark, str(tmp_path / "t"), str(tmp_path / "d"), CONFIGS[:1], read="direct")

    def not_direct(*args: object) -> None:
        raise AssertionError("the direct read ran")

    monkeypatch.setattr(_job_replay, "purgatory_counts", not_direct)
    summary = replay(spark, str(tmp_path / "t"), str(tmp_path / "a"), CONFIGS[:1], tasks=None)
    assert [row["operations"] for row in summary.collect()] == [2]
    assert capsys.readouterr().err == (
        f"replay: reading the trace through Spark, not directly: {why}\n"
    )


def test_a_bad_row_is_reported_before_a_duplicate_id(spark: SparkSession, tmp_path: Path) -> None:
    write_trace(tmp_path / "t" / "part-0.parquet", op_id=pa.array([0, 0], pa.int64()))
    other = pq.read_table(tmp_path / "t" / "part-0.parquet")
    bad = other.set_column(1, "op_id", pa.array([8, 9], pa.int64())).set_column(
        4, "timeout", pa.array([-1.0, -2.0])
    )
    pq.write_table(bad, tmp_path / "t" / "part-1.parquet")
    with pytest.raises(TraceError) as error:
        load_trace(spark, str(tmp_path / "t"))
    message = str(error.value)
    assert "part-1.parquet: row purgatory='p' op_id=8: column 'timeout' is negative" in message
    assert message.endswith("(arrival=0.0, timeout=-1.0, condition_at=0.25); 1+ more bad rows")
    assert "duplicate" not in message


@pytest.mark.parametrize("collide", [False, True], ids=["xxhash64", "every-hash-equal"])
def test_a_duplicate_id_is_named_with_its_files_and_a_hash_collision_is_not_one(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collide: bool
) -> None:
    if collide:  # every id shares one hash: each is a candidate, the exact check must clear it
        monkeypatch.setattr(_job_trace, "id_hash", lambda: F.lit(0).cast("long"))
    write_trace(tmp_path / "good" / "part-0.parquet", op_id=pa.array([0, 1], pa.int64()))
    first = pq.read_table(tmp_path / "good" / "part-0.parquet")
    other = first.set_column(0, "purgatory", pa.array(["q", "q"]))  # same ids, other purgatory
    pq.write_table(other, tmp_path / "good" / "part-1.parquet")
    loaded = load_trace(spark, str(tmp_path / "good"))
    assert loaded.columns == TRACE_SCHEMA.names
    assert [field.dataType.simpleString() for field in loaded.schema] == [
        "string",
        "bigint",
        "double",
        "array<string>",
        "double",
        "double",
    ]
    assert sorted((row["purgatory"], row["op_id"]) for row in loaded.collect()) == [
        ("p", 0),
        ("p", 1),
        ("q", 0),
        ("q", 1),
    ]

    shutil.copytree(tmp_path / "good", tmp_path / "dup")
    again = first.set_column(1, "op_id", pa.array([1, 7], pa.int64()))
    pq.write_table(again, tmp_path / "dup" / "part-2.parquet")
    with pytest.raises(TraceError) as error:
        load_trace(spark, str(tmp_path / "dup"))
    assert re.fullmatch(
        r"trace file \S+/dup/part-0\.parquet, \S+/dup/part-2\.parquet: duplicate op_id 1 in "
        r"purgatory 'p' \(2 rows; an operation id must be unique within its purgatory\)",
        str(error.value),
    ), error.value


def test_a_failed_job_leaves_no_output(spark: SparkSession, tmp_path: Path) -> None:
    out = tmp_path / "out"

    def failing_job() -> None:
        with atomic_output(spark, str(out), overwrite=False) as staging:
            spark.range(10).write.parquet(f"{staging}/part")
            raise RuntimeError("mid-job")

    with pytest.raises(RuntimeError, match="mid-job"):
        failing_job()
    assert list(tmp_path.iterdir()) == []
    with atomic_output(spark, str(out), overwrite=False) as staging:
        spark.range(10).write.parquet(staging)
    with (
        pytest.raises(FileExistsError, match="--overwrite"),
        atomic_output(spark, str(out), overwrite=False),
    ):
        pass


def test_missing_java_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert main(["generate", "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "Java not found" in err[0]


def test_a_local_session_binds_loopback_and_starts_no_ui(spark: SparkSession) -> None:
    """The tests' session is made by `get_session("local[2]")`, as the commands make theirs."""
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.bindAddress") == conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.ui.enabled") == "false"
    assert spark.sparkContext.uiWebUrl is None
    assert conf.get("spark.sql.shuffle.partitions") == "2"


def test_a_master_not_taken_is_said_with_who_chose_the_one_that_runs(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a process whose Spark session runs already (a notebook's, these tests'), a command's
    ``--master`` cannot be taken: said so naming the one that runs, nothing said if it is the
    same; under spark-submit, spark-submit chose it. The session keeps its log level (it was
    set to WARN, which let the JVM's warnings through to a user who had quieted it)."""
    from purgatory.pipeline._spark import get_session, quiet

    def level() -> str:
        log4j: Any = spark.sparkContext._jvm.org.apache.logging.log4j  # type: ignore[union-attr]
        return str(log4j.LogManager.getRootLogger().getLevel())

    def said() -> list[str]:
        return capsys.readouterr().err.splitlines()

    quiet(spark, "ERROR")  # (the tests' level: the CLI's tests set FATAL)
    assert get_session("local[2]", "same") is spark
    assert said() == []
    assert get_session("local[1]", "other") is spark
    assert said() == [
        "purgatory.pipeline: --master local[1] ignored: this process's Spark session runs "
        "on local[2]"
    ]
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    assert get_session("local[1]", "submitted") is spark
    assert said() == [
        "purgatory.pipeline: --master local[1] ignored: spark-submit chose the master"
    ]
    assert level() == "ERROR"  # (a session that ran already keeps its log level)


def test_a_rerun_group_publishes_its_event_log_once(tmp_path: Path) -> None:
    """Spark re-runs a failed task whole: the group's earlier files are replaced, not doubled."""
    w1 = W1(purgatories=1, operations=500, chunk=500)
    trace = pa.Table.from_batches([generate_chunk(w1, chunk) for chunk in chunk_plan(w1)])
    for _ in range(2):
        replay_table(trace, {0: CONFIGS[0]}, event_log_dir=str(tmp_path))
    files = list(tmp_path.glob("*.jsonl"))
    assert len(files) == 1
    assert len(files[0].read_text().splitlines()) == 500


# -- the data sources on a user's own session ---------------------------------------------------


def test_register_data_sources_refuses_workers_without_the_package(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A session built without ``PYSPARK_PYTHON`` runs its workers on the ``python3`` of PATH;
    outside the virtualenv, its first read used to fail in 40 lines of worker traceback. The
    tests' session, made to run the system's python3 (no purgatory, no pyarrow there), is
    refused at registration in one line that says the fix; with this interpreter it registers."""
    from purgatory.pipeline import _datasource, register_data_sources

    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None or os.path.realpath(system) == os.path.realpath(sys.executable):
        pytest.skip("no system python3 apart from the tests' interpreter")
    monkeypatch.chdir(tmp_path)  # (not the checkout, which `python -c` would import from)
    bare = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    assert run_process(system, "-c", "import purgatory", env=bare, timeout=60).returncode != 0
    monkeypatch.delitem(_datasource._REGISTERED, spark, raising=False)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", "python3")  # as without PYSPARK_PYTHON
    monkeypatch.setenv("PATH", f"/usr/bin:/bin:{os.environ['PATH']}")
    monkeypatch.delenv("PYTHONPATH", raising=False)  # (the tests' own path to the worktree)
    _datasource._import_problem.cache_clear()
    with pytest.raises(_datasource.WorkerPythonError) as refused:
        register_data_sources(spark)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "Spark's Python workers run python3 (ModuleNotFoundError: No module named 'purgatory')"
    )
    assert f"set PYSPARK_PYTHON={sys.executable} before the session is built" in message
    assert spark not in _datasource._REGISTERED
    monkeypatch.undo()  # the tests' PATH, PYTHONPATH and directory: this interpreter imports it
    _datasource._import_problem.cache_clear()
    monkeypatch.delitem(_datasource._REGISTERED, spark, raising=False)
    register_data_sources(spark)
    assert spark in _datasource._REGISTERED
