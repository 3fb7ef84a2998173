"""The benchmark report: RESULTS.md is rendered from the JSON alone, targets table included.

Measures nothing: it re-renders the committed ``benchmarks/results.json`` and checks that the
committed ``benchmarks/RESULTS.md`` is exactly what the renderer makes of it (so neither was edited
by hand), and that the targets table judges a figure by its threshold.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from benchmarks.report import render_markdown

ROOT = Path(__file__).resolve().parent.parent


def committed_results() -> dict[str, Any]:
    results: dict[str, Any] = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    return results


def test_committed_report_is_the_rendering_of_the_committed_json() -> None:
    rendered = render_markdown(committed_results(), "w2.png")
    assert rendered == (ROOT / "benchmarks" / "RESULTS.md").read_text()


def target_row(markdown: str, label: str) -> str:
    rows = [line for line in markdown.splitlines() if line.startswith(f"| {label}")]
    assert len(rows) == 1, rows
    return rows[0]


def test_a_target_verdict_follows_its_threshold() -> None:
    results = committed_results()
    block = next(b for b in results["w2"]["sizes"] if b["n"] == 1_000_000)
    user = block["user_object_bytes"]
    label = "W2 N=1,000,000: memory beyond the user's object"

    block["contenders"]["ours"]["memory"]["bytes_per_op"] = user + 299
    assert target_row(render_markdown(results, None), label).endswith("| 299 B | met |")
    changed = copy.deepcopy(results)
    next(b for b in changed["w2"]["sizes"] if b["n"] == 1_000_000)["contenders"]["ours"]["memory"][
        "bytes_per_op"
    ] = user + 301
    assert target_row(render_markdown(changed, None), label).endswith("| 301 B | **not met** |")
