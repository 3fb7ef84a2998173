"""The CPU of one expiry inside a timer pass, without an event loop.

``python -m benchmarks.expiry_cost [--n 200000] [--repeat 3]`` watches N operations on keys of
their own with deadlines uniform over one second (10 s away, so they cascade first, as in W2 at
large N), completes a seeded half by key, moves a `ManualClock` to just before the first deadline
(cascades and purges happen there), then walks 1 ms ticks over the second of deadlines and
prints the CPU microseconds per expired operation of that walk (best of ``--repeat``).

Why: W2 at 1e6 has 500,000 expirations due within one second, so the reaper keeps up only if an
expiry, the loop's wake-ups included, costs under about 2 us; W2's own ``expire_us`` also counts
the idle loop and the work before the window. This isolates the timer pass, so two versions of
the core can be compared on the same machine in the same hour.
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from purgatory import DelayedOperationPurgatory
from purgatory.testing import ManualClock

from .ours import FlagOp

__all__ = ("main", "measure")


def measure(n: int, seed: int = 1) -> tuple[float, int]:
    """CPU microseconds per expired operation of the walk, and how many expired."""
    rng = random.Random(seed)
    clock = ManualClock()
    purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory("expiry", clock=clock)
    ops = []
    for key in range(n):
        op = FlagOp(10.0 + rng.random())
        purgatory.try_complete_else_watch(op, (key,))
        ops.append(op)
    for key in rng.sample(range(n), n // 2):
        ops[key].ready = True
        purgatory.check_and_complete(key)
    del ops
    clock.advance(9.9)
    gc.collect()
    started = time.process_time()
    expired = 0
    for _ in range(1200):
        expired += clock.advance(0.001)
    return (time.process_time() - started) / expired * 1e6, expired


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.expiry_cost")
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    runs = [measure(args.n) for _ in range(args.repeat)]
    expired = runs[0][1]
    best = min(us for us, _ in runs)
    print(f"{best:.2f} us of CPU per expired operation ({expired:,} of {args.n:,} expired)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
