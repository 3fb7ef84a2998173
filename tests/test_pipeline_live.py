"""The pipeline as a Spark citizen and live: the data sources, and ``analyze --follow``.

On the tests' local[2] session: ``spark.read.format("purgatory-events")`` reads both recorders'
formats into one row per operation with its UTC times, ``.part`` files only when asked;
``spark.readStream`` reads each published file once; ``purgatory-trace`` checks a trace file by
file as `load_trace` does; a drained operation is an outcome of its own. Then the follow job:
two ``--once`` runs give the windows of a batch ``analyze``, and a job killed mid-stream (a
process of its own) and started again loses and doubles nothing. Frames are compared with
``pyspark.testing``. (The same follow test on a standalone cluster and on Spark Connect:
test_pipeline_clusters.py.)
"""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import FlagOperation
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual
from spark_support import (
    BASE_UTC,
    follow_killed_and_restarted,
    record_at,
    write_trace,
)

from purgatory import ArrowEventLog, DelayedOperationPurgatory, JsonLinesEventLog
from purgatory.pipeline import (
    TraceError,
    load_event_log,
    load_trace,
    register_data_sources,
)
from purgatory.pipeline._eventfile import event_batches
from purgatory.pipeline._frames import task_errors
from purgatory.pipeline._job_follow import follow, progress_of
from purgatory.pipeline._tracefile import trace_batches
from purgatory.testing import ManualClock

EVENTS_SCHEMA = T.StructType(
    [
        T.StructField("v", T.IntegerType()),
        T.StructField("purgatory", T.StringType()),
        T.StructField("id", T.StringType()),
        T.StructField("keys", T.ArrayType(T.StringType())),
        T.StructField("thresholds", T.StringType()),
        T.StructField("watched_at", T.DoubleType()),
        T.StructField("timeout", T.DoubleType()),
        T.StructField("deadline", T.DoubleType()),
        T.StructField("outcome", T.StringType()),
        T.StructField("ended_at", T.DoubleType()),
        T.StructField("fields", T.StringType()),
        T.StructField("utc_offset", T.DoubleType()),
        T.StructField("watched_utc", T.TimestampType()),
        T.StructField("deadline_utc", T.TimestampType()),
        T.StructField("ended_utc", T.TimestampType()),
        T.StructField("file", T.StringType()),
    ]
)


def utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)


def recorded(
    directory: Path, recorder: type[JsonLinesEventLog] | type[ArrowEventLog], name: str
) -> None:
    """Three operations of purgatory `name` on a manual clock (no anchor): one completed with
    fields and thresholds, one expired, one still open when the recorder closes."""
    clock = ManualClock()
    log = recorder(directory, clock=None, fields=lambda op: {"request": op.name})
    purgatory: DelayedOperationPurgatory[FlagOperation] = DelayedOperationPurgatory(
        name, clock=clock, event_log=log
    )
    done, late, waiting = FlagOperation(5.0, "a"), FlagOperation(1.0, "b"), FlagOperation(60, "c")
    purgatory.try_complete_else_watch(done, ["x", "y"])
    purgatory.try_complete_else_watch(late, ["y"])
    purgatory.try_complete_else_watch(waiting, {"z": 3})
    clock.advance(2.0)
    done.ready = True
    purgatory.check_and_complete("x")
    log.close()


