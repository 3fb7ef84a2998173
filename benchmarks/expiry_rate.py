"""The most expirations per second one core sustains with p99 expiry lateness <= 5 ms.

``python -m benchmarks.expiry_rate [--seconds 3] [--timeout 0.5] [--limit-ms 5]`` runs each
contender (ours, A-lean) on a real asyncio loop at a series of offered rates: requests arrive at
the rate R (watched in 1 ms batches, on keys of their own, never completed), each expires
`--timeout` later, so in the steady state the loop watches and expires R requests a second. At
each rate it records how late every expiry ran (the first `--timeout` plus a quarter of the run
is warm-up, not counted) and reports the p99. The rate doubles until the p99 passes the limit,
then a bisection narrows the largest rate that stays within it.

Why: at a rate the core cannot serve, lateness grows without bound (the queue of due work only
grows), so a p99 at such a rate measures how long the run lasted, not the purgatory. The
sustained rate is what one core can do; the same search for A-lean (a ``loop.call_at`` per
request) puts it beside what a plain asyncio user gets. Wall-clock figures on a shared machine
move between runs: compare the two contenders of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import math
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .baselines import LeanFutureTimer
from .ours import OursTarget

__all__ = ("load", "main", "p99_lateness_ms", "sustained_rate", "target_row")

RESULTS_JSON = Path(__file__).with_name("expiry_rate.json")

Factory = Callable[[], Any]
CONTENDERS: dict[str, Factory] = {"ours": OursTarget, "A-lean": LeanFutureTimer}


async def _offer(make: Factory, rate: float, seconds: float, timeout: float) -> list[float]:
    """Offer `rate` requests a second for `seconds`; the lateness of every counted expiry."""
    target = make()
    loop = asyncio.get_running_loop()
    submit = target.submit
    start = loop.time()
    sent = 0
    counted_from = start + timeout + seconds / 4
    inf = math.inf
    try:
        while True:
            now = loop.time()
            if now - start >= seconds:
                break
            due = int((now - start) * rate)
            while sent < due:
                submit((sent,), timeout, now + timeout, inf)
                sent += 1
            await asyncio.sleep(0.001)
        await asyncio.sleep(timeout + 0.05)
        while target.pending():
            await asyncio.sleep(0.01)
    finally:
        await target.close()
    # Lateness in expiry order; the expiries before `counted_from` are the warm-up.
    lateness: list[float] = target.expiry_lateness
    skip = int(max(0.0, counted_from - start - timeout) * rate)
    return lateness[skip:]


def p99_lateness_ms(lateness: Sequence[float]) -> float:
    """The 99th percentile of `lateness` (seconds), in milliseconds."""
    if not lateness:
        return math.inf
    ordered = sorted(lateness)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


def _measure(make: Factory, rate: float, seconds: float, timeout: float) -> float:
    gc.collect()
    lateness = asyncio.run(_offer(make, rate, seconds, timeout))
    return p99_lateness_ms(lateness)


def sustained_rate(
    make: Factory,
    *,
    seconds: float,
    timeout: float,
    limit_ms: float,
    start: float = 10_000,
    steps: int = 4,
    say: Callable[[str], None] = print,
) -> tuple[float, list[tuple[float, float]]]:
    """The largest rate found with p99 lateness <= `limit_ms`, and every (rate, p99) tried."""
    tried: list[tuple[float, float]] = []

    def within(rate: float) -> bool:
        p99 = _measure(make, rate, seconds, timeout)
        tried.append((rate, p99))
        say(f"  {rate:>9,.0f}/s  p99 {p99:8.2f} ms")
        return p99 <= limit_ms

    low, high = 0.0, start
    while within(high):
        low, high = high, high * 2
    for _ in range(steps):
        middle = (low + high) / 2
        if within(middle):
            low = middle
        else:
            high = middle
    return low, tried


def load() -> dict[str, Any] | None:
    """The committed figures, if any."""
    if not RESULTS_JSON.exists():
        return None
    results: dict[str, Any] = json.loads(RESULTS_JSON.read_text())
    return results


def target_row(results: dict[str, Any]) -> list[str]:
    """The targets table's row: the rate each contender sustains, ours beside A-lean's."""
    rates = results["rates"]
    ours, lean = rates.get("ours"), rates.get("A-lean")
    measured = f"ours {ours:,.0f}/s" if ours is not None else "ours not measured"
    if lean:
        measured += f", A-lean {lean:,.0f}/s"
        if ours is not None:
            measured += f" ({ours / lean:.2f}x)"
    measured += f" (`benchmarks.expiry_rate`, {results['date']})"
    return [
        f"Expirations per second one core sustains with p99 lateness <= {results['limit_ms']:g} ms",
        "reported, beside A-lean",
        measured,
        "reported",
    ]


def _write(args: argparse.Namespace, found: dict[str, float], tried: dict[str, Any]) -> None:
    from .report import render_markdown

    here = Path(__file__).parent
    results = load() or {"rates": {}, "tried": {}}
    results.update(
        date=datetime.date.today().isoformat(),
        python=platform.python_version(),
        limit_ms=args.limit_ms,
        seconds=args.seconds,
        timeout=args.timeout,
    )
    results["rates"].update(found)
    results["tried"].update(tried)
    RESULTS_JSON.write_text(json.dumps(results, indent=2) + "\n")
    main_results = json.loads((here / "results.json").read_text())
    (here / "RESULTS.md").write_text(render_markdown(main_results, "w2.png"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.expiry_rate",
        description="The most expirations per second one core sustains within a p99 lateness.",
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="offer length per rate (3)")
    parser.add_argument("--timeout", type=float, default=0.5, help="request timeout, s (0.5)")
    parser.add_argument("--limit-ms", type=float, default=5.0, help="p99 lateness limit (5)")
    parser.add_argument("--start", type=float, default=10_000, help="first rate tried (10,000)")
    parser.add_argument("--steps", type=int, default=4, help="bisection steps (4)")
    parser.add_argument(
        "--contenders", nargs="+", choices=sorted(CONTENDERS), default=list(CONTENDERS)
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"keep the figures in {RESULTS_JSON.name} and the target row in RESULTS.md",
    )
    args = parser.parse_args(argv)
    found: dict[str, float] = {}
    tried: dict[str, Any] = {}
    for name in args.contenders:
        print(f"{name}:", flush=True)
        began = time.monotonic()
        found[name], tried[name] = sustained_rate(
            CONTENDERS[name],
            seconds=args.seconds,
            timeout=args.timeout,
            limit_ms=args.limit_ms,
            start=args.start,
            steps=args.steps,
            say=lambda line: print(line, flush=True),
        )
        print(f"  sustained {found[name]:,.0f}/s ({time.monotonic() - began:.0f} s)", flush=True)
    if "ours" in found and "A-lean" in found and found["A-lean"]:
        print(f"ours / A-lean: {found['ours'] / found['A-lean']:.2f}x")
    if args.write:
        _write(args, found, tried)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
