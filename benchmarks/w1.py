"""W1: Kafka's ``TestPurgatoryPerformance``, asyncio edition.

An open-loop generator issues requests at Poisson arrival times for a target rate, catching up in
bounded bursts when it is behind; each request is watched on 3 distinct keys of a key space for
200 ms; a log-normal completion latency (given p50/p75) decides whether it is completed at
``arrival + latency`` (by ``force_complete`` in W1-force, by setting its flag and calling
``check_and_complete`` on its first key in W1-key) or left to expire. W1-threshold is W1-key's
traffic with thresholds: each request watches its keys at its own completion time (the requests
that will expire too: theirs lies past the deadline), and each trigger carries the time reached,
``check_and_complete(key, completion_time)``, so it re-tries only the watchers that are due. A
single driver coroutine does both the generating and the completing, like Kafka's generator
thread and completion queue, so the harness work is the same for every contender.

Like Kafka's tool, random numbers come from pre-drawn pools (of 65,536 samples, seeded per
setting) so that drawing them costs nothing during a probe; every contender walks the same pool
positions in the same repetition.

Per setting and contender: a geometric search for the highest sustained rate (one probe per
rate; sustained = the generator issued its schedule with at most 1 % delay, i.e. achieved >= 99 %
of the target rate in Kafka's sense, and p99 generator lag < 100 ms), then ``repeat`` confirmation
probes at that rate, interleaved across contenders. If fewer than half of them pass, the rate is
lowered by 10 % and confirmed again (twice at most). Figures are spreads (median, quartiles,
min, max) over the confirmation probes at the final rate.

`run_virtual` drives the same traffic through the purgatory alone, in virtual time, for the
microbenchmark ``w1-virtual`` and for instruction counts.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import math
import random
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from purgatory import DelayedOperationPurgatory, PurgatoryStatistics
from purgatory.testing import ManualClock

from .config import Config
from .contenders import Contender, run_on, uvloop_available, w1_contenders
from .measure import Figure, GcPauses, Stopwatch, figure, lateness_ms, spread_field
from .ours import FlagOp

__all__ = (
    "MODES",
    "SETTINGS",
    "THRESHOLD_CONTENDERS",
    "Pools",
    "W1Setting",
    "W1Target",
    "make_pools",
    "run",
    "run_virtual",
    "setting_ratios",
)

TIMEOUT = 0.2
KEYS_PER_REQUEST = 3
POOL_SIZE = 1 << 16
QUANTUM = 0.001  # the generator sleeps at least this long (Kafka's tool works in whole ms)
MAX_BURST = 256  # arrivals (and, separately, completions) handled before yielding to the loop
SAMPLE_EVERY = 0.1  # seconds between samples of watched() / num_delayed()
MAX_LAG = 0.1
MIN_ACHIEVED = 0.99
MIN_RATE = 500.0
MAX_RATE = 1_000_000.0


class W1Target(Protocol):
    """What the W1 driver needs of a contender."""

    expiry_lateness: list[float]

    def submit(
        self, keys: tuple[Hashable, ...], timeout: float, deadline: float, threshold: float
    ) -> Any: ...
    def submit_threshold(
        self, keys: tuple[Hashable, ...], timeout: float, deadline: float, threshold: float
    ) -> Any: ...
    def force(self, req: Any) -> bool: ...
    def trigger(self, req: Any, key: Hashable, reached: float) -> bool: ...
    def trigger_threshold(self, req: Any, key: Hashable, reached: float) -> bool: ...
    def pending(self) -> int: ...
    def watched(self) -> int: ...
    async def close(self) -> None: ...


@dataclass(frozen=True)
class W1Setting:
    """One W1 configuration."""

    mode: str  # "force", "key" or "threshold"
    p50_ms: float
    p75_ms: float
    key_space: int

    @property
    def name(self) -> str:
        keys = "" if self.key_space == 100 else f", {self.key_space:,} keys"
        return f"W1-{self.mode} {self.p50_ms:g}/{self.p75_ms:g}{keys}"


SETTINGS: tuple[W1Setting, ...] = (
    W1Setting("force", 20, 60, 100),
    W1Setting("force", 200, 400, 100),
    W1Setting("key", 20, 60, 100),
    W1Setting("key", 200, 400, 100),
    W1Setting("key", 20, 60, 100_000),
    W1Setting("key", 200, 400, 100_000),
    W1Setting("threshold", 20, 60, 100),
    W1Setting("threshold", 200, 400, 100),
    W1Setting("threshold", 20, 60, 100_000),
    W1Setting("threshold", 200, 400, 100_000),
)
MODES = ("force", "key", "threshold")

THRESHOLD_CONTENDERS = frozenset({"ours", "A", "A-lean", "A-heap"})
"""Who runs W1-threshold. A and A-lean run their W1-key code (their inline check already
completes only what is due), measured beside ours on the same traffic; A-heap is A with a heap
per key written by hand, what an A user gains from a threshold structure. B (A on uvloop) is
left out to keep the run short: its W1-key rows show the loop's effect."""
THRESHOLD_ONLY = frozenset({"A-heap"})
"""Contenders that run W1-threshold alone (A-heap's W1-force and W1-key would be A's)."""


