"""The most expirations per second one core sustains with p99 expiry lateness <= 5 ms.

Each contender (ours, A-lean) runs on a real asyncio loop at a series of offered rates: requests
arrive at the rate R (watched in 1 ms batches, on keys of their own, never completed), each
expires `TIMEOUT` later, so in the steady state the loop watches and expires R requests a second.
At each rate it records how late every expiry ran (the first `TIMEOUT` plus a quarter of the
offer is warm-up, not counted) and takes the p99. The rate doubles until the p99 passes the
limit, then a bisection narrows the largest rate that stays within it.

Why: at a rate the core cannot serve, lateness grows without bound (the queue of due work only
grows), so a p99 at such a rate measures how long the run lasted, not the purgatory. The
sustained rate is what one core can do; the same search for A-lean (a ``loop.call_at`` per
request) puts it beside what a plain asyncio user gets. Wall-clock figures on a shared machine
move between runs: compare the two contenders of one run.
"""

from __future__ import annotations

import asyncio
import gc
import math
from collections.abc import Callable
from typing import Any

from .baselines import LeanFutureTimer
from .config import Config
from .measure import figure, lateness_ms
from .ours import OursTarget

__all__ = ("run", "sustained_rate")

TIMEOUT = 0.5
LIMIT_MS = 5.0
START_RATE = 10_000.0

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


def _p99_ms(make: Factory, rate: float, seconds: float, timeout: float) -> float:
    """The p99 lateness (ms) of one offer; infinite when nothing expired in the counted part."""
    gc.collect()
    p99 = lateness_ms(asyncio.run(_offer(make, rate, seconds, timeout)))["p99"]
    return math.inf if p99 is None else p99


def sustained_rate(
    make: Factory,
    *,
    seconds: float,
    timeout: float,
    limit_ms: float,
    start: float,
    steps: int,
    say: Callable[[str], None],
) -> tuple[float, list[tuple[float, float | None]]]:
    """The largest rate found with p99 lateness <= `limit_ms`, and every (rate, p99) tried
    (``None``: nothing expired in the counted part of the offer)."""
    tried: list[tuple[float, float | None]] = []

    def within(rate: float) -> bool:
        p99 = _p99_ms(make, rate, seconds, timeout)
        tried.append((rate, None if math.isinf(p99) else p99))
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


def run(config: Config, log: Callable[[str], None]) -> dict[str, Any]:
    """The sustained rate of each contender, and every (rate, p99) its search tried."""
    rates: dict[str, float] = {}
    tried: dict[str, list[tuple[float, float | None]]] = {}
    for name, make in CONTENDERS.items():
        log(f"  expiry rate, {name}:")
        rates[name], tried[name] = sustained_rate(
            make,
            seconds=config.expiry_rate_seconds,
            timeout=TIMEOUT,
            limit_ms=LIMIT_MS,
            start=START_RATE,
            steps=config.expiry_rate_steps,
            say=log,
        )
    return {
        "limit_ms": LIMIT_MS,
        "timeout_s": TIMEOUT,
        "seconds": config.expiry_rate_seconds,
        "rates": rates,
        "tried": tried,
        "figures": {
            f"expiry rate {name}": figure([rate], "/s", "higher") for name, rate in rates.items()
        },
    }
