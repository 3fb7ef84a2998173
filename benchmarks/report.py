"""One run's report: Markdown tables and the W2 figure, from its results file alone.

``python -m benchmarks report RESULTS.json [--markdown OUT.md] [--plot OUT.png]`` renders a
saved run without measuring anything; a run prints the same Markdown at its end. The targets
table states the project's current goals against this run's figures, and nothing else.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .contenders import DESCRIPTIONS, PAIRS
from .eventlog import GOAL_US, WRITERS
from .measure import spread
from .w2 import size_ratios
from .workloads import WORKLOADS

__all__ = ("cell", "main", "plot_w2", "render", "table")


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or (isinstance(value, float) and abs(value) >= 1_000):
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _ratio(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}x"


def cell(summary: dict[str, Any] | None, digits: int = 2) -> str:
    """A spread as ``median [min, max]`` (the median alone when there is one value)."""
    if not summary or not summary.get("n"):
        return "-"
    median = _num(summary["median"], digits)
    if summary["n"] == 1:
        return median
    return f"{median} [{_num(summary['min'], digits)}, {_num(summary['max'], digits)}]"


def _triple(summary: dict[str, Any] | None, digits: int = 1) -> str:
    if not summary:
        return "-"
    return " / ".join(_num(summary.get(q), digits) for q in ("p50", "p99", "max"))


def table(header: str, rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table; `header` names its columns as ``"a | b | c"``."""
    lines = [f"| {header} |", "|" + "---|" * (header.count(" | ") + 1)]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return lines


def _median(summary: dict[str, Any] | None) -> float | None:
    return None if not summary else summary.get("median")


# -- the sections, one per kind of workload ---------------------------------------------------


def ratio_cell(summary: dict[str, Any] | float | None) -> str:
    """A ratio's spread as ``1.23x [1.10, 1.40]`` (``1.23x`` alone from one value)."""
    if summary is None or isinstance(summary, int | float):
        return _ratio(summary)
    if not summary.get("n"):
        return "-"
    median = _ratio(summary["median"])
    if summary["n"] == 1:
        return median
    return f"{median} [{summary['min']:.2f}, {summary['max']:.2f}]"


def legacy_w1(w1: dict[str, Any]) -> dict[str, Any]:
    """A W1 result of the earlier procedure (one rate search per contender, then confirmation
    probes at that rate) in today's shape: one round each, no common rate, marked ``legacy`` so
    that no goal is judged on it. Results of the current procedure come back unchanged."""
    settings = []
    for entry in w1["settings"]:
        if all("rates" in c for c in entry["contenders"].values()):
            settings.append(entry)
            continue
        contenders = {
            who: {
                **c,
                "rates": spread([c["max_rate"]]),
                "rounds": 1,
                "common_rate": None,
                "common_passes": None,
                "cpu_common": spread([]),
                "gc_longest_s": spread([]),
            }
            for who, c in entry["contenders"].items()
        }
        ratios = {
            label: spread([value]) for label, value in entry["ratios"].items() if value is not None
        }
        settings.append(
            {
                **entry,
                "contenders": contenders,
                "ratios": ratios,
                "common_rate": None,
                "legacy": True,
            }
        )
    return {**w1, "settings": settings}


LEGACY_W1 = (
    "This run predates the current procedure: one rate search per contender (a single failed "
    "probe capped it) and confirmation probes at that rate, against the earlier baseline A, "
    "which unlinked a finished waiter from each of its keys with `list.remove`; its rates have "
    "no spread, and no goal is judged on them."
)


