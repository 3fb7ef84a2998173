"""Two runs side by side: ``python -m benchmarks compare A.json B.json``.

Every figure both results files hold (a workload's ``figures``: spreads with their unit and
which direction is better) gets a row: A and B as median [min, max], and B against A as the
ratio of the medians in the better direction. Where both figures have several values and their
[min, max] ranges overlap, the row says so: the difference is within the run-to-run spread, as
pyperf's ``compare_to`` calls a change not significant. Runs of different commits are what this
is for; runs on different machines, Pythons or modes (quick and full) are compared anyway, with
a warning, since their ratios mean little.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .report import cell, table

__all__ = ("compare", "main")


def _change(a: dict[str, Any], b: dict[str, Any]) -> str:
    """B against A: ``1.25x better``, ``1.10x worse``, ``same``; ``(within spread)`` when the
    [min, max] ranges of two multi-value figures overlap."""
    first, second = a["median"], b["median"]
    if first is None or second is None:
        return "-"
    if first == second:
        return "same"
    if first <= 0 or second <= 0:
        return f"{second - first:+g}"
    ratio = second / first if a["better"] == "higher" else first / second
    verdict = f"{ratio:.2f}x better" if ratio > 1 else f"{1 / ratio:.2f}x worse"
    if a["n"] > 1 and b["n"] > 1 and a["min"] <= b["max"] and b["min"] <= a["max"]:
        verdict += " (within spread)"
    return verdict


def _describe(label: str, path: Path, meta: dict[str, Any]) -> str:
    mode = "quick" if meta["config"]["quick"] else "full"
    return (
        f"- {label}: `{path}`: {meta['git']}, {meta['date']}, {mode} run, Python "
        f"{meta['python']}, load {meta['load_before']} / {meta.get('load_after', '-')}"
    )


def _warnings(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    found = []
    for key, what in (("python", "Python"), ("cpu_model", "CPU"), ("platform", "platform")):
        if a[key] != b[key]:
            found.append(f"- Not the same {what}: {a[key]} / {b[key]}.")
    if a["config"]["quick"] != b["config"]["quick"]:
        found.append("- One is a quick run and the other a full one: sizes differ.")
    return found


def compare(a: dict[str, Any], b: dict[str, Any], paths: tuple[Path, Path]) -> str:
    """The comparison of two results files, as Markdown."""
    lines = [
        "# Two runs compared",
        "",
        _describe("A", paths[0], a["meta"]),
        _describe("B", paths[1], b["meta"]),
        *_warnings(a["meta"], b["meta"]),
        "",
    ]
    rows = []
    only: dict[str, list[str]] = {"A": [], "B": []}
    names = [*a["workloads"], *(n for n in b["workloads"] if n not in a["workloads"])]
    for name in names:
        if name not in b["workloads"] or name not in a["workloads"]:
            only["A" if name in a["workloads"] else "B"].append(name)
            continue
        ours, theirs = a["workloads"][name]["figures"], b["workloads"][name]["figures"]
        for label, first in ours.items():
            second = theirs.get(label)
            if second is not None:
                rows.append(
                    [name, label, first["unit"], cell(first), cell(second), _change(first, second)]
                )
    lines += table("workload | figure | unit | A | B | B against A", rows)
    for side, missing in only.items():
        if missing:
            lines += ["", f"Only in {side}: {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks compare",
        description="Two runs side by side: every figure both results files hold.",
    )
    parser.add_argument("a", type=Path, help="the results file of the reference run")
    parser.add_argument("b", type=Path, help="the results file of the run compared with it")
    args = parser.parse_args(argv)
    runs = [json.loads(path.read_text()) for path in (args.a, args.b)]
    print(compare(runs[0], runs[1], (args.a, args.b)), end="")
    return 0