def test_events_source_reads_both_formats_one_row_per_operation(
    spark: SparkSession, tmp_path: Path
) -> None:
    recorded(tmp_path / "json", JsonLinesEventLog, "j")
    recorded(tmp_path / "arrow", ArrowEventLog, "a")
    record_at(tmp_path / "utc", "u", BASE_UTC, 2)
    register_data_sources(spark)
    frame = spark.read.format("purgatory-events").load(str(tmp_path))
    assertSchemaEqual(frame.schema, EVENTS_SCHEMA)
    rows: list[dict[str, Any]] = []
    unanchored = {"utc_offset": None, "watched_utc": None, "deadline_utc": None, "ended_utc": None}
    for name, folder in (("j", "json"), ("a", "arrow")):
        (file,) = (tmp_path / folder).iterdir()
        common = {"v": 2, "purgatory": name, "file": f"{tmp_path}/{folder}/{file.name}"}
        # (id, keys, thresholds, timeout, outcome, ended_at, fields): all watched at 0.
        for ident, keys, thresholds, timeout, outcome, ended, request in (
            ("1", ["y"], None, 1.0, "expired", 2.0, "b"),  # by the pass when the clock moved
            ("0", ["x", "y"], None, 5.0, "completed", 2.0, "a"),
            ("2", ["z"], "[3]", 60.0, "open", None, "c"),
        ):
            rows.append(
                common
                | unanchored
                | {"id": ident, "keys": keys, "thresholds": thresholds, "watched_at": 0.0}
                | {"timeout": timeout, "deadline": timeout, "outcome": outcome}
                | {"ended_at": ended, "fields": f'{{"request":"{request}"}}'}
            )
    offset = BASE_UTC - 1000.0
    (file,) = (tmp_path / "utc").iterdir()
    for i in range(2):  # both completed 0.1 s after their watch
        watched = 1000.0 + 0.25 * i
        rows.append(
            {"v": 2, "purgatory": "u", "id": str(i), "keys": [f"k{i}"], "thresholds": None}
            | {"watched_at": watched, "timeout": 0.5, "deadline": watched + 0.5}
            | {"outcome": "completed", "ended_at": watched + 0.1, "fields": None}
            | {"utc_offset": offset, "watched_utc": utc(watched + offset)}
            | {
                "deadline_utc": utc(watched + 0.5 + offset),
                "ended_utc": utc(watched + 0.1 + offset),
            }
            | {"file": f"{tmp_path}/utc/{file.name}"}
        )
    assertDataFrameEqual(frame, spark.createDataFrame(rows, EVENTS_SCHEMA), rtol=0, atol=0)
    # The anchors, for a trace's metadata: one per file that has one.
    anchors = spark.read.format("purgatory-events").option("anchors", "true").load(str(tmp_path))
    ((clock, utc_time),) = anchors.select("clock", "utc").collect()
    assert utc_time - clock == pytest.approx(offset)