@dataclass(frozen=True)
class Pools:
    """Pre-drawn random samples, walked cyclically (sizes are a power of two)."""

    gaps: list[float]  # exponential, mean 1 (scaled by 1/rate)
    latencies: list[float]  # seconds, log-normal
    keys: list[tuple[str, ...]]
    expire_fraction: float


def make_pools(setting: W1Setting, seed: int) -> Pools:
    """Draw the pools of one setting; the same seed gives the same pools."""
    rng = random.Random(f"w1/{seed}/{setting.p50_ms}/{setting.p75_ms}/{setting.key_space}")
    mu = math.log(setting.p50_ms / 1e3)
    sigma = (math.log(setting.p75_ms / 1e3) - mu) / 0.67449
    names = [f"key-{i}" for i in range(setting.key_space)]
    latencies = [rng.lognormvariate(mu, sigma) for _ in range(POOL_SIZE)]
    return Pools(
        gaps=[rng.expovariate(1.0) for _ in range(POOL_SIZE)],
        latencies=latencies,
        keys=[tuple(rng.sample(names, KEYS_PER_REQUEST)) for _ in range(POOL_SIZE)],
        expire_fraction=sum(lat >= TIMEOUT for lat in latencies) / POOL_SIZE,
    )


def _offset(seed: int, setting: W1Setting, tag: str) -> int:
    return random.Random(f"w1-offset/{seed}/{setting.name}/{tag}").randrange(POOL_SIZE)


