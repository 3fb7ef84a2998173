"""The microbenchmarks: pyperf's program, run by the suite as ``python -m benchmarks.micro GROUP``.

`measure.pyperf_group` starts this module; pyperf then starts it again as its worker processes
(``--worker``), and each worker builds the same benchmarks of the same group, in the same order,
and times the one it is given. Run them through the suite (``python -m benchmarks --only
expiry-cost``), which reads pyperf's values back into the results file.

Every benchmark is a *sample*: a callable that sets up its inputs untimed and returns the CPU
seconds (`measure.cpu_seconds`) of `operations` operations; pyperf divides by `operations`, so
every value is CPU seconds per operation. Groups:

- ``w1-virtual``: W1's traffic (20/60 ms, 100 and 100,000 keys) through the purgatory alone in
  virtual time (`w1.run_virtual`), per mode: the purgatory's own cost per request, without the
  loop and the generator, whose share moves W1's wall-clock rates by 10-35 % between runs.
- ``expiry-cost``: the CPU of one expiry inside a timer pass. N operations on keys of their own,
  deadlines uniform over one second 10 s away (so they cascade first, as in W2 at large N), a
  seeded half completed by key; the clock moves to just before the first deadline (cascades and
  purges happen there, untimed), then 1 ms ticks walk over the second of deadlines (timed).
  W2 at 1e6 has 500,000 expirations due within one second: the reaper keeps up only below about
  2 us per expiry, the loop's wake-ups included.
- ``steady``: W1's purgatory work per request in a steady state, without the driver's clock and
  loop: requests arrive one per step, watch 3 of 100 keys and complete `pending` steps later on
  average (exponential), so about `pending` are watched at once. Each contender is driven through
  its W1 interface (ours by force, by key, by threshold; A and A-lean by key; A-heap by
  threshold); timeouts are an hour away: this is watching and completing, not expiry.
- ``eventlog``: see `benchmarks.eventlog`.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Callable
from dataclasses import asdict
from functools import cache
from typing import Any

from purgatory import DelayedOperationPurgatory
from purgatory.testing import ManualClock

from . import eventlog
from .baselines import FutureTimer, HeapFutureTimer, LeanFutureTimer
from .config import FULL, QUICK, Config
from .measure import cpu_seconds, figure, pyperf_group
from .ours import FlagOp, OursTarget
from .w1 import W1Setting, make_pools, run_virtual

__all__ = ("GROUPS", "STEADY_COLUMNS", "Bench", "main", "run")

Bench = tuple[str, Callable[[], float], int]
"""(name, sample returning CPU seconds, operations per sample)."""

VIRTUAL_RATE = 40_000.0
"""Arrivals per virtual second in ``w1-virtual``."""


_pools = cache(make_pools)
"""A worker times one benchmark of its group: the inputs of the others are never drawn."""


def _w1_virtual(config: Config) -> list[Bench]:
    benches: list[Bench] = []
    for key_space in (100, 100_000):
        for mode in ("force", "key", "threshold"):
            setting = W1Setting(mode, 20, 60, key_space)

            def sample(setting: W1Setting = setting) -> float:
                requests, seed = config.virtual_requests, config.seed
                pools = _pools(setting, seed)
                return cpu_seconds(
                    lambda: run_virtual(setting, requests, VIRTUAL_RATE, seed, pools=pools)
                )

            benches.append((f"{setting.name} (virtual time)", sample, config.virtual_requests))
    return benches


def _expiry_cost(config: Config) -> list[Bench]:
    n = config.expiry_ops
    expiring = n - n // 2

    def sample() -> float:
        rng = random.Random(config.seed)
        clock = ManualClock()
        purgatory = DelayedOperationPurgatory[FlagOp]("expiry", clock=clock)
        ops = [FlagOp(10.0 + rng.random()) for _ in range(n)]
        for key, op in enumerate(ops):
            purgatory.try_complete_else_watch(op, (key,))
        for key in rng.sample(range(n), n // 2):
            ops[key].ready = True
            purgatory.check_and_complete(key)
        del ops
        clock.advance(9.9)
        expired = 0

        def walk() -> None:
            nonlocal expired
            for _ in range(1200):
                expired += clock.advance(0.001)

        seconds = cpu_seconds(walk)
        if expired != expiring:
            raise RuntimeError(f"expiry-cost: {expired} expired, {expiring} expected")
        return seconds

    return [(f"expiry in a timer pass, {n:,} pending", sample, expiring)]


STEADY_COLUMNS: dict[str, tuple[Callable[[], Any], str]] = {
    "ours force": (OursTarget, "force"),
    "ours key": (OursTarget, "key"),
    "ours threshold": (OursTarget, "threshold"),
    "A key": (FutureTimer, "key"),
    "A-lean key": (LeanFutureTimer, "key"),
    "A-heap threshold": (HeapFutureTimer, "threshold"),
}
"""The ``steady`` benchmarks: a W1 target (built on the running loop) and its mode."""


@cache
def _steady_inputs(pending: int, ops: int, seed: int) -> tuple[list[tuple[str, ...]], list[float]]:
    rng = random.Random(f"steady/{seed}")
    names = [f"key-{i}" for i in range(100)]
    keysets = [tuple(rng.sample(names, 3)) for _ in range(ops)]
    return keysets, [float(i + 1 + int(rng.expovariate(1.0 / pending))) for i in range(ops)]


def steady_sample(column: str, pending: int, ops: int, seed: int) -> Callable[[], float]:
    """One sample of the steady state of `column` (`STEADY_COLUMNS`) at `pending` watched."""
    factory, mode = STEADY_COLUMNS[column]

    async def main() -> float:
        keysets, dues = _steady_inputs(pending, ops, seed)
        target: Any = factory()
        if mode == "threshold":
            submit, trigger = target.submit_threshold, target.trigger_threshold
        else:
            submit, trigger = target.submit, target.trigger
        force = target.force
        far = asyncio.get_running_loop().time() + 3600.0
        heap: list[tuple[float, int, Any]] = []
        push, pop = heapq.heappush, heapq.heappop

        def drive() -> None:
            for i in range(ops):
                due = dues[i]
                push(heap, (due, i, submit(keysets[i], 3600.0, far, due)))
                while heap[0][0] <= i:
                    due, j, req = pop(heap)
                    if mode == "force":
                        force(req)
                    else:
                        trigger(req, keysets[j][0], due)

        seconds = cpu_seconds(drive)
        await target.close()
        return seconds

    return lambda: asyncio.run(main())


def _steady(config: Config) -> list[Bench]:
    return [
        (
            f"steady {column}, {pending:,} pending",
            steady_sample(column, pending, config.steady_ops, config.seed),
            config.steady_ops,
        )
        for pending in config.steady_pending
        for column in STEADY_COLUMNS
    ]


def _eventlog(config: Config) -> list[Bench]:
    return [
        (kind, eventlog.sampler(kind, config.eventlog_ops), config.eventlog_ops)
        for kind in eventlog.recorders()
    ]


GROUPS: dict[str, Callable[[Config], list[Bench]]] = {
    "w1-virtual": _w1_virtual,
    "expiry-cost": _expiry_cost,
    "steady": _steady,
    "eventlog": _eventlog,
}


def run(config: Config, log: Callable[[str], None], group: str) -> dict[str, Any]:
    """The suite's side: time `group` under pyperf; CPU us per operation of each benchmark."""
    us = pyperf_group(group, config.micro, quick=config.quick, seed=config.seed)
    for name, found in us.items():
        log(f"  {name}: {found['median']:.3f} us/op [{found['min']:.3f}, {found['max']:.3f}]")
    return {
        "pyperf": asdict(config.micro),
        "us_per_op": us,
        "figures": {name: figure(found, "us/op") for name, found in us.items()},
    }


def _time_func(sample: Callable[[], float]) -> Callable[[int], float]:
    def time_func(loops: int) -> float:
        return sum(sample() for _ in range(loops))

    return time_func


def main() -> None:
    """pyperf's program: ``python -m benchmarks.micro GROUP [--quick] [--seed N] [pyperf ...]``."""
    import pyperf

    def forward(command: list[str], args: Any) -> None:
        command.extend([args.group, f"--seed={args.seed}", *(["--quick"] if args.quick else [])])

    runner = pyperf.Runner(program_args=("-m", "benchmarks.micro"), add_cmdline_args=forward)
    runner.argparser.add_argument("group", choices=sorted(GROUPS))
    runner.argparser.add_argument("--quick", action="store_true", help="the --quick sizes")
    runner.argparser.add_argument("--seed", type=int, default=FULL.seed)
    args = runner.parse_args()
    config = (QUICK if args.quick else FULL).with_overrides(seed=args.seed)
    for name, sample, operations in GROUPS[args.group](config):
        runner.bench_time_func(name, _time_func(sample), inner_loops=operations)


if __name__ == "__main__":
    main()
