"""The pipeline beyond one process: a standalone cluster and a Spark Connect server.

Each is started once for this module, from the pyspark wheel's own scripts, as separate JVMs on
loopback: a standalone master with two one-core workers (``spark://``), then a Spark Connect
server (``sc://``). ``generate``, ``replay`` and ``analyze`` run as a user runs them, and must
give what the same jobs give on the tests' local[2] session: on the cluster, by the cluster
recipe (one ``spark-submit`` of the command line with the package zipped in ``--py-files``;
one driver for the three commands, which keeps the test to three JVMs); on Spark Connect,
``python -m purgatory.pipeline ... --master sc://...``, each a client process without a JVM.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import FlagOperation
from pyspark.sql import SparkSession
from spark_support import connect_server, pipeline, spark_submit, standalone_cluster

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
    generated: pa.Table
    replayed: pa.Table
    analysed: dict[str, pa.Table]


def rows(path: Path, *order: str) -> list[dict[str, Any]]:
    """A Parquet directory's rows in a stable order (Spark's part files come in any)."""
    return sorted(pq.read_table(path).to_pylist(), key=lambda r: tuple(str(r[k]) for k in order))


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
        trace,
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


def sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def test_generate_replay_and_analyze_give_the_local_result(
    master: str, local: Local, tmp_path: Path
) -> None:
    commands = [  # relative outputs, as a user types them
        ["generate", "--out", "trace", *W1_ARGS],
        # (--verbose also says where the driver found the package.)
        ["replay", "--trace", str(local.trace), "--out", "replay", "--verbose"],
        ["analyze", "--log", str(local.logs), "--out", "analysis", "--window", "1"],
    ]
    commands[1][5:5] = ["--tick", ",".join(TICKS)]
    if master.startswith("sc://"):
        said = ""
        for command in commands:
            done = pipeline(*command, "--master", master, cwd=tmp_path)
            assert done.returncode == 0, done.stderr[-3000:]
            said += done.stdout
    else:
        done = spark_submit(master, commands, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        said = done.stdout
        assert "purgatory.zip" in said  # the driver imported the zipped package (--verbose)
    assert "replay in replay: 6,000 operations replayed" in said
    assert "analysis in analysis (" in said

    assert sorted_rows(pq.read_table(tmp_path / "trace")) == sorted_rows(local.generated)
    assert pq.read_table(tmp_path / "replay" / "summary").to_pylist() == local.replayed.to_pylist()
    for name in ANALYSES:
        mine = pq.read_table(tmp_path / "analysis" / name)
        assert mine.schema == local.analysed[name].schema, name
        assert sorted_rows(mine) == sorted_rows(local.analysed[name]), name