async def _probe(  # noqa: PLR0912, PLR0915 - one timed probe: its loop must not call out
    target: W1Target,
    setting: W1Setting,
    pools: Pools,
    *,
    rate: float,
    duration: float,
    offset: int,
) -> dict[str, Any]:
    """Run one probe at `rate` for `duration` seconds of schedule, then drain; return figures."""
    loop_sleep = asyncio.sleep
    monotonic = time.monotonic
    heappush, heappop = heapq.heappush, heapq.heappop
    gaps, latencies, keypool = pools.gaps, pools.latencies, pools.keys
    mask = POOL_SIZE - 1
    gi, li, ki = offset, offset * 7 + 1, offset * 13 + 2
    mean_gap = 1.0 / rate
    force_mode = setting.mode == "force"
    if setting.mode == "threshold":
        submit, trigger = target.submit_threshold, target.trigger_threshold
    else:
        submit, trigger = target.submit, target.trigger
    force = target.force

    heap: list[tuple[float, int, Any, tuple[str, ...]]] = []
    lags: list[float] = []
    completion_lateness: list[float] = []
    issued = 0
    peak_watched = peak_delayed = 0
    sampling_cpu = 0.0
    aborted = False

    gc.collect()
    with GcPauses() as pauses:
        clock = Stopwatch()
        start = monotonic()
        end = start + duration
        give_up = end + max(0.5, duration)
        scheduled = start
        last_issue = last_scheduled = start
        next_sample = start + SAMPLE_EVERY
        while True:
            now = monotonic()
            handled = 0
            while heap and heap[0][0] <= now and handled < MAX_BURST:
                due, _, req, keys = heappop(heap)
                done = force(req) if force_mode else trigger(req, keys[0], due)
                if done:
                    completion_lateness.append(monotonic() - due)
                handled += 1
            handled = 0
            while scheduled <= now and scheduled < end and handled < MAX_BURST:
                t = monotonic()
                lags.append(t - scheduled)
                keys = keypool[ki & mask]
                ki += 1
                latency = latencies[li & mask]
                li += 1
                req = submit(keys, TIMEOUT, t + TIMEOUT, t + latency)
                if latency < TIMEOUT:
                    heappush(heap, (t + latency, issued, req, keys))
                issued += 1
                last_issue = t
                last_scheduled = scheduled
                scheduled += gaps[gi & mask] * mean_gap
                gi += 1
                handled += 1
            now = monotonic()
            if now >= next_sample:
                cpu = time.process_time()
                peak_watched = max(peak_watched, target.watched())
                peak_delayed = max(peak_delayed, target.pending())
                sampling_cpu += time.process_time() - cpu
                next_sample = now + SAMPLE_EVERY
            generating = scheduled < end
            if generating and now > give_up:
                aborted = True
                generating = False
            if not generating and not heap:
                break
            wake = scheduled if generating else math.inf
            if heap and heap[0][0] < wake:
                wake = heap[0][0]
            if wake <= now:
                await loop_sleep(0)
            else:
                await loop_sleep(max(QUANTUM, wake - now))
        # Drain: every request left must expire (200 ms after its arrival at most).
        drain_limit = monotonic() + TIMEOUT + 1.0
        while target.pending() and monotonic() < drain_limit:
            await loop_sleep(0.005)
        drained = target.pending() == 0
        span = clock.stop()

    expected = issued
    while scheduled < end:  # arrivals the generator never got to (it gave up)
        expected += 1
        scheduled += gaps[gi & mask] * mean_gap
        gi += 1
    achieved = 0.0
    if not aborted and last_issue > start:
        # Kafka's actual / target rate: the schedule's span over the time it took to issue it.
        achieved = min(1.0, (last_scheduled - start) / (last_issue - start))
    lag = lateness_ms(lags)
    lag_p99 = lag["p99"]
    cpu = span.cpu - sampling_cpu
    passed = bool(
        not aborted
        and drained
        and achieved >= MIN_ACHIEVED
        and lag_p99 is not None
        and lag_p99 < MAX_LAG * 1e3
    )
    return {
        "rate": rate,
        "duration_s": duration,
        "issued": issued,
        "expected": expected,
        "achieved": achieved,
        "lag_ms": {k: lag[k] for k in ("p50", "p99", "max")},
        "cpu_s": cpu,
        "wall_s": span.wall,
        "cpu_s_per_million": cpu / issued * 1e6 if issued else None,
        "peak_watched": peak_watched,
        "peak_delayed": peak_delayed,
        "completed": len(completion_lateness),
        "expired": len(target.expiry_lateness),
        "completion_lateness_ms": lateness_ms(completion_lateness),
        "expiry_lateness_ms": lateness_ms(target.expiry_lateness),
        "gc_s": pauses.seconds,
        "gc_full_collections": pauses.full_collections,
        "drained": drained,
        "aborted": aborted,
        "passed": passed,
    }


def probe(
    contender: Contender[Any],
    setting: W1Setting,
    pools: Pools,
    *,
    rate: float,
    duration: float,
    offset: int,
) -> dict[str, Any]:
    """One probe on a fresh loop of the contender's kind."""

    async def main() -> dict[str, Any]:
        target: W1Target = contender.factory()
        try:
            return await _probe(target, setting, pools, rate=rate, duration=duration, offset=offset)
        finally:
            await target.close()

    return run_on(contender.loop, main)


