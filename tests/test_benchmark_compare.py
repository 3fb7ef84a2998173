"""`benchmarks.compare`: two runs side by side, figure by figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.__main__ import main
from benchmarks.measure import figure


def _run(commit: str, figures: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    meta = {
        "git": f"commit {commit}",
        "date": "2026-11-25 10:00 UTC",
        "python": "3.11.7",
        "cpu_model": "cpu",
        "platform": "linux",
        "load_before": "0.10/0.10/0.10",
        "load_after": "0.20/0.10/0.10",
        "config": {"quick": quick},
    }
    return {"meta": meta, "workloads": {"w": {"figures": figures}}, "failed": {}}


def _row(text: str, label: str) -> str:
    (row,) = [line for line in text.splitlines() if f"| {label} |" in line]
    return row


def test_each_figure_is_judged_in_its_better_direction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _run(
        "aaa",
        {
            "cost": figure([2.0, 2.1, 2.2], "us/op"),
            "rate": figure([100.0], "/s", "higher"),
            "noisy": figure([1.0, 2.0, 3.0], "us/op"),
            "gone": figure([1.0], "us/op"),
        },
    )
    after = _run(
        "bbb",
        {
            "cost": figure([1.0, 1.05, 1.1], "us/op"),
            "rate": figure([80.0], "/s", "higher"),
            "noisy": figure([1.5, 1.8, 2.5], "us/op"),
        },
    )
    paths = []
    for name, run in (("a.json", before), ("b.json", after)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(run))
    assert main(["compare", *map(str, paths)]) == 0
    text = capsys.readouterr().out
    assert "commit aaa" in text
    assert "commit bbb" in text
    assert _row(text, "cost").endswith("| 2.10 [2.00, 2.20] | 1.05 [1.00, 1.10] | 2.00x better |")
    assert _row(text, "rate").endswith("| 100.00 | 80.00 | 1.25x worse |")
    assert _row(text, "noisy").endswith("1.11x better (within spread) |")
    assert "gone" not in text


def test_runs_of_different_kinds_are_compared_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quick = _run("aaa", {"x": figure([1.0], "us/op")}, quick=True)
    full = _run("bbb", {"x": figure([1.0], "us/op")})
    full["workloads"]["only-here"] = {"figures": {}}
    for name, run in (("a.json", quick), ("b.json", full)):
        (tmp_path / name).write_text(json.dumps(run))
    main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    text = capsys.readouterr().out
    assert "One is a quick run and the other a full one" in text
    assert _row(text, "x").endswith("| same |")
    assert "Only in B: only-here." in text
