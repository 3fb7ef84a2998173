"""Would expiring in bounded slices lower W2's expiry lateness?

``python -m benchmarks.expiry_slices [--n 1000000] [--repeat 3] [--slice 4096]`` runs W2's
expiry phase for our purgatory alone: N operations on keys of their own, deadlines uniform in
[10 ms, 1 s] after all N are pending, a seeded half completed by key, the other half left to
expire; it reports the lateness of the expirations (the time ``on_expiration`` ran, by
``time.monotonic``, minus watch time + timeout), the CPU per expiry, and how many operations the
reaper's timer passes expired at once. Each repetition runs twice, alternating: as shipped, and
with expiries capped at ``--slice`` per timer pass (the rest of a pass's due operations go back
to the wheel's overdue bucket, and the reaper runs again after one turn of the loop), the way
purges and cascades are sliced. The experiment patches the wheel; the package is unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory._wheel import TimingWheel

__all__ = ("main",)


class Timed(DelayedOperation[None]):
    __slots__ = ("deadline", "lateness", "ready")

    def __init__(self, timeout: float, deadline: float, lateness: list[float]) -> None:
        super().__init__(timeout)
        self.deadline = deadline
        self.lateness = lateness
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> None:
        return None

    def on_expiration(self) -> None:
        self.lateness.append(time.monotonic() - self.deadline)


def sliced_advance(
    advance: Callable[..., list[Any]], limit: int, passes: list[int]
) -> Callable[..., list[Any]]:
    """`TimingWheel.advance`, returning at most `limit` due entries when the reaper drives it."""

    def advance_in_slices(wheel: TimingWheel, now: int, budget: int | None = None) -> list[Any]:
        due = advance(wheel, now, budget)
        if budget is not None and len(due) > limit:
            for entry in due[limit:]:
                wheel.add(entry, entry._deadline)  # due already: the overdue bucket, in order
            due = due[:limit]
        passes.append(len(due))
        return due

    return advance_in_slices


async def one_run(n: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    lateness: list[float] = []
    purgatory = DelayedOperationPurgatory[Timed]("slices")
    margin = 3.0 + n * 6e-6
    start = time.monotonic()
    base = start + margin
    ops = []
    gc.collect()
    for index in range(n):
        deadline = base + rng.uniform(0.010, 1.0)
        op = Timed(deadline - time.monotonic(), deadline, lateness)
        purgatory.try_complete_else_watch(op, (index,))
        ops.append(op)
    for index in rng.sample(range(n), n // 2):
        ops[index].ready = True
        purgatory.check_and_complete(index)
    del ops
    cpu = time.process_time()
    while len(lateness) < n - n // 2 and time.monotonic() < base + 60:
        await asyncio.sleep(0.005)
    cpu = time.process_time() - cpu
    await purgatory.shutdown()
    late = sorted(lateness)
    return {
        "p50_ms": late[len(late) // 2] * 1e3,
        "p99_ms": late[int(len(late) * 0.99)] * 1e3,
        "max_ms": late[-1] * 1e3,
        "early": sum(x < 0 for x in late),
        "cpu_us_per_expiry": cpu / len(late) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--slice", type=int, default=4096)
    args = parser.parse_args()
    original = TimingWheel.advance
    results: dict[str, list[dict[str, float]]] = {"as shipped": [], "sliced": []}
    pass_sizes: dict[str, list[int]] = {"as shipped": [], "sliced": []}
    for rep in range(args.repeat):
        for mode, runs in results.items():
            limit = args.slice if mode == "sliced" else 1 << 62
            patched = sliced_advance(original, limit, pass_sizes[mode])
            TimingWheel.advance = patched  # type: ignore[method-assign]
            try:
                runs.append(asyncio.run(one_run(args.n, seed=rep)))
            finally:
                TimingWheel.advance = original  # type: ignore[method-assign]
            print(f"rep {rep} {mode:10s} {runs[-1]}", flush=True)
    print(f"\nN={args.n:,}, medians of {args.repeat}; expiries per timer pass: max, p99")
    for mode, runs in results.items():
        row = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        sizes = sorted(pass_sizes[mode])
        print(
            f"{mode:10s} lateness p50 {row['p50_ms']:.1f} p99 {row['p99_ms']:.1f} "
            f"max {row['max_ms']:.1f} ms, early {row['early']:.0f}, "
            f"CPU {row['cpu_us_per_expiry']:.2f} us/expiry, "
            f"pass size max {sizes[-1]} p99 {sizes[int(len(sizes) * 0.99)]}"
        )


if __name__ == "__main__":
    main()
