"""`benchmarks.w1_virtual` runs every W1 mode through the real purgatory in virtual time."""

from __future__ import annotations

import pytest

from benchmarks import w1_virtual
from benchmarks.w1 import W1Setting


def test_every_mode_runs_and_prints_its_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert w1_virtual.main(["--requests", "3000", "--repeat", "1", "--keys", "100"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split()[0] for row in rows] == ["W1-force", "W1-key", "W1-threshold"]
    assert all(float(row.split()[-1]) > 0 for row in rows)


def test_every_mode_completes_the_same_requests_on_the_same_traffic() -> None:
    # Thresholds re-try only what is due, a key trigger re-tries everything, force completes
    # directly: on the same traffic all three must complete and expire the same requests.
    outcomes = set()
    for mode in ("force", "key", "threshold"):
        _us, stats = w1_virtual.run(W1Setting(mode, 20, 60, 100), 20_000, 40_000.0)
        assert stats.completed + stats.expired + stats.delayed == 20_000
        outcomes.add((stats.completed, stats.expired, stats.delayed))
    assert len(outcomes) == 1
    ((completed, expired, _pending),) = outcomes
    assert completed > 0
    assert expired > 0