def _w1(name: str, w1: dict[str, Any]) -> list[str]:
    w1 = legacy_w1(w1)
    criteria = w1["criteria"]
    rounds = w1.get("rounds", "the")
    step = f"{w1['bracket_step']:g}x" if "bracket_step" in w1 else "a few per cent"
    out = [
        f"## {name.replace('w1', 'W1')}: Kafka's TestPurgatoryPerformance, asyncio edition",
        "",
        f"Open-loop Poisson arrivals, timeout {w1['timeout_s'] * 1e3:.0f} ms, "
        f"{w1['keys_per_request']} keys per request, log-normal completion latency "
        "(p50/p75 in ms). *max rate*: the highest rate sustained (generator achieved >= "
        f"{criteria['min_achieved']:.0%} of the target rate, p99 lag < "
        f"{criteria['max_lag_p99_ms']:.0f} ms), found in each of {rounds} rounds interleaved "
        "across contenders (a probe at the last rate found, then one step up while probes pass "
        f"or down while they fail, steps of {step}): median [min, max] over the rounds. CPU is "
        "`time.process_time` per million requests, driver included (the same for all): at each "
        "round's own max rate, and at the *common rate*, "
        f"{w1.get('common_share', 0.8):.0%} of the lowest rate any contender's search found, the "
        "same rate and traffic for every contender, so that the CPU ratio compares equal work. "
        "The other figures are medians of the common-rate probes: lateness in ms (p50 / p99 / "
        "max), GC seconds per probe and the longest collection.",
        "",
    ]
    if any(entry.get("legacy") for entry in w1["settings"]):
        out += [LEGACY_W1, ""]
    rows = [
        [
            entry["setting"]["name"],
            who,
            cell(c["rates"], 0),
            cell(c["cpu_s_per_million"]),
            cell(c["cpu_common"]),
            "-" if c["common_passes"] is None else f"{c['common_passes']}/{c['rounds']}",
            _num(_median(c["peak_watched"]), 0),
            _triple(c["completion_lateness_ms"]),
            _triple(c["expiry_lateness_ms"]),
            _num(_median(c["gc_s"]), 3),
            _num(_ms(_median(c["gc_longest_s"])), 1),
        ]
        for entry in w1["settings"]
        for who, c in _in_order(entry["contenders"])
    ]
    out += table(
        "setting | who | max rate /s | CPU s / M req at max rate | CPU s / M req at the common "
        "rate | common-rate passes | peak watched | completion late ms | expiry late ms | "
        "GC s / probe | longest GC ms",
        rows,
    )
    labels: list[str] = []
    for entry in w1["settings"]:
        labels += [label for label in entry["ratios"] if label not in labels]
    out += [
        "",
        "Ratios, median [min, max] over the rounds, each baseline against ours on the same loop "
        "(round i against round i; > 1 means ours is better): `rate ours/X` of the max rates, "
        "`cpu X/ours` of CPU per request at the common rate.",
        "",
    ]
    out += table(
        " | ".join(["setting", "common rate /s", *labels]),
        (
            [entry["setting"]["name"], _num(entry.get("common_rate"), 0)]
            + [ratio_cell(entry["ratios"].get(label)) for label in labels]
            for entry in w1["settings"]
        ),
    )
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


EARLIER_DESCRIPTIONS: dict[str, str] = {
    **{name: text for name, text in DESCRIPTIONS.items() if name != "ours-uvloop"},
    "A": "asyncio.Future + loop.call_later + dict[key, list[waiter]] (asyncio loop), a finished "
    "waiter unlinked from each of its keys' lists with list.remove",
    "A-lean": "the leanest asyncio version: per request a tuple (threshold, Future, TimerHandle "
    "of loop.call_at) in a list per key, the condition checked inline, no class of its own",
}
"""Who ran in a results file written before runs recorded their contenders' descriptions."""


def _in_order(contenders: dict[str, Any]) -> list[tuple[str, Any]]:
    """Contenders in the order of DESCRIPTIONS (ours, A, ..., Floor), unknown ones last."""
    order = list(DESCRIPTIONS)
    return sorted(
        contenders.items(),
        key=lambda item: order.index(item[0]) if item[0] in order else len(order),
    )