def test_part_files_are_read_only_when_asked_and_only_what_is_whole(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A killed recorder's ``.part`` files: a JSON Lines file cut inside its last line, an Arrow
    stream cut inside its last batch. The reader keeps the whole lines and batches."""
    for recorder in (JsonLinesEventLog, ArrowEventLog):
        clock = ManualClock()
        log = recorder(tmp_path, buffer_lines=2, clock=None)
        purgatory: DelayedOperationPurgatory[FlagOperation] = DelayedOperationPurgatory(
            recorder.__name__, clock=clock, event_log=log
        )
        for i in range(5):
            purgatory.try_complete_else_watch(FlagOperation(0.1), [str(i)])
        clock.advance(0.1)  # five expire: two batches of two written, one pending
    for part in tmp_path.glob("*.part"):
        part.write_bytes(part.read_bytes()[:-10])
    register_data_sources(spark)
    reader = spark.read.format("purgatory-events")
    assert reader.load(str(tmp_path)).count() == 0
    found = reader.option("includePartFiles", "true").load(str(tmp_path))
    counts = {
        row["purgatory"]: row["count"] for row in found.groupBy("purgatory").count().collect()
    }
    assert counts == {"JsonLinesEventLog": 3, "ArrowEventLog": 2}


def test_a_stream_reads_each_published_file_once(spark: SparkSession, tmp_path: Path) -> None:
    log = tmp_path / "events"
    register_data_sources(spark)

    def run() -> None:
        query = (
            spark.readStream.format("purgatory-events")
            .load(str(log))
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "copy"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    record_at(log, "a", BASE_UTC, 10)
    run()
    record_at(log, "b", BASE_UTC, 5, recorder=ArrowEventLog)
    (log / "b-still-being-written.jsonl.part").write_text("{not even JSON\n")
    run()
    streamed = spark.read.parquet(str(tmp_path / "copy"))
    assertDataFrameEqual(streamed, load_event_log(spark, str(log)), rtol=0, atol=0)
    assert streamed.count() == 15


def test_a_bad_line_is_one_line_naming_file_and_line(spark: SparkSession, tmp_path: Path) -> None:
    record_at(tmp_path, "good", BASE_UTC, 3)
    line = {"v": 2, "purgatory": "p", "id": 7, "keys": ["k"], "watched_at": 1.0}
    (tmp_path / "bad.jsonl").write_text(
        json.dumps({**line, "deadline": 2.0, "outcome": "expired", "ended_at": 2.0})
        + "\n"
        + json.dumps({**line, "deadline": 2.0, "outcome": "vanished", "ended_at": 2.0})
        + "\n"
    )
    register_data_sources(spark)
    with pytest.raises(TraceError) as error, task_errors():
        spark.read.format("purgatory-events").load(str(tmp_path)).count()
    assert str(error.value) == (
        f"event log file {tmp_path}/bad.jsonl: line 2: field 'outcome' is not a known outcome "
        "('vanished'; known: completed, expired, cancelled, drained, refused, open, watched) "
        "(purgatory='p', id='7')"
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"v":2,"purgatory":"p"', "line 2: not JSON (Expecting ',' delimiter, column 23)"),
        ("[1, 2]", "line 2: not a JSON object (a JSON list)"),
        ('{"v":true}', "line 2: field 'v' is not an integer (True)"),
        ('{"v":3,"anchor":{"clock":1,"utc":2}}', "line 2: field 'v' is not 1 or 2"),
        ('{"v":2,"anchor":{"clock":1}}', "line 2: anchor without 'clock' and 'utc'"),
        ('{"v":2,"anchor":[1,2]}', "line 2: field 'anchor' is not an object of two numbers"),
        ('{"v":2,"purgatory":"p","keys":"k"}', "line 2: field 'keys' is not a list ('k')"),
        ('{"v":2,"purgatory":"p","id":1}', "line 2: field 'watched_at' is missing"),
        (
            '{"v":2,"purgatory":"p","id":1,"watched_at":0,"deadline":1,"outcome":"expired"}',
            "line 2: field 'ended_at' is missing (purgatory='p', id='1')",
        ),
    ],
)
def test_what_is_wrong_with_a_line(text: str, said: str) -> None:
    """The reader alone (what each Spark task runs): the first bad line, named."""
    anchor = '{"v":2,"anchor":{"clock":0,"utc":1}}\n'
    with pytest.raises(TraceError) as error:
        list(event_batches("x.jsonl", io.BytesIO((anchor + text + "\n").encode())))
    assert str(error.value).startswith(f"event log file x.jsonl: {said}"), error.value


def test_non_finite_numbers_and_blank_lines_read_as_the_recorder_wrote_them() -> None:
    lines = (
        '{"v":2,"purgatory":"p","id":"a","keys":["k",1],"thresholds":["Infinity"],'
        '"watched_at":0,"timeout":"Infinity","deadline":"Infinity","outcome":"open",'
        '"ended_at":null}\n\n\r\n'
    )
    (batch,) = event_batches("x.jsonl", io.BytesIO(lines.encode()))
    (row,) = batch.to_pylist()
    assert row["keys"] == ["k", "1"]
    assert row["thresholds"] == '["Infinity"]'
    assert math.isinf(row["timeout"])
    assert row["utc_offset"] is None


@pytest.mark.parametrize("recorder", [JsonLinesEventLog, ArrowEventLog])
def test_watch_records_are_read_only_when_asked(
    tmp_path: Path, recorder: type[JsonLinesEventLog] | type[ArrowEventLog]
) -> None:
    """A log with watch records reads as one without them (one row per operation) unless the
    reader asks for them (``watchRecords``: `event_batches`' `watches`)."""
    log = recorder(tmp_path, watch_records=True, clock=None)
    ops = [FlagOperation(1.0) for _ in range(3)]
    for i, op in enumerate(ops):
        log.record_watch("p", op, ("k",), None, float(i), i + 1.0)
    log.record_end("p", ops[0], "completed", 0.5)
    log.close()  # ops 1 and 2: open
    (path,) = [p for p in tmp_path.iterdir() if not p.name.endswith(".part")]

    def outcomes(watches: bool) -> list[tuple[str, str]]:
        with path.open("rb") as source:
            batches = event_batches(path.name, source, watches=watches)
            return [(row["id"], row["outcome"]) for b in batches for row in b.to_pylist()]

    assert outcomes(False) == [("0", "completed"), ("1", "open"), ("2", "open")]
    assert outcomes(True) == [
        ("0", "watched"),
        ("1", "watched"),
        ("2", "watched"),
        ("0", "completed"),
        ("1", "open"),
        ("2", "open"),
    ]


def test_trace_source_reads_what_load_trace_reads_and_refuses_the_same(
    spark: SparkSession, tmp_path: Path
) -> None:
    good = write_trace(tmp_path / "good" / "part-0.parquet", keys=pa.array([[1], [2, 3]]))
    register_data_sources(spark)
    frame = spark.read.format("purgatory-trace").load(str(good.parent))
    assertDataFrameEqual(frame, load_trace(spark, str(good.parent)), rtol=0, atol=0)
    assert [row["keys"] for row in frame.orderBy("op_id").collect()] == [["1"], ["2", "3"]]
    bad = write_trace(tmp_path / "bad" / "part-0.parquet", timeout=pa.array([1.0, -0.5]))
    with pytest.raises(TraceError) as theirs:
        load_trace(spark, str(bad.parent))
    with pytest.raises(TraceError) as mine, task_errors():
        spark.read.format("purgatory-trace").load(str(bad.parent)).collect()
    assert str(mine.value) == str(theirs.value).replace(f"file://{bad}", str(bad))


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"note": pa.array(["x", "y"])}, "unknown column 'note' (a trace of schema version 1"),
        ({"timeout": pa.array(["1", "2"])}, "column 'timeout' has type string, expected a"),
        ({"timeout": pa.array([1.0, -0.5])}, "op_id=1: column 'timeout' is negative"),
        ({"arrival": pa.array([math.nan, 0.5])}, "op_id=0: column 'arrival' is not finite"),
        ({"condition_at": pa.array([0.25, 0.4])}, "op_id=1: column 'condition_at' is before"),
        ({"keys": pa.array([["a"], []], pa.list_(pa.string()))}, "op_id=1: column 'keys' is empty"),
        (
            {"keys": pa.array([["a"], ["b", None]], pa.list_(pa.string()))},
            "op_id=1: column 'keys' holds a null key",
        ),
        (
            {"timeout": pa.array([-1.0, -2.0])},
            "op_id=0: column 'timeout' is negative (arrival=0.0, timeout=-1.0, "
            "condition_at=0.25); 1 more bad row in this file",
        ),
    ],
)
def test_what_is_wrong_with_a_trace_file(
    tmp_path: Path, changes: dict[str, Any], said: str
) -> None:
    """The trace reader alone (what each Spark task runs), in load_trace's words."""
    file = write_trace(tmp_path / "part-0.parquet", **changes)
    with pytest.raises(TraceError) as error, file.open("rb") as source:
        list(trace_batches("t.parquet", source))
    assert said in str(error.value)
    assert str(error.value).startswith("trace file t.parquet: ")