def _search(
    contender: Contender[Any],
    setting: W1Setting,
    pools: Pools,
    *,
    start_rate: float,
    config: Config,
    log: Callable[[str], None],
) -> tuple[float | None, list[dict[str, Any]]]:
    """Geometric search for the highest passing rate; (None, probes) if even MIN_RATE fails."""
    passing: float | None = None
    failing: float | None = None
    rate = start_rate
    probes: list[dict[str, Any]] = []
    for index in range(config.max_search_probes):
        offset = _offset(config.seed, setting, f"search{index}")
        result = probe(
            contender, setting, pools, rate=rate, duration=config.probe_seconds, offset=offset
        )
        probes.append(result)
        log(_describe(contender.name, "search", result))
        if result["passed"]:
            passing = rate
        else:
            failing = rate
        if failing is None:
            if rate >= MAX_RATE:
                break
            rate = min(MAX_RATE, rate * 2)
        elif passing is None:
            if rate <= MIN_RATE:
                break
            rate = max(MIN_RATE, rate / 2)
        else:
            if failing / passing <= config.search_precision:
                break
            rate = math.sqrt(passing * failing)
    return passing, probes


def _describe(name: str, phase: str, result: dict[str, Any]) -> str:
    verdict = "pass" if result["passed"] else "FAIL"
    return (
        f"    {name:>4} {phase:<7} {result['rate']:>9,.0f}/s {verdict}  "
        f"achieved {result['achieved']:.3f}  lag p99 {result['lag_ms']['p99'] or 0:.1f} ms  "
        f"cpu {result['cpu_s_per_million'] or 0:.2f} s/M"
    )


