"""``analyze --follow --stuck``: operations watched whose end never came, reported live.

On the tests' local[2] session, with event logs written by real purgatories (recorders with
``watch_records=True``): a server in a process of its own killed while operations wait; a
recorder made to lose some end records; a clean purgatory, which must report nothing. Then a
job stopped and started again from its checkpoint, one of its batches re-run as after a kill
between its write and its commit: no report lost or doubled, and a late end said once.

Deterministic: the reports are driven by event time (each record's own time and the watermark
it moves), never by the wall clock; a recording at a known later UTC time moves the watermark
past every deadline plus the grace (`advance`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import pytest
from helpers import FlagOperation
from pyspark.sql import SparkSession
from spark_support import record_at, spark_env

from purgatory import ArrowEventLog, DelayedOperationPurgatory, JsonLinesEventLog
from purgatory.pipeline._job_follow import follow

#: The settings of every job here: a grace of 0.5 s, the watermark 4 s behind the newest record.
GRACE, WATERMARK, WINDOW = 0.5, 4.0, 2.0

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
        await asyncio.sleep(0.2)  # ops 2 and 3 expire; 4 to 7 wait 30 s
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
    expired; the purgatory shut down after."""
    purgatory = DelayedOperationPurgatory[FlagOperation](name, event_log=event_log)
    ops = [FlagOperation(0.05, f"op{i}") for i in range(6)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [f"k{i}"])
    for i in (0, 2, 4):
        ops[i].ready = True
        purgatory.check_and_complete(f"k{i}")
    await asyncio.sleep(0.15)
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


def run_once(
    spark: SparkSession, events: Path, out: Path, checkpoint: Path
) -> list[dict[str, Any]]:
    """A ``--once`` job with the stuck report; every report its batches wrote, in order."""
    reports: list[dict[str, Any]] = []
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
        report_stuck=lambda _progress, rows: reports.extend(rows or []),
    )
    return reports


def written(spark: SparkSession, out: Path) -> list[tuple[str, str, str]]:
    """Every report in ``out/stuck/`` as (purgatory, id, status), sorted (duplicates kept)."""
    if not (out / "stuck").exists():
        return []
    rows = spark.read.parquet(str(out / "stuck")).collect()
    return sorted((row["purgatory"], row["id"], row["status"]) for row in rows)


def test_killed_server_and_lost_ends_are_reported_and_a_clean_run_is_not(
    spark: SparkSession, tmp_path: Path
) -> None:
    events, out = tmp_path / "events", tmp_path / "live"
    killed_server(events)
    dropping_and_clean(events)
    advance(events, time.time() + 120)  # past every deadline (30 s at most) + grace + watermark
    reports = run_once(spark, events, out, tmp_path / "checkpoint")
    expected = [("dropping", i, "stuck") for i in ("1", "4")]
    expected += [("server", str(i), "stuck") for i in range(4, 8)]
    assert written(spark, out) == sorted(expected)
    assert sorted((r["purgatory"], r["id"], r["status"]) for r in reports) == sorted(expected)
    for row in reports:
        assert row["keys"] == (
            [f"k{int(row['id']) % 2}", "all"] if row["purgatory"] == "server" else [f"k{row['id']}"]
        )
        assert row["recorder"].startswith(row["purgatory"] + "-")
        timeout = 30.0 if row["purgatory"] == "server" else 0.05
        watched_to_deadline = (row["deadline_utc"] - row["watched_utc"]).total_seconds()
        assert watched_to_deadline == pytest.approx(timeout, abs=0.002)
        # Reported once the watermark (newest record - 4 s) passed deadline + grace.
        assert row["overdue_seconds"] >= GRACE
        assert row["overdue_seconds"] == pytest.approx(
            (row["reported_utc"] - row["deadline_utc"]).total_seconds(), abs=0.001
        )
        assert row["grace_seconds"] == GRACE
        assert row["outcome"] is None
        assert row["ended_utc"] is None
        assert row["window_start"] % WINDOW == 0
        assert row["window_start"] <= row["deadline_utc"].timestamp() < row["window_start"] + 2


class Controlled:
    """A recorder with watch records driven at known times: a host whose clock read 1000 when
    UTC was `utc` (``time.time`` patched by `monkeypatch`); every watch has a 1 s timeout."""

    def __init__(self, events: Path, utc: float, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        self.ops: dict[int, FlagOperation] = {}
        monkeypatch.setattr(time, "time", lambda: utc - 1000.0 + self.now)
        self.log = JsonLinesEventLog(
            events, prefix="controlled", watch_records=True, clock=lambda: self.now
        )

    def watch(self, ident: int, at: float) -> None:
        self.now = 1000.0 + at
        self.ops[ident] = op = FlagOperation(1.0)
        self.log.record_watch("ctl", op, (f"k{ident}",), None, self.now, self.now + 1.0)

    def end(self, ident: int, at: float) -> None:
        self.now = 1000.0 + at
        self.log.record_end("ctl", self.ops.pop(ident), "completed", self.now)


def test_a_restart_from_the_checkpoint_neither_loses_nor_doubles_a_report(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``--once`` runs, the first one's last batch re-run by the second (its commit removed,
    as a kill between the batch's write and its commit leaves it): each report once; an end
    that comes after its operation was reported is a ``late_end`` row, once."""
    events, out, checkpoint = tmp_path / "events", tmp_path / "live", tmp_path / "checkpoint"
    base = 1_800_000_000.0
    host = Controlled(events, base, monkeypatch)
    for i in range(4):
        host.watch(i, i * 0.1)
    host.end(0, 0.5)
    host.end(1, 0.6)
    host.log.flush()
    advance(events, base + 10)
    first = run_once(spark, events, out, checkpoint)
    assert sorted((r["id"], r["status"]) for r in first) == [("2", "stuck"), ("3", "stuck")]
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
    advance(events, base + 30)
    second = run_once(spark, events, out, checkpoint)
    assert written(spark, out) == sorted(
        [
            ("ctl", "2", "stuck"),
            ("ctl", "3", "stuck"),
            ("ctl", "2", "late_end"),
            ("ctl", "4", "stuck"),
        ]
    )
    late = next(r for r in second if r["status"] == "late_end")
    assert late["outcome"] == "completed"
    assert late["overdue_seconds"] == pytest.approx(20.0 - 1.2)
