"""W2: N operations pending at once.

One repetition, on a fresh loop:

1. **schedule** N operations in one synchronous burst (the loop cannot run, so nothing expires
   meanwhile; baseline C then lets the loop start its N Tasks). Each operation watches one key of
   its own (key space = N), so a trigger completes exactly one operation and list lengths do not
   change with N.
2. **complete** a seeded random half early: set its flag, ``check_and_complete(its key)``.
3. **expire** the other half: wait until all of them have expired.

Deadlines are uniform in [10 ms, 1 s] *after the moment all N are pending*: every operation's
timeout is ``base + u - now`` at its watch, where ``base`` is the start plus a margin longer than
phases 1 and 2 (estimated from the previous repetition; a repetition in which they overran the
margin says so in ``overrun_ms``). As seen at its watch call, a timeout is therefore the margin
plus u: about 0.1 s + u at N=1e4, 0.7 s + u at 1e5, 10 s + u at 1e6, which at large N puts the
deadlines beyond the first level of a 1024-tick timing wheel (so W2 exercises its cascades too).
Expiry lateness is the time an expiry callback ran minus that deadline (the purgatory rounds
deadlines up to its 1 ms tick, so up to 1 ms of it is rounding).

Costs are CPU microseconds (``time.process_time``) per operation of the phase: scheduled ops,
completed ops, expired ops; the expire phase includes the idle loop between expiries. Memory is a
separate, untimed pass under ``tracemalloc``: the traced bytes allocated by scheduling the N
operations divided by N, after one small warm-up batch so that structures created once (a
wheel's overflow level, the reaper task) are counted as fixed bytes, not per-operation bytes. The
keys, deadlines and result slots are allocated before it and not counted.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
import tracemalloc
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .baselines import FloorOp
from .config import Config
from .contenders import PAIRS, Contender, run_on, uvloop_available, w2_contenders
from .measure import Figure, GcPauses, Stopwatch, figure, lateness_ms, spread, spread_field

__all__ = ("W2Target", "Workload", "run", "run_once", "size_ratios")

MIN_TIMEOUT = 0.010
MAX_TIMEOUT = 1.0
WARM_BATCH = 64
POLL = 0.002
MARGIN_FACTOR = 1.5  # margin = this x the estimated wall time of phases 1 and 2, + 50 ms
GROWTH_GUESS = 2.0  # per-op wall time guessed for the next N = this x the last one measured
EXPIRY_GRACE = 60.0  # give up waiting for expiries this long after the last deadline

# First guesses of wall seconds per operation for phases 1 + 2, refined by every repetition.
INITIAL_ESTIMATE = {
    "ours": 8e-6,
    "ours-uvloop": 8e-6,
    "A": 12e-6,
    "A-lean": 10e-6,
    "B": 12e-6,
    "C": 60e-6,
    "Floor": 3e-6,
}


class W2Target(Protocol):
    """What the W2 driver needs of a contender."""

    name: str
    has_timer: bool
    expiry_lateness: list[float]

    def schedule(
        self,
        keysets: Sequence[tuple[Hashable, ...]],
        deadlines: Sequence[float],
        out: list[Any],
    ) -> None: ...
    def complete(self, reqs: Sequence[Any], keysets: Sequence[tuple[Hashable, ...]]) -> int: ...
    async def settle(self) -> None: ...
    async def close(self) -> None: ...


@dataclass(frozen=True)
class Workload:
    """The seeded inputs of one N, shared by every contender."""

    n: int
    keysets: list[tuple[int]]
    offsets: list[float]  # u in [MIN_TIMEOUT, MAX_TIMEOUT]
    to_complete: list[int]  # indices, in completion order
    complete_keysets: list[tuple[int]]

    @classmethod
    def make(cls, n: int, seed: int) -> Workload:
        rng = random.Random(f"w2/{seed}/{n}")
        keysets = [(i,) for i in range(n)]
        to_complete = rng.sample(range(n), n // 2)
        return cls(
            n=n,
            keysets=keysets,
            offsets=[rng.uniform(MIN_TIMEOUT, MAX_TIMEOUT) for _ in range(n)],
            to_complete=to_complete,
            complete_keysets=[keysets[i] for i in to_complete],
        )


def _deadlines(work: Workload, margin: float) -> tuple[float, list[float]]:
    base = time.monotonic() + margin
    return base, [base + u for u in work.offsets]


async def _timed(target: W2Target, work: Workload, margin: float) -> dict[str, Any]:
    n = work.n
    out: list[Any] = [None] * n
    gc.collect()
    base, deadlines = _deadlines(work, margin)
    with GcPauses() as pauses:
        clock = Stopwatch()
        target.schedule(work.keysets, deadlines, out)
        await target.settle()
        scheduled = clock.stop()
        gc_schedule = pauses.seconds

        chosen = [out[i] for i in work.to_complete]
        clock = Stopwatch()
        done = target.complete(chosen, work.complete_keysets)
        await target.settle()
        completed_span = clock.stop()
        gc_complete = pauses.seconds - gc_schedule
        ready_at = time.monotonic()
        expected = n - done
        expire_span = None
        if target.has_timer:
            clock = Stopwatch()
            # Nothing to watch before the last deadline: sleep through, then poll.
            await asyncio.sleep(max(0.0, base + MAX_TIMEOUT - time.monotonic()))
            limit = base + MAX_TIMEOUT + EXPIRY_GRACE
            while len(target.expiry_lateness) < expected and time.monotonic() < limit:
                await asyncio.sleep(POLL)
            expire_span = clock.stop()
        gc_expire = pauses.seconds - gc_schedule - gc_complete
    expired = len(target.expiry_lateness)
    return {
        "schedule_us": scheduled.cpu / n * 1e6,
        "schedule_wall_us": scheduled.wall / n * 1e6,
        "complete_us": completed_span.cpu / len(chosen) * 1e6,
        "complete_wall_us": completed_span.wall / len(chosen) * 1e6,
        "expire_us": expire_span.cpu / expired * 1e6 if expire_span and expired else None,
        "expire_wall_s": expire_span.wall if expire_span else None,
        "expired": expired,
        "expected_expired": expected if target.has_timer else 0,
        "completed": done,
        "lateness_ms": lateness_ms(target.expiry_lateness),
        "margin_ms": margin * 1e3,
        "overrun_ms": max(0.0, ready_at - (base + MIN_TIMEOUT)) * 1e3,
        "phases_wall_s": scheduled.wall + completed_span.wall,
        "gc_s": {"schedule": gc_schedule, "complete": gc_complete, "expire": gc_expire},
        "gc_longest_s": pauses.longest,
        "gc_full_collections": pauses.full_collections,
    }


async def _memory(target: W2Target, work: Workload, margin: float) -> dict[str, Any]:
    n = work.n
    out: list[Any] = [None] * n
    warm_keys = [(-1 - i,) for i in range(WARM_BATCH)]
    warm_out: list[Any] = [None] * WARM_BATCH
    gc.collect()
    base, deadlines = _deadlines(work, margin)
    warm_deadlines = [
        base + MIN_TIMEOUT + (MAX_TIMEOUT - MIN_TIMEOUT) * i / WARM_BATCH for i in range(WARM_BATCH)
    ]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        target.schedule(warm_keys, warm_deadlines, warm_out)
        await target.settle()
        target.complete(warm_out, warm_keys)
        await target.settle()
        del warm_out
        gc.collect()
        warm = tracemalloc.get_traced_memory()[0]
        target.schedule(work.keysets, deadlines, out)
        await target.settle()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return {
        "method": "tracemalloc",
        "bytes_per_op": (after - warm) / n,
        "fixed_bytes": warm - before,
    }


def user_object_bytes(work: Workload) -> float:
    """Traced bytes per operation of the user's own object alone: what any contender's caller
    allocates anyway (a slotted request with its timeout, deadline and flag, like the Floor's).

    The memory target counts what a purgatory adds beyond this.
    """
    n = work.n
    deadlines = [1.0 + u for u in work.offsets]
    out: list[Any] = [None] * n
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            out[i] = FloorOp(deadlines[i] - 0.5, deadlines[i])
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / n


def run_once(
    contender: Contender[Any], work: Workload, margin: float, memory: bool
) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        target: W2Target = contender.factory()
        try:
            if memory:
                return await _memory(target, work, margin)
            return await _timed(target, work, margin)
        finally:
            await target.close()

    return run_on(contender.loop, main)


def _summarise(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Spreads of the per-operation costs and lateness over the repetitions."""
    keys = ("schedule_us", "schedule_wall_us", "complete_us", "complete_wall_us", "expire_us")
    summary: dict[str, Any] = {key: spread_field(reps, key) for key in keys}
    summary["lateness_ms"] = {
        q: spread_field(reps, "lateness_ms", q) for q in ("p50", "p99", "max")
    }
    summary["gc_s"] = {
        phase: spread_field(reps, "gc_s", phase)["median"]
        for phase in ("schedule", "complete", "expire")
    }
    summary["gc_longest_s"] = spread_field(reps, "gc_longest_s")
    summary["max_overrun_ms"] = max((r["overrun_ms"] for r in reps), default=0.0)
    return summary


METRICS = ("schedule_us", "complete_us", "expire_us")
COMBINED = {
    "watch+complete": ("schedule_us", "complete_us"),
    "watch+expire": ("schedule_us", "expire_us"),
}
"""The per-operation costs the targets compare: a watch and how it ends, summed per repetition."""


def _cost(rep: dict[str, Any], metric: str) -> float | None:
    parts = COMBINED.get(metric, (metric,))
    values = [rep[part] for part in parts]
    return None if None in values else sum(values)


def size_ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """metric -> {"A/ours": spread, ..., "B/ours-uvloop": spread, "ours/Floor": spread}.

    Baseline / ours (> 1: ours is cheaper), each baseline against the ours on its loop
    (`PAIRS`; C too, on asyncio), and ours / Floor (how many times the irreducible work ours
    costs), per repetition: repetition i of one against repetition i of the other, which ran
    right after it; the spread of those ratios. Bytes (one memory pass each): one value.
    """
    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    pairs = {**PAIRS, "C": "ours"}
    ran = {name: c for name, c in results.items() if "summary" in c}
    for metric in (*METRICS, *COMBINED, "bytes_per_op"):
        row: dict[str, dict[str, Any]] = {}
        for name, other in ran.items():
            num: dict[str, Any] | None
            den: dict[str, Any] | None
            if name == "Floor":
                label, num, den = "ours/Floor", ran.get("ours"), other
            elif name in pairs:
                label, num, den = f"{name}/{pairs[name]}", other, ran.get(pairs[name])
            else:
                continue
            if num is None or den is None:
                continue
            if metric == "bytes_per_op":
                values = [_divide(num["memory"][metric], den["memory"][metric])]
            else:
                values = [
                    _divide(_cost(a, metric), _cost(b, metric))
                    for a, b in zip(num["reps"], den["reps"], strict=False)
                ]
            found = spread(values)
            if found["n"]:
                row[label] = found
        ratios[metric] = row
    return ratios


def _divide(num: float | None, den: float | None) -> float | None:
    return None if not num or not den else num / den


def run(config: Config, log: Callable[[str], None]) -> dict[str, Any]:
    """Every N for every contender: warm-up, interleaved repetitions, then the memory pass."""
    with_uvloop = uvloop_available()
    if not with_uvloop:
        log("uvloop is not installed: ours on uvloop and baseline B are left out")
    contenders: list[Contender[Any]] = list(w2_contenders(with_uvloop))
    log(f"W2: N in {', '.join(f'{n:,}' for n in config.sizes)}")
    estimate = {c.name: INITIAL_ESTIMATE.get(c.name, 20e-6) for c in contenders}
    by_n: list[dict[str, Any]] = []
    notes: list[str] = []
    for n in config.sizes:
        work = Workload.make(n, config.seed)
        active = [c for c in contenders if not (c.name == "C" and n > config.c_max_n)]
        skipped = [c.name for c in contenders if c not in active]
        if skipped:
            notes.append(
                f"N={n:,}: baseline C skipped above N={config.c_max_n:,} (a Task per request "
                "needs about 3.7 KB per operation and tens of seconds per repetition there; "
                "--c-max-n raises the limit)"
            )
        repeat = config.big_repeat if n >= 1_000_000 else config.repeat
        if repeat != config.repeat:
            notes.append(
                f"N={n:,}: {repeat} repetitions instead of {config.repeat} (--big-repeat), to keep "
                "the full run under about 15 minutes"
            )
        reps: dict[str, list[dict[str, Any]]] = {c.name: [] for c in active}

        def margin_for(name: str, n: int = n) -> float:
            return 0.05 + MARGIN_FACTOR * estimate[name] * n + 1e-7 * n

        for index in range(config.warmup + repeat):
            warming = index < config.warmup
            for contender in active:
                result = run_once(contender, work, margin_for(contender.name), memory=False)
                estimate[contender.name] = result["phases_wall_s"] / n
                if not warming:
                    reps[contender.name].append(result)
                phase = "warm-up" if warming else f"rep {index - config.warmup + 1}"
                log(_describe(n, contender.name, phase, result))
        results: dict[str, dict[str, Any]] = {}
        for contender in contenders:
            if contender.name in skipped:
                results[contender.name] = {"skipped": f"not run above N={config.c_max_n:,}"}
                continue
            memory = run_once(contender, work, 4 * margin_for(contender.name), memory=True)
            log(
                f"    N={n:>9,} {contender.name:>5} memory  {memory['bytes_per_op']:.0f} B/op "
                f"(+{memory['fixed_bytes'] / 1024:.0f} KiB fixed)"
            )
            results[contender.name] = {
                "loop": contender.loop,
                "summary": _summarise(reps[contender.name]),
                "memory": memory,
                "reps": reps[contender.name],
            }
        by_n.append(
            {
                "n": n,
                "repetitions": repeat,
                "contenders": results,
                "ratios": size_ratios(results),
                "user_object_bytes": user_object_bytes(work),
            }
        )
        for contender in active:  # the next N starts from a scaled-up guess
            estimate[contender.name] *= GROWTH_GUESS
    return {
        "timeouts_s": [MIN_TIMEOUT, MAX_TIMEOUT],
        "keys": "one key of its own per operation (key space = N)",
        "memory_method": "tracemalloc: traced bytes allocated by scheduling N ops, / N",
        "sizes": by_n,
        "notes": notes,
        "figures": _figures(by_n),
    }


def _figures(sizes: list[dict[str, Any]]) -> dict[str, Figure]:
    """Per N and contender: the three costs per operation, the bytes, the p99 lateness; per N
    and pair, the spread of the ratios of a watch and its end."""
    figures: dict[str, Figure] = {}
    for block in sizes:
        for who, c in block["contenders"].items():
            if "summary" not in c:
                continue
            label = f"W2 N={block['n']:,} {who}"
            for metric in METRICS:
                if c["summary"][metric]["n"]:
                    figures[f"{label}: {metric.removesuffix('_us')}"] = figure(
                        c["summary"][metric], "us/op"
                    )
            figures[f"{label}: bytes"] = figure([c["memory"]["bytes_per_op"]], "B/op")
            if c["summary"]["lateness_ms"]["p99"]["n"]:
                figures[f"{label}: expiry late p99"] = figure(
                    c["summary"]["lateness_ms"]["p99"], "ms"
                )
        for metric in COMBINED:
            for pair, ratio in block["ratios"].get(metric, {}).items():
                floor = pair.endswith("/Floor")  # ours / Floor: lower is better
                figures[f"W2 N={block['n']:,} {metric}: {pair}"] = figure(
                    ratio, "x", "lower" if floor else "higher"
                )
    return figures


def _describe(n: int, name: str, phase: str, r: dict[str, Any]) -> str:
    lateness = r["lateness_ms"]
    expire = f"{r['expire_us']:.2f}" if r["expire_us"] is not None else "-"
    p99 = f"{lateness['p99']:.1f}" if lateness["p99"] is not None else "-"
    overrun = f"  OVERRUN {r['overrun_ms']:.0f} ms" if r["overrun_ms"] > 0 else ""
    return (
        f"    N={n:>9,} {name:>5} {phase:<7} schedule {r['schedule_us']:.2f} us  "
        f"complete {r['complete_us']:.2f} us  expire {expire} us  late p99 {p99} ms{overrun}"
    )
