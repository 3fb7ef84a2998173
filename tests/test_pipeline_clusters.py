"""The pipeline beyond one process: a standalone cluster and a Spark Connect server.

Each is started once for this module, from the pyspark wheel's own scripts, as separate JVMs on
loopback: a standalone master with two one-core workers (``spark://``), then a Spark Connect
server (``sc://``). ``generate``, ``replay`` and ``analyze`` run as a user runs them, and must
give what the same jobs give on the tests' local[2] session: on the cluster, by the cluster
recipe (one ``spark-submit`` of the command line with the package zipped in ``--py-files``;
one driver for the three commands, which keeps the test to three JVMs); on Spark Connect,
``python -m purgatory.pipeline ... --master sc://...`` (and ``--remote sc://...``, as pyspark
takes it), each a client process without a JVM. On both, the data sources read as on local[2]
(``spark.read.format``), and ``analyze --follow`` killed mid-stream and started again gives the
windows of a batch ``analyze`` (``spark.readStream.format``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import FlagOperation, run_process
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual
from spark_support import (
    BASE_UTC,
    QUICK_JVM,
    connect_server,
    environment,
    follow_command,
    follow_killed_and_restarted,
    follow_logs,
    listening,
    loopback,
    pipeline,
    process_tree,
    record_at,
    spark_env,
    spark_submit,
    standalone_cluster,
    until,
)

from purgatory import ArrowEventLog, DelayedOperationPurgatory
from purgatory.pipeline import W1, ReplayConfig, analyze, generate, replay, replay_table
from purgatory.testing import ManualClock

W1_ARGS = ("--purgatories", "2", "--operations", "1500", "--chunk", "500", "--never", "0.05")
W1_SMALL = W1(purgatories=2, operations=1500, chunk=500, never=0.05)
TICKS = ("0.001", "0.05")
ANALYSES = ("summary", "keys", "windows", "waits")


@dataclass(frozen=True)
class Local:
    """The inputs, and what the jobs give on local[2]."""

    trace: Path
    logs: Path
    replayed: pa.Table
    analysed: dict[str, pa.Table]


@pytest.fixture(scope="module")
def local(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Local:
    work = tmp_path_factory.mktemp("local")
    generate(spark, W1_SMALL, str(work / "trace"))
    trace = pq.read_table(work / "trace")
    logs = work / "logs"
    replay_table(trace, {0: ReplayConfig()}, event_log_dir=str(logs))  # JSON Lines logs
    clock = ManualClock()
    log = ArrowEventLog(logs, clock=None)  # and an Arrow stream
    purgatory: DelayedOperationPurgatory[FlagOperation] = DelayedOperationPurgatory(
        "arrow", clock=clock, event_log=log
    )
    for i in range(5):
        purgatory.try_complete_else_watch(FlagOperation(0.5 + i), [f"k{i % 2}"])
    clock.advance(10.0)
    log.close()
    configs = [ReplayConfig(tick=float(tick)) for tick in TICKS]
    replay(spark, str(work / "trace"), str(work / "replay"), configs)
    analyze(spark, str(logs), str(work / "analysis"), window=1.0)
    return Local(
        work / "trace",
        logs,
        pq.read_table(work / "replay" / "summary"),
        {name: pq.read_table(work / "analysis" / name) for name in ANALYSES},
    )


@pytest.fixture(scope="module", params=["standalone", "connect"])
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    work = tmp_path_factory.mktemp(request.param)
    start = standalone_cluster if request.param == "standalone" else connect_server
    with start(work) as url:
        yield url


def test_generate_replay_and_analyze_give_the_local_result(
    master: str, local: Local, spark: SparkSession, tmp_path: Path
) -> None:
    commands = [  # relative outputs, as a user types them
        ["generate", "--out", "trace", *W1_ARGS],
        # (--verbose also says where the driver found the package.)
        ["replay", "--trace", str(local.trace), "--out", "replay", "--verbose"],
        ["analyze", "--log", str(local.logs), "--out", "analysis", "--window", "1"],
        # (Each purgatory in 2 time shards; on the standalone cluster with the executors'
        # first work done by a warm-up job while the driver plans: `_job_replay.warmed`.)
        ["replay", "--trace", str(local.trace), "--out", "split", "--shards", "2"],
    ]
    commands[1][5:5] = ["--tick", ",".join(TICKS)]
    commands[3][5:5] = ["--tick", ",".join(TICKS)]
    if master.startswith("sc://"):
        said = ""
        flags = ("--master", "--remote", "--master", "--master")
        for command, flag in zip(commands, flags, strict=True):
            done = pipeline(*command, flag, master, cwd=tmp_path)
            assert done.returncode == 0, done.stderr[-3000:]
            said += done.stdout
    else:
        done = spark_submit(master, commands, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        said = done.stdout
        assert "purgatory.zip" in said  # the driver imported the zipped package (--verbose)
        # Each of the replay's two tasks (4 groups over the 2 workers' cores) says where it ran
        # (on the driver's stderr, which spark-submit merges into its stdout).
        first = said[: said.index("replay in replay: ")]  # (the split replay's tasks follow)
        ran = [
            line.split(": ", 1)[1]
            for line in first.splitlines()
            if line.startswith("replay: task of partition")
        ]
        assert [line.split()[3] for line in ran] == ["0", "1"], said[-3000:]
        assert all("(Python worker " in line and "2 groups (" in line for line in ran)
    assert "replay in replay: 6,000 operations replayed" in said
    assert "analysis in analysis (" in said

    def frame(path: Path) -> Any:
        return spark.read.parquet(str(path))

    assertDataFrameEqual(frame(tmp_path / "trace"), frame(local.trace), rtol=0, atol=0)
    assert pq.read_table(tmp_path / "replay" / "summary").to_pylist() == local.replayed.to_pylist()
    assert pq.read_table(tmp_path / "split" / "summary").to_pylist() == local.replayed.to_pylist()
    assert not [*tmp_path.glob("*.warm-*"), *tmp_path.glob("*.staging-*")]  # (none left)
    for name in ANALYSES:
        mine, theirs = (
            frame(tmp_path / "analysis" / name),
            frame(local.logs.parent / "analysis" / name),
        )
        assert pq.read_table(tmp_path / "analysis" / name).schema == local.analysed[name].schema
        assertSchemaEqual(mine.schema, theirs.schema)
        assertDataFrameEqual(mine, theirs, rtol=0, atol=0)


#: What the data sources read, summed up by Spark where they ran: run as a script on a master
#: (argv: where, the events, the trace), it prints each summary's rows as a JSON line; the
#: test runs the same `summaries` on its local session.
SOURCES = """
import json, sys

