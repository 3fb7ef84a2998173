"""W1's traffic in virtual time: the purgatory's own cost per request, by mode, without a loop.

``python -m benchmarks.w1_virtual [--requests 150000] [--rate 40000] [--repeat 3]`` drives W1's
requests (the same pools as ``benchmarks.w1``: Poisson arrivals, log-normal completion latency,
3 keys of the key space, 200 ms timeout) through a `DelayedOperationPurgatory` on a
`purgatory.testing.ManualClock`, synchronously: the clock moves to each arrival and each
completion in time order, expiring what falls due on the way. Per setting (W1-force, W1-key,
W1-threshold at 20/60 ms, with 100 and 100,000 keys) it prints CPU microseconds per request
(best of ``--repeat``).

Why it exists beside W1: W1's figure is a sustained rate on a real loop, which moves by 10-35 %
between runs on a shared machine, and includes the loop and the generator. Here nothing but the
purgatory and a small driver runs, so differences between modes are the purgatory's, and the
same script under ``valgrind --tool=callgrind`` gives instruction counts that do not depend on
the machine's load (``--requests`` at two sizes, subtracted, removes the set-up). The driver's
own work (the ``ManualClock`` moves, the pools) is the same in every mode: compare differences.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import time
from collections.abc import Hashable

from purgatory import DelayedOperationPurgatory, PurgatoryStatistics
from purgatory.testing import ManualClock

from .ours import FlagOp
from .w1 import POOL_SIZE, TIMEOUT, W1Setting, make_pools

__all__ = ("main", "run")


def run(
    setting: W1Setting, requests: int, rate: float, seed: int = 1
) -> tuple[float, PurgatoryStatistics]:
    """Drive `requests` requests of `setting` at `rate` per virtual second.

    Returns:
        CPU microseconds per request, and the purgatory's statistics at the end (requests
        still pending at the end are neither completed nor expired).
    """
    pools = make_pools(setting, seed)
    mask = POOL_SIZE - 1
    clock = ManualClock()
    purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory("virtual", clock=clock)
    watch = purgatory.try_complete_else_watch
    check = purgatory.check_and_complete
    advance = clock.advance
    mode = setting.mode
    completions: list[tuple[float, int, FlagOp, Hashable]] = []
    gc.collect()
    started = time.process_time()
    at = 0.0
    for i in range(requests):
        at += pools.gaps[i & mask] / rate
        while completions and completions[0][0] <= at:
            due, _, op, first_key = heapq.heappop(completions)
            if due > clock.now():
                advance(due - clock.now())
            op.ready = True
            if mode == "force":
                op.force_complete()
            elif mode == "key":
                check(first_key)
            else:
                check(first_key, due)
        if at > clock.now():
            advance(at - clock.now())
        keys = pools.keys[(i * 13 + 2) & mask]
        latency = pools.latencies[(i * 7 + 1) & mask]
        op = FlagOp(TIMEOUT)
        if mode == "threshold":
            watch(op, dict.fromkeys(keys, at + latency))
        else:
            watch(op, keys)
        if latency < TIMEOUT:
            heapq.heappush(completions, (at + latency, i, op, keys[0]))
    return (time.process_time() - started) / requests * 1e6, purgatory.statistics()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.w1_virtual")
    parser.add_argument("--requests", type=int, default=150_000)
    parser.add_argument("--rate", type=float, default=40_000.0, help="arrivals per virtual s")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keys", default="100,100000", help="key spaces, comma-separated")
    parser.add_argument("--modes", default="force,key,threshold")
    args = parser.parse_args(argv)
    print(f"W1 in virtual time: {args.requests:,} requests at {args.rate:,.0f}/s, 20/60 ms")
    print(f"{'setting':<34} {'CPU us/request':>15}")
    for key_space in (int(k) for k in args.keys.split(",")):
        for mode in args.modes.split(","):
            setting = W1Setting(mode, 20, 60, key_space)
            best = min(run(setting, args.requests, args.rate)[0] for _ in range(args.repeat))
            print(f"{setting.name:<34} {best:>15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