def _w2_size(block: dict[str, Any]) -> list[str]:
    margins = [r["margin_ms"] for c in block["contenders"].values() for r in c.get("reps", [])]
    margin = f"; margin {min(margins) / 1e3:.2g}-{max(margins) / 1e3:.2g} s" if margins else ""
    user = block["user_object_bytes"]
    out = [
        f"### N = {block['n']:,} ({block['repetitions']} repetitions{margin})",
        "",
        f"The user's own object (a slotted request with its timeout, deadline and flag) takes "
        f"{user:.0f} bytes; *beyond the user's object* subtracts it.",
        "",
    ]
    rows = []
    for name, c in _in_order(block["contenders"]):
        if "skipped" in c:
            rows.append([name, c["skipped"], "", "", "", "", "", "", ""])
            continue
        s = c["summary"]
        bytes_per_op = c["memory"]["bytes_per_op"]
        rows.append(
            [
                name,
                cell(s["schedule_us"]),
                cell(s["complete_us"]),
                cell(s["expire_us"]),
                _num(bytes_per_op, 0),
                _num(bytes_per_op - user, 0),
                " / ".join(_num(_median(s["lateness_ms"][q])) for q in ("p50", "p99", "max"))
                if s["expire_us"]["n"]
                else "-",
                _num(s["gc_s"]["schedule"], 3),
                _num(_ms(_median(s.get("gc_longest_s"))), 1),
            ]
        )
    out += table(
        "who | schedule us | complete us | expire us | bytes / op | beyond the user's object | "
        "expiry late ms | GC s | longest GC ms",
        rows,
    )
    overruns = [
        f"{name} {c['summary']['max_overrun_ms']:.0f} ms"
        for name, c in block["contenders"].items()
        if "summary" in c and c["summary"]["max_overrun_ms"] > 0
    ]
    if overruns:
        out += [
            "",
            "Phases 1-2 overran the margin in some repetition (some deadlines passed before "
            "the completions ended): " + ", ".join(overruns) + ".",
        ]
    return [*out, ""]


def _w2(name: str, w2: dict[str, Any]) -> list[str]:
    low, high = w2["timeouts_s"]
    out = [
        "## W2: pending-count scaling",
        "",
        f"N operations pending at once, timeouts uniform in [{low * 1e3:.0f} ms, {high:.0f} s] "
        f"after all N are pending; {w2['keys']}; a seeded random half completed early by key, "
        "the other half left to expire. Costs are CPU microseconds per operation of the phase, "
        "median [min, max] over the repetitions after the warm-up (the expire phase includes "
        f"the loop's wake-ups). Memory: {w2['memory_method']}. Lateness of expirations in ms: "
        "p50 / p99 / max, medians (negative = early). GC: seconds of cyclic GC in the schedule "
        "phase, and the longest single collection of a repetition (median). The margin (the "
        "wait from the first watch to the moment the [10 ms, 1 s] "
        "window opens, sized to cover phases 1-2) adds to every timeout as seen at its watch "
        "call: at large N the deadlines are seconds away, beyond a 1024 ms first wheel level.",
        "",
    ]
    for block in w2["sizes"]:
        out += _w2_size(block)
    ratios = [(block["n"], w2_ratios(block)) for block in w2["sizes"]]
    columns: list[str] = []
    for _, found in ratios:
        for row in found.values():
            columns += [label for label in row if label not in columns]
    columns.sort(key=lambda label: label.startswith("ours/"))
    labels = {"schedule_us": "schedule", "complete_us": "complete", "expire_us": "expire"}
    out += [
        "Ratios per repetition (repetition i of one against repetition i of the other, which "
        "ran right after it), median [min, max]: baseline / ours on the same loop (> 1 means "
        "ours is cheaper) and ours / Floor (how many times the irreducible work ours costs); "
        "*watch+complete* and *watch+expire* add the schedule cost to the completion's or the "
        "expiry's:",
        "",
        *table(
            " | ".join(["N", "per op", *columns]),
            (
                [f"{n:,}", labels.get(metric, "bytes" if metric == "bytes_per_op" else metric)]
                + [ratio_cell(row.get(label)) for label in columns]
                for n, found in ratios
                for metric, row in found.items()
            ),
        ),
    ]
    return out + (["", *(f"- {note}" for note in w2["notes"])] if w2["notes"] else [])