from pyspark.sql import functions as F

from purgatory.pipeline import get_session, register_data_sources


def summaries(spark, events, trace):
    register_data_sources(spark)
    read = spark.read.format("purgatory-events").load(events)
    yield read.groupBy("purgatory", "outcome").agg(
        F.count(F.lit(1)).alias("n"),
        F.sum("watched_at").alias("watched"),
        F.sum("ended_at").alias("ended"),
        F.sum("utc_offset").alias("offsets"),
        F.unix_micros(F.min("watched_utc")).alias("first_utc"),
        F.sum(F.size("keys")).alias("keys"),
    )
    read = spark.read.format("purgatory-trace").load(trace)
    yield read.groupBy("purgatory").agg(
        F.count(F.lit(1)).alias("n"),
        F.sum("arrival").alias("arrivals"),
        F.sum(F.size("keys")).alias("keys"),
        F.count("condition_at").alias("conditions"),
    )


if __name__ == "__main__":
    where, events, trace = sys.argv[1:]
    spark = get_session(remote=where) if where.startswith("sc://") else get_session(where)
    for frame in summaries(spark, events, trace):
        print(json.dumps([row.asDict() for row in frame.collect()]))
"""


def test_the_data_sources_read_as_on_local(
    master: str, local: Local, spark: SparkSession, tmp_path: Path
) -> None:
    events = tmp_path / "events"
    record_at(events, "p", BASE_UTC, 30)
    record_at(events, "q", BASE_UTC, 20, recorder=ArrowEventLog)
    script = tmp_path / "sources.py"
    script.write_text(SOURCES)
    where = [master, str(events), str(local.trace)]
    done = run_process(sys.executable, script, *where, cwd=tmp_path, env=spark_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    read = [json.loads(line) for line in done.stdout.splitlines()[-2:]]
    namespace: dict[str, Any] = {}
    exec(compile(SOURCES, "sources.py", "exec"), namespace)
    for rows, mine in zip(read, namespace["summaries"](spark, *where[1:]), strict=True):
        # (Sums of doubles: added in another order on another partitioning.)
        assertDataFrameEqual(spark.createDataFrame(rows, mine.schema), mine, rtol=1e-12, atol=0)


def test_follow_killed_and_restarted_gives_the_batch_windows(
    master: str, spark: SparkSession, tmp_path: Path
) -> None:
    if master.startswith("sc://"):
        where = ["--remote", master]
    else:  # the driver here and the executors start as the other JVMs of the tests do
        where = ["--master", master, "--conf", "spark.executor.memory=512m"]
        for side in ("driver", "executor"):
            where += ["--conf", f"spark.{side}.extraJavaOptions={QUICK_JVM}"]
    follow_killed_and_restarted(spark, where, tmp_path)


def test_follow_prints_what_each_batch_read_and_the_windows_it_wrote(
    master: str, tmp_path: Path
) -> None:
    """The follow job's lines as a user reads them: on Spark Connect the progress reports come
    in another form (`_job_follow.progress_of`), and once said "0 operations read" of every
    batch and never printed a window."""
    events = tmp_path / "events"
    follow_logs(events, 0)  # (80 operations)
    command = ["analyze", "--follow", "--once", "--log", str(events), "--out", "live"]
    command += ["--checkpoint", "checkpoint", "--window", "1", "--watermark", "0"]
    if master.startswith("sc://"):
        done = pipeline(*command, "--remote", master, cwd=tmp_path)
    else:
        done = spark_submit(master, [command], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout
    read = re.findall(r"^batch \d+: ([\d,]+) operations read", said, re.M)
    assert sum(int(n.replace(",", "")) for n in read) == 80, said
    written = re.findall(r"^batch \d+: .*, (\d+) windows written", said, re.M)
    assert sum(map(int, written)) >= 10, said  # (10 s of operations, 1 s windows)
    assert said.count("purgatory         window (UTC)  watched") == len(written), said


@pytest.mark.parametrize("where", [["--master", "local[2]"], ["--remote", "local[2]"]])
def test_a_local_job_listens_on_loopback_only_and_stops_at_ctrl_c_in_one_line(
    where: list[str], tmp_path: Path
) -> None:
    """``analyze --follow`` on a driver started here, or a Spark Connect server started here:
    while it runs, every socket of its processes listens on loopback, none on the web UI's
    4040, and a Connect server's JVM has a token to demand of its clients; Ctrl-C, the documented
    way to stop it, ends it with one line (it printed 48 lines of Py4J traces before)."""
    log, out, checkpoint = tmp_path / "events", tmp_path / "live", tmp_path / "checkpoint"
    follow_logs(log, 0)
    said, errors = tmp_path / "follow.out", tmp_path / "follow.err"
    with said.open("w") as stdout, errors.open("w") as stderr:
        job = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "purgatory.pipeline",
                *follow_command(log, out, checkpoint),
                *where,
            ],
            cwd=tmp_path,
            env=spark_env(),
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            until(lambda: any((out / "windows").glob("batch-*.parquet")), job, said)
            sockets = listening(job.pid)
            java = [pid for pid in process_tree(job.pid) if is_jvm(pid)]
            tokens = [environment(pid).get("SPARK_CONNECT_AUTHENTICATE_TOKEN") for pid in java]
            job.send_signal(signal.SIGINT)
            job.wait(timeout=120)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(timeout=60)
    assert java, "no JVM below the job"
    assert sockets, "no listening socket found"
    assert all(loopback(address) for address, _ in sockets), sockets
    assert 4040 not in {port for _, port in sockets}, sockets
    if where[0] == "--remote":  # (the server's Python client sends it)
        assert all(token is not None and len(token) >= 32 for token in tokens), tokens
    assert job.returncode == 130, errors.read_text()[-3000:]
    assert errors.read_text() == "purgatory.pipeline analyze: error: interrupted\n"
    deadline = time.monotonic() + 60  # the JVM ends once the driver's pipe to it closes
    while any(running(pid) for pid in java) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in java if running(pid)], "a JVM outlived its job"


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (one its parent has not reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def is_jvm(pid: int) -> bool:
    """Whether process `pid` runs ``java`` itself: not the JDK's ``jspawnhelper``, through which
    the JVM starts its Python workers (its path names the JDK, and as it becomes the worker its
    environment is the worker's: a whole-suite run once read a Python worker's, without the
    token, for a JVM's)."""
    return Path(command_of(pid).split(b"\0")[0].decode(errors="replace")).name == "java"


def command_of(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
