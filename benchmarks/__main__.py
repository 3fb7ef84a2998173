"""``python -m benchmarks``: run W1, W2 and idle; print the tables, write JSON, RESULTS.md, w2.png.

Examples::

    .venv/bin/python -m benchmarks                 # the full run (about 20 minutes)
    .venv/bin/python -m benchmarks --quick         # smoke run; writes *-quick.* files
    .venv/bin/python -m benchmarks --only w2 --sizes 1000,100000 --repeat 3
    .venv/bin/python -m benchmarks --only w1-key,w1-threshold --merge   # re-run some rows only
    .venv/bin/python -m benchmarks --report-only   # re-render RESULTS.md / w2.png from the JSON
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import FULL, QUICK, Config
from .contenders import w1_contenders, w2_contenders
from .environment import describe_environment, load_average
from .idle import run_idle
from .loops import uvloop_available
from .merge import merge_results
from .plot import plot_w2
from .report import render_markdown, render_tables
from .w1 import MODES, default_log, run_w1
from .w2 import run_w2

HERE = Path(__file__).resolve().parent
W1_PARTS = tuple(f"w1-{mode}" for mode in MODES)
WORKLOADS = ("w1", *W1_PARTS, "w2", "floor", "idle")


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(float(part)) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N values like 1000,1e5, got {text!r}") from None
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError(f"every N must be >= 2, got {text!r}")
    return sizes


def _only(text: str) -> tuple[str, ...]:
    chosen = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    unknown = [part for part in chosen if part not in WORKLOADS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"--only takes a comma-separated subset of {', '.join(WORKLOADS)}, got {text!r}"
        )
    return chosen


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="purgatory benchmarks: W1 (Kafka's TestPurgatoryPerformance) and W2 "
        "(pending-count scaling) against hand-written asyncio baselines A, A-lean, B, C and "
        "the Floor.",
    )
    parser.add_argument("--quick", action="store_true", help="short smoke run (about a minute)")
    parser.add_argument(
        "--only",
        type=_only,
        default=("w1", "w2", "idle"),
        help="comma-separated subset of w1, w1-force, w1-key, w1-threshold (W1 settings of "
        "that mode only), w2, floor (W2 for the Floor alone), idle; W2's values of N: --sizes",
    )
    parser.add_argument(
        "--w1-match",
        metavar="REGEX",
        help="run only the W1 settings whose name this finds, e.g. '20/60$' (with --merge)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="fold this run into the existing JSON instead of replacing it: the settings, sizes "
        "and contenders measured now replace theirs, everything else is kept (RESULTS.md says "
        "which rows come from which run)",
    )
    parser.add_argument("--repeat", type=int, help="repetitions after the warm-up (default 5)")
    parser.add_argument("--seed", type=int, help="seed of every random draw (default 1)")
    parser.add_argument("--sizes", type=_sizes, help="W2 values of N, e.g. 1000,1e4,1e5")
    parser.add_argument("--big-repeat", type=int, help="W2 repetitions at N >= 1e6")
    parser.add_argument("--c-max-n", type=int, help="largest N baseline C runs at (1e5)")
    parser.add_argument("--probe-seconds", type=float, help="W1 schedule length of one probe")
    parser.add_argument("--json", type=Path, help="results JSON (default benchmarks/results.json)")
    parser.add_argument("--markdown", type=Path, help="report (default benchmarks/RESULTS.md)")
    parser.add_argument("--plot", type=Path, help="W2 figure (default benchmarks/w2.png)")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="measure nothing: re-render the report and plot from the JSON",
    )
    return parser


def _config(args: argparse.Namespace) -> Config:
    base = QUICK if args.quick else FULL
    config = base.with_overrides(
        repeat=args.repeat,
        seed=args.seed,
        sizes=args.sizes,
        big_repeat=args.big_repeat,
        c_max_n=args.c_max_n,
        probe_seconds=args.probe_seconds,
    )
    if config.repeat < 1 or config.big_repeat < 1:
        raise SystemExit("--repeat and --big-repeat must be >= 1")
    return config


def _paths(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    suffix = "-quick" if args.quick else ""
    return (
        args.json or HERE / f"results{suffix}.json",
        args.markdown or HERE / f"RESULTS{suffix}.md",
        args.plot or HERE / f"w2{suffix}.png",
    )


def _measure(config: Config, only: Sequence[str], w1_match: str | None = None) -> dict[str, Any]:
    log = default_log
    with_uvloop = uvloop_available()
    if not with_uvloop:
        log("uvloop is not installed: baseline B is skipped (pip install uvloop)")
    meta = describe_environment()
    meta["config"] = config.as_dict()
    results: dict[str, Any] = {"meta": meta}
    started = time.perf_counter()
    modes = [mode for mode in MODES if "w1" in only or f"w1-{mode}" in only]
    if modes:
        log("W1: rate search per setting and contender, then confirmation repetitions")
        results["w1"] = run_w1(w1_contenders(with_uvloop), config, log, modes, w1_match)
    if "w2" in only or "floor" in only:
        contenders = w2_contenders(with_uvloop)
        if "w2" not in only:
            contenders = [c for c in contenders if c.name == "Floor"]
        log(f"W2: N in {', '.join(f'{n:,}' for n in config.sizes)}")
        results["w2"] = run_w2(contenders, config, log)
    if "idle" in only:
        log("idle: reaper wake-ups with nothing or little due")
        results["idle"] = run_idle(config.seed)
    meta["elapsed_s"] = time.perf_counter() - started
    meta["load_after"] = load_average()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    json_path, markdown_path, plot_path = _paths(args)
    if args.report_only:
        results = json.loads(json_path.read_text())
    else:
        results = _measure(_config(args), args.only, args.w1_match)
        if args.merge and json_path.exists():
            results = merge_results(json.loads(json_path.read_text()), results)
        json_path.write_text(json.dumps(results, indent=1) + "\n")
        print(render_tables(results))
    plot_name: str | None = None
    if "w2" in results:
        problem = plot_w2(results["w2"], plot_path)
        if problem is None:
            plot_name = plot_path.name
        else:
            print(f"no plot: {problem}", file=sys.stderr)
    markdown_path.write_text(render_markdown(results, plot_name))
    print(f"wrote {json_path}, {markdown_path}" + (f", {plot_path}" if plot_name else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