def w2_ratios(block: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One N's ratios with their spreads; from the repetitions themselves for a result of the
    earlier shape (the ratios of the medians alone)."""
    found: dict[str, dict[str, Any]] = block["ratios"]
    if "watch+complete" in found:
        return found
    return size_ratios(block["contenders"])


def _idle(name: str, idle: dict[str, Any]) -> list[str]:
    def passes(runs: list[dict[str, Any]]) -> str:
        return ", ".join(str(r["timer_passes"]) for r in runs)

    sparse, window = idle["sparse"], _num(idle["window_s"], 1)
    return [
        "## Idle cost: reaper wake-ups",
        "",
        "Timer passes (one per reaper wake-up of the loop, `statistics().timer_passes`), "
        f"asyncio loop, real time, {len(sparse)} repetition(s) of each scenario.",
        "",
        *table(
            "scenario | seconds watched | wake-ups | for comparison",
            [
                ["nothing pending", window, passes(idle["empty"]), "-"],
                ["one operation, 30 s timeout", window, passes(idle["one_far_deadline"]), "-"],
                [
                    f"{sparse[0]['operations']} operations, deadlines over 0.1-2 s",
                    ", ".join(_num(r["seconds"], 2) for r in sparse),
                    passes(sparse),
                    "distinct deadline ticks (due buckets): "
                    + ", ".join(str(r["distinct_deadline_ticks"]) for r in sparse),
                ],
            ],
        ),
    ]


def _expiry_rate(name: str, found: dict[str, Any]) -> list[str]:
    rates = found["rates"]
    rows = [
        [
            who,
            _num(rate),
            ", ".join(f"{r:,.0f}: {_num(p99, 1)}" for r, p99 in found["tried"][who]),
        ]
        for who, rate in rates.items()
    ]
    return [
        "## Expirations per second one core sustains",
        "",
        f"Requests offered at a rate for {found['seconds']:g} s, each expiring "
        f"{found['timeout_s'] * 1e3:.0f} ms later on a key of its own; the largest rate whose "
        f"p99 expiry lateness stays within {found['limit_ms']:g} ms (a search: doubling, then "
        "bisection; one offer per rate).",
        "",
        *table("who | sustained /s | rates tried /s: p99 ms", rows),
    ]


MICRO_TITLES = {
    "w1-virtual": "W1 in virtual time: the purgatory's own CPU per request",
    "expiry-cost": "CPU of one expiry inside a timer pass",
    "steady": "W1's purgatory work per request in a steady state (100 keys, 3 per request)",
}


def _micro(name: str, found: dict[str, Any]) -> list[str]:
    settings = found["pyperf"]
    rows = [
        [
            bench,
            _num(s["median"], 3),
            f"{_num(s['q1'], 3)} - {_num(s['q3'], 3)}",
            f"{_num(s['min'], 3)} - {_num(s['max'], 3)}",
            str(s["n"]),
        ]
        for bench, s in found["us_per_op"].items()
    ]
    return [
        f"## {MICRO_TITLES[name]}",
        "",
        f"pyperf, CPU microseconds per operation: {settings['processes']} worker processes x "
        f"{settings['values']} values after {settings['warmups']} warm-up(s) (see "
        "`benchmarks/micro.py` for the workload).",
        "",
        *table("benchmark | median | q1 - q3 | min - max | values", rows),
    ]


def _eventlog(name: str, found: dict[str, Any]) -> list[str]:
    us = found["us_per_op"]
    base = us["none"]["median"]
    rows = [
        [
            label,
            cell(us[kind], 2),
            _ratio(us[kind]["median"] / base),
            f"{found['own_us_per_op'][kind]:+.2f}",
            _num(found["bytes_per_op"].get(kind), 0),
        ]
        for kind, label in found["recorders"].items()
    ]
    return [
        "## What recording costs",
        "",
        f"Rounds of 1,000 operations on a `ManualClock` purgatory ({found['operations']:,} per "
        "sample; 100 keys, half completed, half expired), timed by pyperf: CPU microseconds per "
        "operation, median [min, max]; a recorder's own cost is its median minus the median "
        "without one.",
        "",
        *table("recorder | us/op | vs none | own us/op | bytes/op", rows),
    ]


def _parked(name: str, found: dict[str, Any]) -> list[str]:
    user = found["user_object_bytes"]
    rows = [
        [
            who,
            _num(c["schedule_us"], 2),
            _num(c["gc_longest_s"] * 1e3, 0),
            _num(c["gc_s"], 2),
            f"{c['gc_collections']} ({c['gc_full_collections']} full)",
            _num(c["bytes_per_op"], 0),
            _num(c["bytes_per_op"] - user, 0),
        ]
        for who, c in _in_order(found["contenders"])
    ]
    return [
        f"## {found['n']:,} operations parked: collector pauses and bytes",
        "",
        f"{found['n']:,} operations scheduled in one burst, each on a key of its own with a "
        f"deadline {found['far_s']:g}-{found['far_s'] + 1:g} s away (nothing expires), the "
        "cyclic GC enabled; every collection timed through `gc.callbacks`. Bytes: traced by "
        "tracemalloc in a second pass, per operation; the user's own object alone takes "
        f"{user:.0f} bytes. One run each.",
        "",
        *table(
            "who | schedule us / op | longest GC pause ms | GC s | collections | bytes / op | "
            "beyond the user's object",
            rows,
        ),
    ]


def _engine(name: str, found: dict[str, Any]) -> list[str]:
    samples = found["samples"]
    return [
        "## The pipeline's replay engine alone",
        "",
        f"The replay engine in this process, no Spark: {found['engine_operations']:,} operations "
        "of the first purgatory of the pipeline's default W1 trace, generated in this process; "
        f"CPU time of a whole replay, {len(samples['none'])} runs each with no event log, a "
        "do-nothing one and `JsonLinesEventLog`, alternated.",
        "",
        *table(
            "figure | value",
            [
                [
                    "operations / s per core, median [min, max]",
                    f"{found['engine_ops_per_core_s']:,.0f} "
                    f"[{found['engine_ops_per_core_s_min']:,.0f}, "
                    f"{found['engine_ops_per_core_s_max']:,.0f}]",
                ],
                ["CPU us / operation", _num(found["engine_us_per_op"], 2)],
                ["with a do-nothing event log, us / op", _num(found["engine_null_us_per_op"], 2)],
                ["with `JsonLinesEventLog`, us / op", _num(found["engine_logged_us_per_op"], 2)],
            ],
        ),
    ]


def _output(name: str, found: dict[str, Any]) -> list[str]:
    argv = " ".join(found["argv"])
    module = name.replace("-", "_")
    return [
        f"## `python -m benchmarks.{module}{' ' + argv if argv else ''}`",
        "",
        "Its output, as printed:",
        "",
        "```text",
        *found["output"].rstrip("\n").splitlines(),
        "```",
    ]


SECTIONS = {
    "w1-force": _w1,
    "w1-key": _w1,
    "w1-threshold": _w1,
    "w2": _w2,
    "parked": _parked,
    "idle": _idle,
    "expiry-rate": _expiry_rate,
    "w1-virtual": _micro,
    "expiry-cost": _micro,
    "steady": _micro,
    "eventlog": _eventlog,
    "instructions": _output,
    "pipeline-engine": _engine,
    "pipeline": _output,
    "load-validation": _output,
}


# -- the goals ----------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


W1_GOALS: dict[tuple[str, int], float] = {
    ("force", 100): 1.5,
    ("threshold", 100): 1.5,
    ("key", 100_000): 1.5,
    ("key", 100): 1.0,
}
"""(mode, key space) -> the least ours/baseline rate wanted against A and against B, on each of
the two traffics; other W1 settings are reported."""


def _w1_goals(workloads: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for name in ("w1-force", "w1-key", "w1-threshold"):
        if name not in workloads:
            continue
        for entry in legacy_w1(workloads[name])["settings"]:
            setting = entry["setting"]
            least = W1_GOALS.get((setting["mode"], setting["key_space"]))
            for baseline in ("A", "B"):
                mine = PAIRS[baseline]
                rate = entry["ratios"].get(f"rate {mine}/{baseline}")
                if rate is None:
                    continue
                cpu = entry["ratios"].get(f"cpu {baseline}/{mine}")
                measured = f"{ratio_cell(rate)} over {rate['n']} round(s)"
                if cpu and cpu.get("n") and not entry.get("legacy"):
                    measured += (
                        f"; CPU {baseline}/{mine} {ratio_cell(cpu)} at "
                        f"{_num(entry.get('common_rate'), 0)}/s"
                    )
                if entry.get("legacy"):
                    wanted, verdict = "-", "not judged: an earlier procedure and baseline A"
                elif least is None:
                    wanted, verdict = "reported", "reported"
                elif not rate["n"]:
                    wanted, verdict = f">= {least}x", "**not judged**: no round found both rates"
                else:
                    wanted, verdict = f">= {least}x", _verdict(rate["median"] >= least)
                loop = "asyncio" if baseline == "A" else "uvloop"
                rows.append(
                    [f"{setting['name']}: rate vs {baseline} ({loop})", wanted, measured, verdict]
                )
    return rows


W2_GOAL_N = 100_000
W2_GOAL = 1.5
"""At `W2_GOAL_N` pending, a watch and its end at least this many times cheaper than A's and
B's; the other sizes are reported."""
LATENESS_GOAL_MS = 5.0


def _w2_goals(w2: dict[str, Any] | None) -> list[list[str]]:
    rows: list[list[str]] = []
    for block in [] if w2 is None else w2["sizes"]:
        n = block["n"]
        ratios = w2_ratios(block)
        for metric in ("watch+complete", "watch+expire"):
            for baseline in ("A", "B"):
                found = ratios.get(metric, {}).get(f"{baseline}/{PAIRS[baseline]}")
                if not found:
                    continue
                judged = n == W2_GOAL_N
                rows.append(
                    [
                        f"W2 N={n:,}: {metric} per operation vs {baseline}",
                        f">= {W2_GOAL}x" if judged else "reported",
                        f"{ratio_cell(found)} ({baseline}/{PAIRS[baseline]}, per repetition)",
                        _verdict(found["median"] >= W2_GOAL) if judged else "reported",
                    ]
                )
        ours = block["contenders"].get("ours", {})
        if n == W2_GOAL_N and "summary" in ours and ours["summary"]["lateness_ms"]["p99"]["n"]:
            p99 = ours["summary"]["lateness_ms"]["p99"]
            rows.append(
                [
                    f"W2 N={n:,}: expiry lateness p99 (ours)",
                    f"<= {LATENESS_GOAL_MS:g} ms",
                    f"{cell(p99)} ms",
                    _verdict(p99["median"] <= LATENESS_GOAL_MS),
                ]
            )
    return rows


PAUSE_GOAL_S = 1.0
"""At a million parked, no collector pause of a second or more while scheduling."""


def _parked_goals(found: dict[str, Any] | None) -> list[list[str]]:
    if found is None or "ours" not in found["contenders"]:
        return []
    ours = found["contenders"]["ours"]
    others = {who: c for who, c in found["contenders"].items() if who != "ours"}
    beside = "".join(
        f"; {who} {c['gc_longest_s']:.2f} s, {c['bytes_per_op']:,.0f} B/op"
        for who, c in others.items()
    )
    return [
        [
            f"{found['n']:,} parked: the longest GC pause while scheduling (ours)",
            f"< {PAUSE_GOAL_S:g} s (no multi-second pause)",
            f"{ours['gc_longest_s']:.2f} s, {ours['bytes_per_op']:,.0f} B/op{beside}",
            _verdict(ours["gc_longest_s"] < PAUSE_GOAL_S),
        ]
    ]


def _engine_goals(found: dict[str, Any] | None) -> list[list[str]]:
    if found is None:
        return []
    goal = found["goal_ops_per_core_s"]
    rate = found["engine_ops_per_core_s"]
    return [
        [
            "The pipeline's replay engine alone: operations per second per core",
            f">= {goal:,.0f}",
            f"{rate:,.0f} [{found['engine_ops_per_core_s_min']:,.0f}, "
            f"{found['engine_ops_per_core_s_max']:,.0f}] ({found['engine_us_per_op']:.2f} us/op)",
            _verdict(rate >= goal),
        ]
    ]


def _eventlog_goals(found: dict[str, Any] | None) -> list[list[str]]:
    if found is None:
        return []
    base = found["us_per_op"]["none"]["median"]
    return [
        [
            f"Event-log recording, {found['recorders'][kind]}",
            f"<= {GOAL_US:g} us per operation",
            f"{own:+.2f} us/op ({found['us_per_op'][kind]['median']:.2f} vs {base:.2f} "
            "without a recorder)",
            _verdict(own <= GOAL_US)
            if own >= 0
            else "**not judged**: cheaper than no recorder, which no recorder is (the machine's "
            "noise); see `benchmarks/INSTRUCTIONS.md`",
        ]
        for kind, own in found["own_us_per_op"].items()
        if kind in WRITERS
    ]


def _idle_goals(idle: dict[str, Any] | None) -> list[list[str]]:
    if idle is None:
        return []
    rows = []
    for key, label in (("empty", "nothing pending"), ("one_far_deadline", "one 30 s deadline")):
        worst = max(r["timer_passes"] for r in idle[key])
        rows.append(
            [
                f"Idle, {label}: wake-ups in {idle['window_s']:g} s",
                "<= 2",
                f"{worst} (the most of {len(idle[key])} runs)",
                _verdict(worst <= 2),
            ]
        )
    sparse = idle["sparse"]
    ok = all(r["timer_passes"] <= 1.1 * r["distinct_deadline_ticks"] + 5 for r in sparse)
    rows.append(
        [
            "Idle, sparse: wake-ups per due bucket",
            "~1 (at most 1.1 per bucket + 5)",
            "; ".join(
                f"{r['timer_passes']} for {r['distinct_deadline_ticks']} buckets "
                f"({r['timer_passes'] / r['distinct_deadline_ticks']:.2f})"
                for r in sparse
            ),
            _verdict(ok),
        ]
    )
    return rows


def _goals(workloads: dict[str, Any]) -> list[str]:
    rows = _w1_goals(workloads) + _w2_goals(workloads.get("w2"))
    rows += _parked_goals(workloads.get("parked")) + _engine_goals(workloads.get("pipeline-engine"))
    rows += _eventlog_goals(workloads.get("eventlog")) + _idle_goals(workloads.get("idle"))
    if not rows:
        return []
    return [
        "## Targets against this run",
        "",
        "The project's current goals, judged on this run's figures only (ratios to baselines "
        "measured in the same run, each baseline against ours on the same event loop): a "
        "verdict reads the median of the per-round (W1) or per-repetition (W2) ratios, whose "
        "[min, max] stands beside it. The instruction-count goals are judged by "
        "`python -m benchmarks.instructions` (the `instructions` workload).",
        "",
        *table("goal | wanted | measured | verdict", rows),
        "",
    ]


# -- the whole report ---------------------------------------------------------------------------


def _header(meta: dict[str, Any]) -> list[str]:
    config = meta["config"]
    lines = [
        "# purgatory benchmark results",
        "",
        "Generated by `python -m benchmarks report` from the results file of one run; do not "
        "edit by hand (see `benchmarks/__init__.py` for what is measured).",
        "",
    ]
    if config["quick"]:
        lines += [
            "**Smoke run (`--quick`)**: short probes and few repetitions, to show that every "
            "workload runs; its figures say little about how fast purgatory is.",
            "",
        ]
    took = meta.get("elapsed_s")
    core = f", the {meta['purgatory_core']} core" if "purgatory_core" in meta else ""
    return [
        *lines,
        f"- Date: {meta['date']}" + (f" (the run took {took / 60:.1f} min)" if took else ""),
        f"- Python: {meta['python']} ({meta['implementation']})",
        f"- Machine: {meta['platform']}, {meta['cpu_count']} CPUs ({meta['cpu_model']}), "
        f"load average {meta['load_before']} before, {meta.get('load_after', '-')} after "
        "(the machine is shared: trust the ratios more than the absolute figures)",
        f"- purgatory {meta['purgatory_version']} at {meta['git']}{core}; uvloop {meta['uvloop']}",
        f"- Mode: {'quick (smoke run)' if config['quick'] else 'full'}, seed {config['seed']}, "
        f"{config['repeat']} repetitions (W2 at N >= 1e6: {config['big_repeat']}); GC enabled",
        f"- Command: `{meta['command']}`",
        "",
    ]


def render(results: dict[str, Any], plot_name: str | None = None) -> str:
    """The whole report of one run: provenance, goals, one section per workload that ran."""
    workloads = results["workloads"]
    lines = _header(results["meta"])
    if workloads.keys() & {"w1-force", "w1-key", "w1-threshold", "w2"}:
        lines += ["Contenders:", ""]
        described = results["meta"].get("contenders", EARLIER_DESCRIPTIONS)
        lines += [f"- **{name}**: {text}" for name, text in described.items()]
        lines.append("")
    lines += _goals(workloads)
    for workload in WORKLOADS:
        if workload.name in workloads:
            lines += [*SECTIONS[workload.name](workload.name, workloads[workload.name]), ""]
    if results.get("failed"):
        lines += ["## Workloads that failed", ""]
        lines += [f"- `{name}`: {error}" for name, error in results["failed"].items()]
        lines.append("")
    if plot_name and "w2" in workloads:
        lines += [f"![W2 cost and lateness against N]({plot_name})", ""]
    return "\n".join(lines)


PANELS = (
    (("summary", "schedule_us", "median"), "schedule (CPU us / op)"),
    (("summary", "complete_us", "median"), "complete (CPU us / op)"),
    (("summary", "expire_us", "median"), "expire (CPU us / op)"),
    (("memory", "bytes_per_op"), "memory (bytes / pending op)"),
    (("summary", "lateness_ms", "p99", "median"), "expiry lateness p99 (ms)"),
    (("summary", "lateness_ms", "max", "median"), "expiry lateness max (ms)"),
)
STYLES = {"ours": "o-", "A": "s--", "A-lean": "D--", "B": "^--", "C": "v:", "Floor": "k.-"}


def _value(entry: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = entry
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value if isinstance(value, int | float) else None


def plot_w2(w2: dict[str, Any], path: Path) -> None:
    """Write the W2 figure (medians against N, log-log) to `path`.

    Raises:
        RuntimeError: matplotlib is not installed.
    """
    if importlib.util.find_spec("matplotlib") is None:
        raise RuntimeError("no plot: matplotlib is not installed (the 'bench' extra)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names: list[str] = []
    for block in w2["sizes"]:
        names += [n for n in block["contenders"] if n not in names]
    figure, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for axis, (path_in_entry, title) in zip(axes.flat, PANELS, strict=True):
        for name in names:
            points = [
                (block["n"], _value(block["contenders"].get(name, {}), path_in_entry))
                for block in w2["sizes"]
            ]
            points = [(n, v) for n, v in points if v is not None and v > 0]
            if points:
                axis.plot(*zip(*points, strict=True), STYLES.get(name, "x-"), label=name)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_title(title)
        axis.set_xlabel("N pending")
        axis.grid(True, which="both", alpha=0.3)
        if axis.lines:
            axis.legend(fontsize="small")
    figure.suptitle("W2: N operations pending at once (medians; log-log)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks report",
        description="Render one run's results file as Markdown (stdout, or --markdown).",
    )
    parser.add_argument("results", type=Path, help="a results file written by a run")
    parser.add_argument("--markdown", type=Path, help="write the report here")
    parser.add_argument("--plot", type=Path, help="write the W2 figure here (and link it)")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    if args.plot is not None:
        if "w2" not in results["workloads"]:
            parser.error(f"{args.results} has no W2 results to plot")
        plot_w2(results["workloads"]["w2"], args.plot)
    text = render(results, None if args.plot is None else args.plot.name)
    if args.markdown is None:
        print(text)
    else:
        args.markdown.write_text(text)
        print(f"wrote {args.markdown}" + (f" and {args.plot}" if args.plot else ""))
    return 0
