"""``analyze --follow --stuck``: operations watched whose end never came, reported live.

On the tests' local[2] session, with event logs written by real purgatories (recorders with
``watch_records=True``) into one directory: a server in a process of its own killed while
operations wait; a recorder made to lose some end records; a clean purgatory, which must report
nothing; a host whose recorder is driven at known times. One job (``--once`` from the command
line) reads them; then, its last batch's commit removed as a kill between the batch's write and
its commit leaves it, more records come and the job is started again from its checkpoint: no
report lost or doubled, and an end that came after its report is said once, as late. The two
runs are shared by the tests of this module (`scenario`): two runs of a streaming job are most
of their time.

Deterministic: the reports are driven by event time (each record's own time and the watermark
it moves), never by the wall clock; recordings at known later UTC times move the watermark
past every deadline plus the grace (`advance`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import FlagOperation
from pyspark.sql import SparkSession
from spark_support import record_at, spark_env

from purgatory import ArrowEventLog, DelayedOperationPurgatory, JsonLinesEventLog
from purgatory.pipeline import analyze
from purgatory.pipeline._cli import main
from purgatory.pipeline._job_follow import follow

#: The settings of every job here: a grace of 2 s (far above what a real purgatory's expiries
#: are late by, even on a loaded machine), the watermark 4 s behind the newest record.
GRACE, WATERMARK, WINDOW = 2.0, 4.0, 2.0

SERVER = textwrap.dedent(
    """
    import asyncio, sys
    from purgatory import DelayedOperationPurgatory, JsonLinesEventLog
    sys.path.insert(0, sys.argv[2])
    from helpers import FlagOperation

    async def main() -> None:
        log = JsonLinesEventLog(sys.argv[1], prefix="server", watch_records=True, max_bytes=1)
        purgatory = DelayedOperationPurgatory("server", event_log=log)
        ops = [FlagOperation(0.05 if i < 4 else 30.0, f"op{i}") for i in range(8)]
        for i, op in enumerate(ops):
            purgatory.try_complete_else_watch(op, [f"k{i % 2}", "all"])
        ops[0].ready = ops[1].ready = True
        purgatory.check_and_complete("k0")
        purgatory.check_and_complete("k1")
        while not (ops[2].is_expired and ops[3].is_expired):  # 4 to 7 wait 30 s
            await asyncio.sleep(0.01)
        log.flush()  # (a server publishes what it has, as a periodic flush would)
        print("ready", flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def killed_server(events: Path) -> None:
    """A server (a real purgatory in a process of its own) killed (SIGKILL) while four of its
    operations wait (ids 4 to 7, 30 s timeouts): only their watch records were published."""
    tests = Path(__file__).parent
    with subprocess.Popen(
        [sys.executable, "-c", SERVER, str(events), str(tests)],
        stdout=subprocess.PIPE,
        text=True,
        env=spark_env(),
        start_new_session=True,
    ) as server:
        try:
            assert server.stdout is not None
            assert server.stdout.readline().strip() == "ready"
        finally:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


class DroppingEnds:
    """An `EventLog` that loses the end records of the operations `lose` picks (a lost
    wake-up's trace, or a recorder's bug): their watch records still go out."""

    def __init__(self, log: JsonLinesEventLog, lose: Callable[[Any], bool]) -> None:
        self.log = log
        self.lose = lose

    def record_watch(  # noqa: PLR0917 - the EventLog protocol's signature
        self,
        purgatory: str,
        op: Any,
        keys: tuple[Hashable, ...],
        thresholds: tuple[Any, ...] | None,
        watched_at: float,
        deadline: float,
    ) -> None:
        self.log.record_watch(purgatory, op, keys, thresholds, watched_at, deadline)

    def record_end(self, purgatory: str, op: Any, outcome: Any, ended_at: float) -> None:
        if not self.lose(op):
            self.log.record_end(purgatory, op, outcome, ended_at)

    def flush(self) -> None:
        self.log.flush()


async def six_operations(name: str, event_log: Any) -> None:
    """Six operations of 50 ms in a real purgatory: the even ones completed, the odd ones
    expired; the purgatory shut down once they all ended."""
    purgatory = DelayedOperationPurgatory[FlagOperation](name, event_log=event_log)
    ops = [FlagOperation(0.05, f"op{i}") for i in range(6)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [f"k{i}"])
    for i in (0, 2, 4):
        ops[i].ready = True
        purgatory.check_and_complete(f"k{i}")
    while not all(op.is_completed for op in ops):  # (the odd ones expire)
        await asyncio.sleep(0.01)
    await purgatory.shutdown()


def dropping_and_clean(events: Path) -> None:
    """Purgatory ``dropping`` loses the ends of op1 (expired) and op4 (completed); its recorder
    is closed with them open (``open`` records: no end either). Purgatory ``clean`` (an Arrow
    recorder) records every end."""
    inner = JsonLinesEventLog(events, prefix="dropping", watch_records=True)
    lossy = DroppingEnds(inner, lambda op: op.name in ("op1", "op4"))
    asyncio.run(six_operations("dropping", lossy))
    inner.close()
    clean = ArrowEventLog(events, prefix="clean", watch_records=True)
    asyncio.run(six_operations("clean", clean))
    clean.close()


def advance(events: Path, utc: float) -> None:
    """Records at `utc` (a host's heartbeat of operations): the watermark moves past it - 4 s."""
    record_at(events, "heartbeat", utc, 2)


class Controlled:
    """A recorder with watch records driven at known times: a host whose clock read 1000 when
    UTC was `utc` (``time.time`` patched by `monkeypatch`); every watch has a 1 s timeout."""

    def __init__(self, events: Path, utc: float, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        self.ops: dict[int, FlagOperation] = {}
        monkeypatch.setattr(time, "time", lambda: utc - 1000.0 + self.now)
        self.log = JsonLinesEventLog(
            events,
            prefix="controlled",
            watch_records=True,
            clock=lambda: self.now,
            op_id=lambda op: op.name,  # (the ids given here, not a counter in watch order)
        )

    def watch(self, ident: int, at: float) -> None:
        self.now = 1000.0 + at
        self.ops[ident] = op = FlagOperation(1.0, str(ident))
        self.log.record_watch("ctl", op, (f"k{ident}",), None, self.now, self.now + 1.0)

    def end(self, ident: int, at: float) -> None:
        self.now = 1000.0 + at
        self.log.record_end("ctl", self.ops.pop(ident), "completed", self.now)


#: The controlled host's UTC time at its clock's 1000 (2027-01-15 08:00:00): after every real
#: recording of the tests, so its records move the watermark past theirs.
BASE = 1_800_000_000.0


@dataclass
class Scenario:
    said: str
    """What the first run (the command line) printed."""
    first: list[dict[str, Any]]
    """The reports the first run wrote (read back from its files)."""
    second: list[dict[str, Any]]
    """The reports the second run's batches wrote (the re-run batch's included)."""
    written: list[tuple[str, str, str]]
    """Every report in ``stuck/`` at the end, as (purgatory, id, status), sorted."""
    rows: list[dict[str, Any]]
    """Every report in ``stuck/`` at the end."""
    batch: list[dict[str, Any]]
    """What a batch ``analyze --stuck`` of the same files reports."""


def batch_stuck(spark: SparkSession, events: Path, out: Path) -> list[dict[str, Any]]:
    """``analyze --stuck`` of `events` into `out` with this module's settings: its reports."""
    analyze(
        spark, str(events), str(out), window=WINDOW, stuck=True, grace=GRACE, watermark=WATERMARK
    )
    return reports(spark, out)


def follow_stuck(
    spark: SparkSession,
    events: Path,
    out: Path,
    checkpoint: Path,
    reported: Callable[[list[dict[str, Any]]], None] | None = None,
) -> None:
    """A ``--once`` follow job of `events` with ``--stuck`` and this module's settings, each
    micro-batch's reports given to `reported`."""
    follow(
        spark,
        str(events),
        str(out),
        str(checkpoint),
        window=WINDOW,
        watermark=WATERMARK,
        once=True,
        poll=0.2,
        stuck=True,
        grace=GRACE,
        report_stuck=None if reported is None else lambda _progress, rows: reported(rows or []),
    )


def reports(spark: SparkSession, out: Path) -> list[dict[str, Any]]:
    if not (out / "stuck").exists():
        return []
    return [row.asDict() for row in spark.read.parquet(str(out / "stuck")).collect()]


@pytest.fixture(scope="module")
def scenario(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    work = tmp_path_factory.mktemp("stuck")
    events, out, checkpoint = work / "events", work / "live", work / "checkpoint"
    killed_server(events)
    dropping_and_clean(events)
    with pytest.MonkeyPatch.context() as monkeypatch:
        host = Controlled(events, BASE, monkeypatch)
        for i in range(4):
            host.watch(i, i * 0.1)
        host.watch(5, 0.05)
        host.end(0, 0.5)
        host.end(1, 0.6)
        host.end(5, 4.0)  # 2.95 s after its deadline: past the grace, read before the report
        host.log.flush()
        advance(events, BASE + 10)
        said, complained = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(complained):
            code = main(
                [
                    *("analyze", "--follow", "--once", "--stuck", "--grace", str(GRACE)),
                    *("--log", str(events), "--out", str(out), "--checkpoint", str(checkpoint)),
                    *("--window", str(WINDOW), "--watermark", str(WATERMARK)),
                    *("--interval", "1", "--master", "local[2]"),
                ]
            )
        assert code == 0, said.getvalue()
        # Nothing on stderr: not the stateful query's driver worker's start-up lines, nor a
        # word on --master (the tests' session runs on it already).
        assert complained.getvalue() == ""
        first = reports(spark, out)
        commits = sorted(
            (p for p in (checkpoint / "stuck" / "commits").iterdir() if p.name.isdigit()),
            key=lambda p: int(p.name),
        )
        # The last batch (which reported) wrote its file, then was killed before its commit.
        commits[-1].unlink()
        commits[-1].with_name(f".{commits[-1].name}.crc").unlink(missing_ok=True)
        host.end(2, 20.0)
        host.watch(4, 20.0)
        host.log.flush()
        advance(events, BASE + 30)
        second: list[dict[str, Any]] = []
        follow_stuck(spark, events, out, checkpoint, second.extend)
    rows = reports(spark, out)
    written = sorted((row["purgatory"], row["id"], row["status"]) for row in rows)
    complained = io.StringIO()
    with contextlib.redirect_stderr(complained):
        batch = batch_stuck(spark, events, work / "batch")
    assert complained.getvalue() == ""  # (watch records were read)
    return Scenario(said.getvalue(), first, second, written, rows, batch)


def ids(scenario: Scenario, purgatory: str) -> list[tuple[str, str]]:
    return [(i, status) for name, i, status in scenario.written if name == purgatory]


def test_a_killed_servers_waiting_operations_are_reported(scenario: Scenario) -> None:
    """Ops 4 to 7 waited (30 s) when the server was killed; 0 and 1 completed, 2 and 3 expired
    before it: only the four are reported, each once, with their keys and deadlines."""
    assert ids(scenario, "server") == [(str(i), "stuck") for i in range(4, 8)]
    for row in scenario.rows:
        if row["purgatory"] != "server":
            continue
        assert row["keys"] == [f"k{int(row['id']) % 2}", "all"]
        assert row["recorder"].startswith("server-")
        waited = (row["deadline_utc"] - row["watched_utc"]).total_seconds()
        assert waited == pytest.approx(30.0, abs=0.002)
        # Reported once the watermark (the newest record read - 4 s) passed deadline + grace.
        assert row["overdue_seconds"] >= GRACE
        overdue = (row["reported_utc"] - row["deadline_utc"]).total_seconds()
        assert row["overdue_seconds"] == pytest.approx(overdue, abs=0.001)
        assert row["grace_seconds"] == GRACE
        assert row["outcome"] is None
        assert row["ended_utc"] is None
        assert row["window_start"] % WINDOW == 0
        assert 0 <= row["deadline_utc"].timestamp() - row["window_start"] < WINDOW


def test_operations_whose_end_records_were_lost_are_reported(scenario: Scenario) -> None:
    """op1 (expired) and op4 (completed) lost their end records: reported, and their ``open``
    records (the recorder closed with them pending) did not end them."""
    assert ids(scenario, "dropping") == [("1", "stuck"), ("4", "stuck")]
    assert [row["keys"] for row in scenario.rows if row["purgatory"] == "dropping"] in (
        [["k1"], ["k4"]],
        [["k4"], ["k1"]],
    )


def test_a_clean_run_reports_nothing(scenario: Scenario) -> None:
    """Every end recorded (an Arrow recorder), and the heartbeats (no watch records): none."""
    assert ids(scenario, "clean") == []
    assert ids(scenario, "heartbeat") == []
    assert {name for name, _, _ in scenario.written} == {"server", "dropping", "ctl"}


def test_the_command_line_prints_each_report(scenario: Scenario) -> None:
    """The first run's reports, as the command line printed them: one table row each."""
    said = scenario.said
    assert "9 reported (no end by deadline + 2 s), 1 of them ended since (late_end)" in said
    table = [line.split() for line in said.splitlines() if "  stuck  " in line]
    printed = sorted((line[0], line[2], line[3]) for line in table)
    expected = [("ctl", "2", "k2"), ("ctl", "3", "k3"), ("ctl", "5", "k5")]
    expected += [("dropping", "1", "k1")]
    expected += [("dropping", "4", "k4")]
    expected += [("server", str(i), f"k{i % 2},all") for i in range(4, 8)]
    assert printed == expected


def test_a_restart_from_the_checkpoint_neither_loses_nor_doubles_a_report(
    scenario: Scenario,
) -> None:
    """The first run reported ctl 2, 3 and 5 (5 with its end, read before: 2.95 s past its
    deadline, beyond the grace); its last batch re-ran in the second run and wrote the same
    file again; ctl 2's end then came (20 s, after its report: ``late_end``) and ctl 4 was
    watched and never ended. Each report is in ``stuck/`` once."""
    assert ids(scenario, "ctl") == [
        ("2", "late_end"),
        ("2", "stuck"),
        ("3", "stuck"),
        ("4", "stuck"),
        ("5", "late_end"),
        ("5", "stuck"),
    ]
    first = sorted((r["purgatory"], r["id"], r["status"]) for r in scenario.first)
    assert [(i, status) for name, i, status in first if name == "ctl"] == [
        ("2", "stuck"),
        ("3", "stuck"),
        ("5", "late_end"),
        ("5", "stuck"),
    ]
    (late,) = [r for r in scenario.second if r["status"] == "late_end" and r["id"] == "2"]
    assert late["outcome"] == "completed"
    assert late["overdue_seconds"] == pytest.approx(20.0 - 1.2)
    assert late["ended_utc"].timestamp() == pytest.approx(BASE + 20.0)
    # The re-run batch reported again what the first run's last batch had: written once.
    again = {(r["purgatory"], r["id"], r["status"]) for r in scenario.second}
    assert again >= set(first)
    assert len(scenario.written) == len(set(scenario.written))


def test_the_default_grace_is_four_ticks_plus_the_measured_p99_lateness(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Expired operations that ended 0, 1, ..., 99 ms after their deadlines: p99 98.01 ms
    (exact, interpolated); the grace adds 4 ticks. Measured once, then kept in the checkpoint."""
    from purgatory.pipeline._job_follow import _grace

    log = JsonLinesEventLog(tmp_path / "events", clock=None)
    for i in range(100):
        op = FlagOperation(1.0)
        log.record_watch("p", op, ("k",), None, float(i), i + 1.0)
        log.record_end("p", op, "expired", i + 1.0 + i / 1000)
    log.close()
    checkpoint = str(tmp_path / "checkpoint")
    grace = _grace(spark, str(tmp_path / "events"), checkpoint, None, 0.002)
    assert grace == pytest.approx(4 * 0.002 + 0.09801)
    assert _grace(spark, str(tmp_path / "nothing"), checkpoint, None, 1.0) == grace  # kept
    assert _grace(spark, str(tmp_path / "nothing"), checkpoint, 0.25, 1.0) == 0.25  # given


def test_a_batch_analysis_reports_what_the_follow_job_reported(scenario: Scenario) -> None:
    """``analyze --stuck`` of the same files, with the same grace and watermark: the same rows
    (operations, keys, watches, deadlines, windows, late ends), but when a ``stuck`` row was
    reported, which the batch puts at its newest record less the watermark."""

    def report(row: dict[str, Any]) -> dict[str, Any]:
        if row["status"] == "stuck":
            return {k: v for k, v in row.items() if k not in ("reported_utc", "overdue_seconds")}
        return row

    def ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(map(report, rows), key=lambda r: (r["purgatory"], r["id"], r["status"]))

    assert len(scenario.batch) == 12
    assert ordered(scenario.batch) == ordered(scenario.rows)
    for row in scenario.batch:
        assert row["overdue_seconds"] >= GRACE


def test_logs_without_watch_records_are_said_to_report_nothing(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recorders made without ``watch_records=True`` (the default): no operation can be
    reported stuck, which a job must say rather than report nothing, which reads as "none
    stuck". Batch and follow, once each (each job's own count of what it read)."""
    events = tmp_path / "events"
    record_at(events, "fetch", BASE, 12)
    said = [
        "purgatory.pipeline: --stuck: 12 records read, none of them a watch record: no "
        "operation can be reported stuck (the recorders need watch_records=True)"
    ]
    capsys.readouterr()
    assert batch_stuck(spark, events, tmp_path / "batch") == []
    assert capsys.readouterr().err.splitlines() == said
    record_at(events, "fetch", BASE + 60, 12)  # (the follow job reads both recordings)
    follow_stuck(spark, events, tmp_path / "live", tmp_path / "checkpoint")
    assert capsys.readouterr().err.splitlines() == [said[0].replace("12 records", "24 records")]
