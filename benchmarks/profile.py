"""cProfile of our side on the two hottest paths: a W1-key (or W1-threshold) probe and a W2
repetition.

``python -m benchmarks.profile [--mode key] [--rate 50000] [--n 100000] [--top 15]`` prints the
functions with
the most own time (tottime). Profiling slows Python code by about 2x and charges the harness
too (the driver, the W2 loops); read it for where our time goes, not for absolute figures.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .contenders import Contender
from .ours import OursTarget
from .w1 import SETTINGS, make_pools, probe
from .w2 import Workload, run_once

__all__ = ("main",)


def _profiled(title: str, top: int, run: Callable[[], Any]) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        run()
    finally:
        profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.strip_dirs().sort_stats(pstats.SortKey.TIME).print_stats(top)
    print(f"== {title}")
    print(stream.getvalue())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("--mode", choices=("key", "threshold"), default="key", help="W1 mode")
    parser.add_argument("--rate", type=float, default=50_000.0, help="W1 probe rate")
    parser.add_argument("--seconds", type=float, default=2.0, help="W1 probe length")
    parser.add_argument("--keys", type=int, default=100, help="W1 key space (100 or 100000)")
    parser.add_argument("--n", type=int, default=100_000, help="W2 pending operations")
    parser.add_argument("--top", type=int, default=15, help="functions shown per profile")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    ours: Contender[OursTarget] = Contender("ours", "asyncio", OursTarget)
    setting = next(s for s in SETTINGS if s.mode == args.mode and s.key_space == args.keys)
    pools = make_pools(setting, args.seed)
    _profiled(
        f"{setting.name} at {args.rate:,.0f}/s for {args.seconds} s (ours)",
        args.top,
        lambda: probe(ours, setting, pools, rate=args.rate, duration=args.seconds, offset=0),
    )
    work = Workload.make(args.n, args.seed)
    margin = 0.05 + 30e-6 * args.n  # generous: the profiler slows the schedule phase down
    _profiled(
        f"W2 N={args.n:,}: schedule, complete half, expire half (ours)",
        args.top,
        lambda: run_once(ours, work, margin, memory=False),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
