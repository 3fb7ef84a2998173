"""Fold a partial run into an earlier results JSON (``python -m benchmarks --merge``).

The full suite takes about a quarter of an hour of both cores; after a change that touches a few
rows, re-running those rows is enough. What the new run measured replaces the old figures at the
finest grain the runs share: a W1 setting's contender, a W2 size's contender, the idle block.
Everything else is kept and tagged ``from_run`` (date, commit and command of the run that
measured it; a tag from an earlier merge is kept as it is), the ratios of every setting or size
that mixes runs are recomputed from the merged figures, and `earlier_runs` lists the tagged rows
so that RESULTS.md says which rows come from which run.
"""

from __future__ import annotations

import copy
from typing import Any

from .w1 import SETTINGS, setting_ratios
from .w2 import size_ratios

__all__ = ("earlier_runs", "merge_results")

_ORDER = {setting.name: index for index, setting in enumerate(SETTINGS)}


def _kept(entry: dict[str, Any], run: dict[str, str]) -> dict[str, Any]:
    """A copy of an old entry, tagged with the run that measured it."""
    entry = copy.deepcopy(entry)
    entry.setdefault("from_run", run)
    return entry


def _merge_w1(old: dict[str, Any], new: dict[str, Any], run: dict[str, str]) -> dict[str, Any]:
    merged = copy.deepcopy(new)
    by_name = {entry["setting"]["name"]: entry for entry in merged["settings"]}
    for entry in old["settings"]:
        fresh = by_name.get(entry["setting"]["name"])
        if fresh is None:
            by_name[entry["setting"]["name"]] = _kept(entry, run)
            continue
        missing = [name for name in entry["contenders"] if name not in fresh["contenders"]]
        for name in missing:
            fresh["contenders"][name] = _kept(entry["contenders"][name], entry.get("from_run", run))
        if missing:
            fresh["ratios"] = setting_ratios(fresh["contenders"])
    merged["settings"] = sorted(
        by_name.values(), key=lambda e: _ORDER.get(e["setting"]["name"], len(_ORDER))
    )
    return merged


def _merge_w2(old: dict[str, Any], new: dict[str, Any], run: dict[str, str]) -> dict[str, Any]:
    merged = copy.deepcopy(new)
    by_n = {block["n"]: block for block in merged["sizes"]}
    fresh_sizes = set(by_n)
    for block in old["sizes"]:
        fresh = by_n.get(block["n"])
        if fresh is None:
            by_n[block["n"]] = _kept(block, run)
            continue
        missing = [name for name in block["contenders"] if name not in fresh["contenders"]]
        for name in missing:
            fresh["contenders"][name] = _kept(block["contenders"][name], block.get("from_run", run))
        if missing:
            fresh["ratios"] = size_ratios(fresh["contenders"])
    merged["sizes"] = [by_n[n] for n in sorted(by_n)]
    # Notes start with "N=<n>:"; an old note stays when its N was not measured again.
    merged["notes"] = list(new["notes"]) + [
        note
        for note in old["notes"]
        if note not in new["notes"] and not any(note.startswith(f"N={n:,}:") for n in fresh_sizes)
    ]
    return merged


def merge_results(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new` over `old`: see the module docstring. Neither argument is modified."""
    meta = old["meta"]
    run = {"date": meta["date"], "git": meta["git"], "command": meta["command"]}
    merged: dict[str, Any] = {"meta": copy.deepcopy(new["meta"])}
    if "w1" in new and "w1" in old:
        merged["w1"] = _merge_w1(old["w1"], new["w1"], run)
    elif "w1" in old:
        merged["w1"] = {**old["w1"], "settings": [_kept(e, run) for e in old["w1"]["settings"]]}
    if "w2" in new and "w2" in old:
        merged["w2"] = _merge_w2(old["w2"], new["w2"], run)
    elif "w2" in old:
        merged["w2"] = {**old["w2"], "sizes": [_kept(b, run) for b in old["w2"]["sizes"]]}
    for part in ("w1", "w2"):
        if part in new and part not in merged:
            merged[part] = copy.deepcopy(new[part])
    if "idle" in new:
        merged["idle"] = copy.deepcopy(new["idle"])
    elif "idle" in old:
        merged["idle"] = _kept(old["idle"], run)
    return merged


def earlier_runs(results: dict[str, Any]) -> list[tuple[dict[str, str], list[str]]]:
    """Each earlier run a merged JSON holds rows of, with the labels of those rows."""
    found: dict[tuple[str, str, str], list[str]] = {}

    def note(entry: dict[str, Any], label: str) -> None:
        run = entry.get("from_run")
        if run is not None:
            found.setdefault((run["date"], run["git"], run["command"]), []).append(label)

    for entry in results.get("w1", {}).get("settings", []):
        note(entry, entry["setting"]["name"])
        for name, contender in entry["contenders"].items():
            note(contender, f"{entry['setting']['name']} ({name})")
    for block in results.get("w2", {}).get("sizes", []):
        note(block, f"W2 N={block['n']:,}")
        for name, contender in block["contenders"].items():
            note(contender, f"W2 N={block['n']:,} ({name})")
    if "idle" in results:
        note(results["idle"], "idle")
    return [
        ({"date": date, "git": git, "command": command}, labels)
        for (date, git, command), labels in found.items()
    ]