def test_a_corrupted_trace_page_is_named(spark: SparkSession, tmp_path: Path) -> None:
    table = pa.table({"purgatory": ["p"] * 2000, "op_id": list(range(2000)),
                      "arrival": [float(i) for i in range(2000)], "keys": [["k"]] * 2000,
                      "timeout": [1.0] * 2000, "condition_at": [None] * 2000})  # fmt: skip
    file = tmp_path / "part-0.parquet"
    pq.write_table(table, file, write_page_checksum=True)
    data = bytearray(file.read_bytes())
    data[200:300] = bytes(100)
    file.write_bytes(data)
    register_data_sources(spark)
    with pytest.raises(TraceError) as error, task_errors():
        spark.read.format("purgatory-trace").load(str(tmp_path)).collect()
    assert str(error.value).startswith(f"trace file {file}: "), error.value
    assert "corrupted" in str(error.value) or "unreadable" in str(error.value)


# -- analyze --follow -----------------------------------------------------------------------


def test_follow_killed_mid_stream_and_restarted_loses_and_doubles_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    follow_killed_and_restarted(spark, ["--master", "local[2]"], tmp_path)


def test_a_spark_connect_progress_reads_as_a_classic_one() -> None:
    """A Spark Connect client's progress of a micro-batch: no ``numInputRows`` of its own, its
    observed metrics as values and a schema. Read as the classic form, it says what was read
    and what was observed by name (a classic progress passes unchanged)."""
    fields = [{"name": "records", "type": "long"}, {"name": "watches", "type": "long"}]
    schema = {"type": "struct", "fields": fields}
    connect = {
        "batchId": 0,
        "sources": [{"numInputRows": 12}, {"numInputRows": 3}],
        "observedMetrics": {"input": {"values": [12, 0], "schema": schema}},
    }
    classic = {
        "batchId": 0,
        "numInputRows": 15,
        "sources": connect["sources"],
        "observedMetrics": {"input": {"records": 12, "watches": 0}},
    }
    assert progress_of(connect) == classic
    assert progress_of(classic) == classic


def test_follow_refuses_a_log_without_a_utc_anchor(spark: SparkSession, tmp_path: Path) -> None:
    recorded(tmp_path / "events", JsonLinesEventLog, "p")
    with pytest.raises(TraceError, match=r"events/.*\.jsonl: no UTC anchor"):
        follow(spark, str(tmp_path / "events"), str(tmp_path / "o"), str(tmp_path / "c"), once=True)
