"""The benchmark report: RESULTS.md is the rendering of the one run in results.json, and the
targets table judges the current goals by their thresholds.

Measures nothing: it re-renders the committed ``benchmarks/results.json``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from benchmarks.report import render
from benchmarks.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parent.parent
SPREAD = {"n", "median", "q1", "q3", "min", "max", "unit", "better"}


def committed_results() -> dict[str, Any]:
    results: dict[str, Any] = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    return results


def test_committed_report_is_the_rendering_of_the_committed_results() -> None:
    assert render(committed_results(), "w2.png") == (ROOT / "benchmarks" / "RESULTS.md").read_text()


def test_the_committed_results_are_one_run_with_spreads() -> None:
    results = committed_results()
    assert results["meta"]["commit"]
    assert not results["failed"]
    ran = list(results["workloads"])
    assert ran == [w.name for w in WORKLOADS if w.name in ran]
    assert {"w1-threshold", "w2", "idle", "eventlog"} <= set(ran)  # the goals' workloads
    for name, found in results["workloads"].items():
        for label, figure in found["figures"].items():
            assert set(figure) == SPREAD, (name, label)
            if figure["n"]:  # n = 0: not measured (a W1 search that found no rate), said so
                assert figure["min"] <= figure["median"] <= figure["max"], (name, label)


def goal_row(markdown: str, goal: str) -> str:
    rows = [line for line in markdown.splitlines() if line.startswith(f"| {goal}")]
    assert len(rows) == 1, rows
    return rows[0]


def test_the_threshold_goal_is_judged_against_a_in_the_same_run() -> None:
    results = committed_results()
    (entry,) = [
        e
        for e in results["workloads"]["w1-threshold"]["settings"]
        if e["setting"]["name"] == "W1-threshold 20/60"
    ]
    goal = "W1-threshold 20/60, 100 keys: rate vs A's in the same run"
    verdicts = {}
    for ours in (11_900.0, 12_000.0, 15_000.0):
        changed = copy.deepcopy(results)
        (same,) = [
            e
            for e in changed["workloads"]["w1-threshold"]["settings"]
            if e["setting"] == entry["setting"]
        ]
        same["contenders"]["A"]["max_rate"] = 10_000.0
        same["contenders"]["ours"]["max_rate"] = ours
        verdicts[ours] = goal_row(render(changed), goal).rsplit("|", 2)[1].strip()
    assert verdicts == {11_900.0: "**not met**", 12_000.0: "met", 15_000.0: "met, moonshot too"}


def test_the_event_log_goal_is_one_microsecond_of_recording() -> None:
    results = committed_results()
    found = results["workloads"]["eventlog"]
    base = found["us_per_op"]["none"]["median"]
    goal = "Event-log recording, `JsonLinesEventLog`"
    for own, verdict in ((0.0, "met"), (0.99, "met"), (1.01, "**not met**")):
        changed = copy.deepcopy(results)
        changed["workloads"]["eventlog"]["own_us_per_op"]["json"] = own
        changed["workloads"]["eventlog"]["us_per_op"]["json"]["median"] = base + own
        assert goal_row(render(changed), goal).endswith(f"| {verdict} |")
    # A recorder measured below the run without one is the machine's noise, not a verdict.
    changed = copy.deepcopy(results)
    changed["workloads"]["eventlog"]["own_us_per_op"]["json"] = -0.5
    changed["workloads"]["eventlog"]["us_per_op"]["json"]["median"] = base - 0.5
    assert "| **not judged**: cheaper than no recorder" in goal_row(render(changed), goal)


def test_only_current_goals_are_stated() -> None:
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    targets = text.split("## Targets against this run")[1].split("\n## ")[0]
    assert ">= 3x" not in targets
    assert "100,000/s" not in targets
    assert "| reported |" in targets