def _summarise(rate: float | None, reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The confirmation probes at the final rate: spreads of their figures."""
    summary: dict[str, Any] = {
        "max_rate": rate,
        "passes": sum(1 for r in reps if r["passed"]),
        "repetitions": len(reps),
        "cpu_s_per_million": spread_field(reps, "cpu_s_per_million"),
        "achieved": spread_field(reps, "achieved"),
        "lag_p99_ms": spread_field(reps, "lag_ms", "p99"),
        "peak_watched": spread_field(reps, "peak_watched"),
        "peak_delayed": spread_field(reps, "peak_delayed"),
        "gc_s": spread_field(reps, "gc_s"),
    }
    for kind in ("completion", "expiry"):
        summary[f"{kind}_lateness_ms"] = {
            q: spread_field(reps, f"{kind}_lateness_ms", q)["median"] for q in ("p50", "p99", "max")
        }
    return summary


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


def run_setting(
    setting: W1Setting,
    contenders: list[Contender[Any]],
    config: Config,
    log: Callable[[str], None],
    previous: dict[str, float | None],
) -> dict[str, Any]:
    """Search, then confirm, every contender on one setting."""
    pools = make_pools(setting, config.seed)
    log(f"  {setting.name}: {pools.expire_fraction:.1%} of requests expire")
    found: dict[str, float | None] = {}
    searches: dict[str, list[dict[str, Any]]] = {}
    fallback = config.start_rate
    for contender in contenders:
        # Start where this contender ended on the previous setting, else where the previous
        # contender ended on this one: fewer probes than starting from scratch.
        start = previous.get(contender.name) or fallback
        rate, probes = _search(contender, setting, pools, start_rate=start, config=config, log=log)
        found[contender.name], searches[contender.name] = rate, probes
        if rate is not None:
            fallback = rate

    def confirm(contender: Contender[Any], index: int, phase: str) -> dict[str, Any]:
        rate = found[contender.name]
        assert rate is not None
        offset = _offset(config.seed, setting, f"rep{index}")
        result = probe(
            contender, setting, pools, rate=rate, duration=config.probe_seconds, offset=offset
        )
        log(_describe(contender.name, f"{phase} {index + 1}", result))
        return result

    searched = [c for c in contenders if found[c.name] is not None]
    reps: dict[str, list[dict[str, Any]]] = {c.name: [] for c in contenders}
    for index in range(config.repeat):  # interleaved, so drift hits every contender alike
        for contender in searched:
            reps[contender.name].append(confirm(contender, index, "rep"))
    for contender in searched:
        for _ in range(2):  # most failed: lower the rate by 10 % and confirm again
            runs = reps[contender.name]
            if 2 * sum(r["passed"] for r in runs) >= len(runs):
                break
            found[contender.name] = 0.9 * (found[contender.name] or 0.0)
            runs[:] = [confirm(contender, index, "re") for index in range(config.repeat)]

    results = {
        c.name: {
            "loop": c.loop,
            **_summarise(found[c.name], reps[c.name]),
            "search": searches[c.name],
            "reps": reps[c.name],
        }
        for c in contenders
    }
    return {
        "setting": {**asdict(setting), "name": setting.name},
        "expire_fraction": pools.expire_fraction,
        "contenders": results,
        "ratios": setting_ratios(results),
    }


def setting_ratios(results: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """``rate ours/X`` and ``cpu X/ours`` for every other contender X of one setting."""
    ratios: dict[str, float | None] = {}
    ours = results.get("ours")
    if ours is not None:
        for name, other in results.items():
            if name == "ours":
                continue
            ratios[f"rate ours/{name}"] = _ratio(ours["max_rate"], other["max_rate"])
            ratios[f"cpu {name}/ours"] = _ratio(
                other["cpu_s_per_million"]["median"], ours["cpu_s_per_million"]["median"]
            )
    return ratios


def run(config: Config, log: Callable[[str], None], mode: str) -> dict[str, Any]:
    """Every W1 setting of `mode` for every contender (W1-threshold: `THRESHOLD_CONTENDERS`
    only; B when uvloop is installed), after one warm-up probe per contender."""
    with_uvloop = uvloop_available()
    if not with_uvloop:
        log("uvloop is not installed: baseline B is left out (pip install uvloop)")
    contenders: list[Contender[Any]] = list(w1_contenders(with_uvloop))
    if mode == "threshold":
        contenders = [c for c in contenders if c.name in THRESHOLD_CONTENDERS]
    else:
        contenders = [c for c in contenders if c.name not in THRESHOLD_ONLY]
    warm_setting = SETTINGS[0]
    warm_pools = make_pools(warm_setting, config.seed)
    for contender in contenders:
        probe(contender, warm_setting, warm_pools, rate=10_000.0, duration=0.3, offset=0)
    log(f"W1-{mode} (warm-up done)")
    settings = []
    previous: dict[str, float | None] = {}
    for setting in SETTINGS:
        if setting.mode != mode:
            continue
        entry = run_setting(setting, contenders, config, log, previous)
        previous = {name: c["max_rate"] for name, c in entry["contenders"].items()}
        settings.append(entry)
    return {
        "timeout_s": TIMEOUT,
        "keys_per_request": KEYS_PER_REQUEST,
        "criteria": {"min_achieved": MIN_ACHIEVED, "max_lag_p99_ms": MAX_LAG * 1e3},
        "uvloop": with_uvloop,
        "settings": settings,
        "figures": _figures(settings),
    }


def _figures(settings: list[dict[str, Any]]) -> dict[str, Figure]:
    """Per setting and contender: the rate found (one search, no spread) and the CPU."""
    figures: dict[str, Figure] = {}
    for entry in settings:
        name = entry["setting"]["name"]
        for who, c in entry["contenders"].items():
            figures[f"{name} {who}: max rate"] = figure([c["max_rate"]], "/s", "higher")
            figures[f"{name} {who}: CPU"] = figure(c["cpu_s_per_million"], "s/M req")
    return figures


def run_virtual(
    setting: W1Setting, requests: int, rate: float, seed: int = 1, *, pools: Pools | None = None
) -> PurgatoryStatistics:
    """W1's traffic in virtual time: `requests` requests of `setting` at `rate` per virtual
    second through a `DelayedOperationPurgatory` on a `ManualClock`, synchronously.

    The clock moves to each arrival and each completion in time order, expiring what falls due
    on the way; nothing but the purgatory and this small driver runs, so the same call gives the
    same work every time (``benchmarks.micro`` times it; under callgrind it counts the same
    instructions). The driver's own work is the same in every mode: compare differences.

    Returns:
        The purgatory's statistics at the end (requests still pending at the end are neither
        completed nor expired).
    """
    pools = pools or make_pools(setting, seed)
    mask = POOL_SIZE - 1
    clock = ManualClock()
    purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory("virtual", clock=clock)
    watch = purgatory.try_complete_else_watch
    check = purgatory.check_and_complete
    advance = clock.advance
    mode = setting.mode
    completions: list[tuple[float, int, FlagOp, Hashable]] = []
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
            watch(op, keys, at + latency)
        else:
            watch(op, keys)
        if latency < TIMEOUT:
            heapq.heappush(completions, (at + latency, i, op, keys[0]))
    return purgatory.statistics()
