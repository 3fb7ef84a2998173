"""The demo (the README's first command) runs, shortened, and its figures add up."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from minibroker_support import run

from examples.minibroker.demo import run_demo


def test_the_demo_loses_no_acknowledged_record_and_shows_the_isr_shrink(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the demo's temporary files would go
    tempfile.tempdir = None  # read TMPDIR again
    try:
        summary = run(lambda: run_demo(seed=3, seconds=6.0), timeout=90)
    finally:
        tempfile.tempdir = None
    assert os.listdir(tmp_path) == []  # no log file left behind
    assert summary["lost"] == 0
    assert summary["acked"] > 0
    assert summary["sent"] == summary["acked"] + sum(summary["failed"].values())
    # Follower 2 is frozen for 45 % of the run (2.7 s), well past replica.lag.time.max.ms.
    assert any("replica 2 left" in change for change in summary["isr_changes"])
    assert any("replica 2 rejoined" in change for change in summary["isr_changes"])
    for name in ("produce", "fetch"):
        assert summary["gauges"][name]["delayed"] == 0
    # The group member killed at 35 % expired; the other one took all four partitions.
    assert summary["group_ok"]
    before, after = summary["a_partitions"]
    assert len(before) == 2
    assert after == [0, 1, 2, 3]
    assert summary["gauges"]["rebalance"]["delayed"] == 0
    out = capsys.readouterr().out
    assert "summary" in out
    assert "ack wait p50 / p99 / max (ms)" in out
    assert "kill group member B (SIGKILL)" in out
    assert "group: A 0,1,2,3 B killed" in out  # the move, on a progress line
