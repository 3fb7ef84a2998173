"""``python -m benchmarks``: run the suite and write one results file of one commit.

Examples::

    python -m benchmarks                        # every workload (about an hour)
    python -m benchmarks --quick                # smoke run of every workload
    python -m benchmarks --only w1-threshold,eventlog --output before.json
    python -m benchmarks compare before.json after.json
    python -m benchmarks report run.json --markdown RESULTS.md --plot w2.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .config import FULL, QUICK, Config
from .environment import describe_environment, load_average
from .workloads import ALIASES, WORKLOADS, Workload, select

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs"
"""Where a run writes its results file unless told otherwise (ignored by git)."""


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(float(part)) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N values like 1000,1e5, got {text!r}") from None
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError(f"every N must be >= 2, got {text!r}")
    return sizes


def _only(text: str) -> tuple[Workload, ...]:
    try:
        return select(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _epilog() -> str:
    width = max(len(w.name) for w in WORKLOADS)
    lines = ["workloads (all by default; --only picks some):"]
    lines += [f"  {w.name:<{width}}  {w.summary}" for w in WORKLOADS]
    lines += ["", "aliases: " + "; ".join(f"{k} = {','.join(v)}" for k, v in ALIASES.items())]
    lines += [
        "",
        "other commands:",
        "  python -m benchmarks compare A.json B.json   two runs side by side",
        "  python -m benchmarks report RUN.json [--markdown OUT.md] [--plot OUT.png]",
    ]
    return "\n".join(lines)


_OVERRIDES: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("repeat", int, "repetitions after the warm-up (default 5)"),
    ("seed", int, "seed of every random draw (default 1)"),
    ("sizes", _sizes, "W2 values of N, e.g. 1000,1e4,1e5"),
    ("big_repeat", int, "W2 repetitions at N >= 1e6"),
    ("c_max_n", int, "largest N baseline C runs at (1e5)"),
    ("parked_n", lambda text: _sizes(text)[0], "operations parked at once in 'parked' (1e6)"),
    ("probe_seconds", float, "W1 schedule length of one probe"),
)
"""The `Config` fields an option of the same name overrides: (field, type, help)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="purgatory's benchmark suite: W1 (Kafka's TestPurgatoryPerformance), W2 "
        "(pending-count scaling) and the rest against hand-written asyncio baselines A, A-lean, "
        "A-heap, B, C and the Floor. A run writes one results file (figures with their spread) "
        "and prints its report.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: short, few repetitions")
    parser.add_argument("--only", type=_only, metavar="W[,W...]", help="run only these workloads")
    parser.add_argument(
        "--output",
        type=Path,
        help="results file (default benchmarks/runs/<date>-<commit>[-quick].json)",
    )
    for field, kind, what in _OVERRIDES:
        parser.add_argument(f"--{field.replace('_', '-')}", type=kind, help=what)
    return parser


def _config(args: argparse.Namespace) -> Config:
    base = QUICK if args.quick else FULL
    config = base.with_overrides(**{field: getattr(args, field) for field, _, _ in _OVERRIDES})
    if config.repeat < 1 or config.big_repeat < 1:
        raise SystemExit("--repeat and --big-repeat must be >= 1")
    return config


def log(message: str) -> None:
    """Progress, to stderr: stdout carries the report."""
    print(message, file=sys.stderr, flush=True)


def default_output(meta: dict[str, Any], quick: bool) -> Path:
    """``runs/<UTC date and time>-<commit>[-dirty][-quick].json``: names sort by time."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    suffix = ("-dirty" if meta["dirty"] else "") + ("-quick" if quick else "")
    return RUNS / f"{stamp}-{meta['commit']}{suffix}.json"


def run(workloads: Sequence[Workload], config: Config, output: Path | None) -> int:
    """Run `workloads` in order, writing the results file after each; 1 if any failed."""
    from .contenders import DESCRIPTIONS

    meta = describe_environment()
    meta["config"] = config.as_dict()
    meta["contenders"] = DESCRIPTIONS
    meta["seconds"] = {}  # per workload
    results: dict[str, Any] = {"meta": meta, "workloads": {}, "failed": {}}
    path = output or default_output(meta, config.quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for workload in workloads:
        log(f"== {workload.name}: {workload.summary}")
        began = time.perf_counter()
        try:
            found = workload.run(config, log)
        except Exception as error:  # noqa: BLE001 - recorded; the other workloads still run
            log(traceback.format_exc())
            results["failed"][workload.name] = f"{type(error).__name__}: {error}"
        else:
            results["workloads"][workload.name] = found
        meta["seconds"][workload.name] = time.perf_counter() - began
        meta["elapsed_s"] = time.perf_counter() - started
        meta["load_after"] = load_average()
        path.write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
    from .report import render

    print(render(results))
    log(f"wrote {path}")
    for name, reason in results["failed"].items():
        log(f"FAILED {name}: {reason}")
    return 1 if results["failed"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["compare"]:
        from .compare import main as compare

        return compare(argv[1:])
    if argv[:1] == ["report"]:
        from .report import main as report

        return report(argv[1:])
    args = _parser().parse_args(argv)
    return run(args.only or WORKLOADS, _config(args), args.output)


if __name__ == "__main__":
    sys.exit(main())
