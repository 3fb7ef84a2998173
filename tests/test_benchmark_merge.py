"""``python -m benchmarks --merge`` and the report's W1-threshold rows, on the committed JSON.

Measures nothing: a partial run is simulated by editing a copy of ``benchmarks/results.json``.
"""

from __future__ import annotations

import copy
from typing import Any

from test_benchmark_report import committed_results, target_row

from benchmarks.merge import earlier_runs, merge_results
from benchmarks.report import render_markdown


def _partial_run(old: dict[str, Any]) -> dict[str, Any]:
    """A run of W1-key 20/60 for ours alone and W2 at N=1e5 for ours alone, at a later commit."""
    new: dict[str, Any] = {"meta": {**old["meta"], "git": "commit later", "command": "later"}}
    setting = copy.deepcopy(old["w1"]["settings"][2])
    assert setting["setting"]["name"] == "W1-key 20/60"
    setting["contenders"] = {"ours": setting["contenders"]["ours"]}
    setting["contenders"]["ours"]["max_rate"] = (
        2 * old["w1"]["settings"][2]["contenders"]["A"]["max_rate"]
    )
    setting["ratios"] = {}
    new["w1"] = {**old["w1"], "settings": [setting]}
    block = copy.deepcopy(next(b for b in old["w2"]["sizes"] if b["n"] == 100_000))
    block["contenders"] = {"ours": block["contenders"]["ours"]}
    block["ratios"] = {}
    new["w2"] = {**old["w2"], "sizes": [block], "notes": []}
    return new


def _single_run() -> dict[str, Any]:
    """The committed JSON as if one run had measured all of it (its own merge tags removed)."""

    def untag(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: untag(v) for k, v in node.items() if k != "from_run"}
        if isinstance(node, list):
            return [untag(v) for v in node]
        return node

    untagged: dict[str, Any] = untag(committed_results())
    return untagged


def test_merge_replaces_what_was_measured_and_tags_what_was_kept() -> None:
    old = _single_run()
    before = copy.deepcopy(old)
    merged = merge_results(old, _partial_run(old))
    assert old == before  # the inputs are not modified

    names = [e["setting"]["name"] for e in merged["w1"]["settings"]]
    assert names == [e["setting"]["name"] for e in old["w1"]["settings"]]  # SETTINGS order
    key = merged["w1"]["settings"][2]
    assert "from_run" not in key["contenders"]["ours"]
    assert key["contenders"]["A"]["from_run"]["git"] == old["meta"]["git"]
    assert key["ratios"]["rate ours/A"] == 2.0  # recomputed from the merged figures
    assert merged["w1"]["settings"][0]["from_run"]["git"] == old["meta"]["git"]

    assert [b["n"] for b in merged["w2"]["sizes"]] == [b["n"] for b in old["w2"]["sizes"]]
    block = next(b for b in merged["w2"]["sizes"] if b["n"] == 100_000)
    assert set(block["ratios"]["schedule_us"]) >= {"A/ours", "ours/Floor"}
    assert merged["idle"]["from_run"]["git"] == old["meta"]["git"]
    assert merged["meta"]["git"] == "commit later"

    [(run, labels)] = earlier_runs(merged)
    assert run["git"] == old["meta"]["git"]
    assert "W1-key 20/60 (A)" in labels
    assert "W1-key 20/60 (ours)" not in labels
    assert "W2 N=1,000,000" in labels
    assert "idle" in labels
    assert "- Rows kept from the run of" in render_markdown(merged, None)


def test_a_second_merge_keeps_the_first_runs_tags() -> None:
    old = _single_run()
    once = merge_results(old, _partial_run(old))
    later = _partial_run(once)
    later["meta"] = {**later["meta"], "git": "commit latest"}
    later["w1"]["settings"] = []
    twice = merge_results(once, later)
    runs = {run["git"]: labels for run, labels in earlier_runs(twice)}
    # The setting kept whole is tagged with the run it came from; its row that run had kept
    # from the first run keeps that older tag.
    assert "W1-key 20/60" in runs["commit later"]
    assert "W1-key 20/60 (A)" in runs[old["meta"]["git"]]


def _with_threshold_rows(results: dict[str, Any], ours_rate: float) -> dict[str, Any]:
    """The committed JSON plus a W1-threshold 20/60 setting (100 keys) with ours and A."""
    changed = copy.deepcopy(results)
    key = next(e for e in changed["w1"]["settings"] if e["setting"]["name"] == "W1-key 20/60")
    entry = copy.deepcopy(key)
    entry["setting"] = {**entry["setting"], "mode": "threshold", "name": "W1-threshold 20/60"}
    entry["contenders"] = {
        "ours": {**key["contenders"]["ours"], "max_rate": ours_rate, "cpu_s_per_million": 1.0},
        "A": key["contenders"]["A"],
    }
    settings = changed["w1"]["settings"]
    settings[:] = [e for e in settings if e["setting"]["name"] != "W1-threshold 20/60"]
    settings.append(entry)
    return changed


def test_threshold_targets_judge_against_a_and_w1_force() -> None:
    results = committed_results()
    a_rate = next(e for e in results["w1"]["settings"] if e["setting"]["name"] == "W1-key 20/60")[
        "contenders"
    ]["A"]["max_rate"]

    fast = render_markdown(_with_threshold_rows(results, max(1.6 * a_rate, 150_000)), None)
    assert target_row(fast, "W1-threshold 20/60: rate vs A's W1-key rate").endswith("| met |")
    assert target_row(
        fast, "W1-threshold 20/60: rate sustained (threshold watchers target)"
    ).endswith("| met |")
    cpu = target_row(fast, "W1-threshold 20/60: CPU per request vs W1-force 20/60")
    assert cpu.endswith("| met |")

    slow = render_markdown(_with_threshold_rows(results, 1.4 * a_rate), None)
    row = target_row(slow, "W1-threshold 20/60: rate vs A's W1-key rate")
    assert row.endswith("| **not met** |")
    assert "1.40x" in row
