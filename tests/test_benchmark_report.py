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


def results_before_rounds() -> dict[str, Any]:
    """The W1-force workload and provenance of the results file committed at debd1c9 (a run
    of 3917707), before W1 had rounds and runs recorded their contenders (its probes left out)."""
    path = ROOT / "tests" / "data" / "results_before_rounds.json"
    results: dict[str, Any] = json.loads(path.read_text())
    return results


def test_a_run_of_the_earlier_w1_procedure_is_rendered_but_not_judged() -> None:
    text = render(results_before_rounds())
    assert "This run predates the current procedure" in text
    row = goal_row(text, "W1-force 20/60: rate vs A (asyncio)")
    assert row.endswith("| not judged: an earlier procedure and baseline A |")


def w1_run(mode: str, key_space: int, ratios: dict[str, list[float]]) -> dict[str, Any]:
    """A results file holding one W1 setting of the current shape, with these per-round
    ratios (the contenders' own figures are not what the goals read)."""
    from benchmarks.measure import spread

    results = committed_results()
    name = f"W1-{mode} 20/60" + ("" if key_space == 100 else f", {key_space:,} keys")
    contender = {
        "rates": spread([1000.0] * 5),
        "max_rate": 1000.0,
        "rounds": 5,
        "common_rate": 800.0,
        "common_passes": 5,
        "cpu_s_per_million": spread([10.0] * 5),
        "cpu_common": spread([10.0] * 5),
        "peak_watched": spread([1.0]),
        "completion_lateness_ms": {"p50": 1.0, "p99": 2.0, "max": 3.0},
        "expiry_lateness_ms": {"p50": 1.0, "p99": 2.0, "max": 3.0},
        "gc_s": spread([0.0]),
        "gc_longest_s": spread([0.0]),
    }
    entry = {
        "setting": {"mode": mode, "p50_ms": 20, "p75_ms": 60, "key_space": key_space, "name": name},
        "common_rate": 800.0,
        "contenders": dict.fromkeys(("ours", "A", "ours-uvloop", "B"), contender),
        "ratios": {label: spread(values) for label, values in ratios.items()},
    }
    results["workloads"] = {
        f"w1-{mode}": {
            **results["workloads"]["w1-force"],
            "rounds": 5,
            "bracket_step": 1.05,
            "common_share": 0.8,
            "settings": [entry],
        }
    }
    return results


def test_each_w1_target_is_judged_on_the_median_of_its_rounds_on_both_loops() -> None:
    cases = {
        ("force", 100): 1.5,
        ("threshold", 100): 1.5,
        ("key", 100_000): 1.5,
        ("key", 100): 1.0,
    }
    for (mode, key_space), least in cases.items():
        for median, verdict in ((least - 0.01, "**not met**"), (least, "met")):
            rounds = [median - 0.3, median - 0.1, median, median + 0.1, median + 0.4]
            text = render(
                w1_run(mode, key_space, {"rate ours/A": rounds, "rate ours-uvloop/B": rounds})
            )
            name = f"W1-{mode} 20/60" + ("" if key_space == 100 else f", {key_space:,} keys")
            for baseline, loop in (("A", "asyncio"), ("B", "uvloop")):
                row = goal_row(text, f"{name}: rate vs {baseline} ({loop})")
                assert f"| >= {least}x |" in row
                assert row.endswith(f"| {verdict} |"), row
                assert f"[{median - 0.3:.2f}, {median + 0.4:.2f}] over 5 round(s)" in row
    text = render(w1_run("threshold", 100_000, {"rate ours/A": [0.5] * 5}))
    assert goal_row(text, "W1-threshold 20/60, 100,000 keys: rate vs A").endswith("| reported |")


def test_the_w2_targets_are_judged_at_1e5_pending_on_both_loops() -> None:
    from benchmarks.measure import spread

    results = committed_results()
    (block,) = [b for b in results["workloads"]["w2"]["sizes"] if b["n"] == 100_000]
    for median, verdict in ((1.49, "**not met**"), (1.5, "met")):
        found = spread([median - 0.2, median, median + 0.2])
        block["ratios"] = {
            metric: {"A/ours": found, "B/ours-uvloop": found}
            for metric in ("watch+complete", "watch+expire")
        }
        text = render(results)
        for metric in ("watch+complete", "watch+expire"):
            for baseline in ("A", "B"):
                row = goal_row(text, f"W2 N=100,000: {metric} per operation vs {baseline}")
                assert row.endswith(f"| {verdict} |"), row
    p99 = block["contenders"]["ours"]["summary"]["lateness_ms"]["p99"]
    for late, verdict in ((5.0, "met"), (5.1, "**not met**")):
        p99["median"] = late
        row = goal_row(render(results), "W2 N=100,000: expiry lateness p99 (ours)")
        assert row.endswith(f"| {verdict} |")


def test_the_parked_and_engine_targets() -> None:
    results = committed_results()
    for pause, verdict in ((0.99, "met"), (1.0, "**not met**")):
        results["workloads"]["parked"] = {
            "n": 1_000_000,
            "far_s": 30.0,
            "user_object_bytes": 80.0,
            "contenders": {
                who: {
                    "schedule_us": 4.0,
                    "gc_longest_s": pause if who == "ours" else 0.8,
                    "gc_s": 2.0,
                    "gc_collections": 10,
                    "gc_full_collections": 1,
                    "bytes_per_op": 270.0 if who == "ours" else 800.0,
                }
                for who in ("ours", "A")
            },
            "figures": {},
        }
        row = goal_row(render(results), "1,000,000 parked: the longest GC pause")
        assert row.endswith(f"| {verdict} |")
        assert "A 0.80 s, 800 B/op" in row
    for rate, verdict in ((99_999.0, "**not met**"), (100_000.0, "met")):
        results["workloads"]["pipeline-engine"] = {
            "goal_ops_per_core_s": 100_000.0,
            "engine_ops_per_core_s": rate,
            "engine_ops_per_core_s_min": rate,
            "engine_ops_per_core_s_max": rate,
            "engine_us_per_op": 1e6 / rate,
            "engine_null_us_per_op": 11.0,
            "engine_logged_us_per_op": 12.0,
            "engine_operations": 1000,
            "samples": {"none": [0.01]},
            "figures": {},
        }
        row = goal_row(render(results), "The pipeline's replay engine alone")
        assert row.endswith(f"| {verdict} |")


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


def test_a_run_names_its_contenders_as_they_were_when_it_ran() -> None:
    from benchmarks.contenders import DESCRIPTIONS

    results = results_before_rounds()
    assert "with list.remove" in render(results)  # written before runs recorded them
    results["meta"]["contenders"] = DESCRIPTIONS
    text = render(results)
    assert f"- **A**: {DESCRIPTIONS['A']}" in text
    assert "with list.remove" not in text


def test_the_provenance_names_the_core_that_ran_when_the_run_recorded_it() -> None:
    results = committed_results()
    results["meta"].pop("purgatory_core", None)
    assert " core; uvloop" not in render(results)
    results["meta"]["purgatory_core"] = "python"
    assert f"at {results['meta']['git']}, the python core; uvloop" in render(results)
