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

Per setting: a geometric search per contender for where to start (one probe per rate), then
``repeat`` rounds (at least 5 in the full run), interleaved across contenders. In a round each
contender gets a `bracket`: a probe at its last rate, then one `bracket_step` up while probes
pass, or down while they fail, so the round yields its highest sustained rate to within that
step (sustained = the generator issued its schedule with at most 1 % delay, i.e. achieved >= 99
% of the target rate in Kafka's sense, the delay read as the least lag of the last quarter of
the arrivals (`achieved_share`), and p99 generator lag < 100 ms); then one probe at the
*common rate*, `COMMON_SHARE` of the lowest rate any contender's search found, the same rate
and traffic for everybody, whose CPU per request is the figure that compares contenders at the
same load. The rate of one probe is a threshold test on a noisy machine (one collector pause
at the end of a probe fails it), so a rate is reported as the spread of the rounds' rates, and
each ratio as the spread of its per-round ratios (round i of ours against round i of the
baseline, which ran right after it): median [min, max].

`run_virtual` drives the same traffic through the purgatory alone, in virtual time, for the
microbenchmark ``w1-virtual`` and for instruction counts.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import math
import random
import statistics
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from purgatory import DelayedOperationPurgatory, PurgatoryStatistics
from purgatory.testing import ManualClock

from .config import Config
from .contenders import PAIRS, Contender, run_on, uvloop_available, w1_contenders
from .measure import Figure, GcPauses, Stopwatch, figure, lateness_ms, spread, spread_field
from .ours import FlagOp

__all__ = (
    "COMMON_SHARE",
    "MODES",
    "SETTINGS",
    "Pools",
    "W1Setting",
    "W1Target",
    "achieved_share",
    "bracket",
    "make_pools",
    "run",
    "run_virtual",
    "search",
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
COMMON_SHARE = 0.8
"""The common rate of a setting's CPU comparison: this share of the lowest rate found."""


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

THRESHOLD_ONLY = frozenset({"A-heap"})
"""Contenders that run W1-threshold alone (A-heap's W1-force and W1-key would be A's). In
W1-threshold A, A-lean and B run their W1-key code (their inline check already completes only
what is due), measured beside ours on the same traffic; A-heap is A with a heap per key written
by hand, what an A user gains from a threshold structure."""


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


async def _probe(  # noqa: PLR0915 - one timed probe: its loop must not call out
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
    achieved = achieved_share(lags, last_scheduled - start) if not aborted else 0.0
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
        "final_lag_ms": (last_issue - last_scheduled) * 1e3,
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
        "gc_longest_s": pauses.longest,
        "gc_full_collections": pauses.full_collections,
        "drained": drained,
        "aborted": aborted,
        "passed": passed,
    }


def achieved_share(lags: list[float], span: float) -> float:
    """Kafka's actual / target rate of a schedule of `span` seconds whose arrivals were issued
    `lags` seconds late (in order): ``span / (span + lag)``, the lag being the least of the last
    quarter of the arrivals.

    A generator that cannot keep up falls behind steadily, so every arrival of the last quarter
    lags, the least of them by about three quarters of what the last one does (an overload of
    1.4 % or more fails a probe). A stall of the process (a collector pause, another program on
    the core) delays the arrivals around it and is caught up; the p99 of the lags, the other
    criterion, bounds it. Taking the last arrival's lag alone, as an earlier version did, failed
    a 1 s probe for any 10 ms stall in its last moments, whatever the rate.
    """
    if not lags or span <= 0:
        return 0.0
    tail = lags[-max(1, len(lags) // 4) :]
    return min(1.0, span / (span + max(0.0, min(tail))))


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


Attempt = Callable[[float], dict[str, Any]]
"""One probe at a rate, its result (with ``passed``)."""


def search(
    attempt: Attempt, start: float, precision: float, max_probes: int
) -> tuple[float | None, list[dict[str, Any]]]:
    """Geometric search for a high passing rate, from `start`: doubling while probes pass,
    halving while they fail, then bisecting (geometric mean) until the failing rate is within
    `precision` of the passing one. One probe per rate, so a single noisy failure caps it: it
    only gives the rounds (`bracket`) their first rate. (None, probes) if nothing passed."""
    passing: float | None = None
    failing: float | None = None
    rate = start
    probes: list[dict[str, Any]] = []
    for _ in range(max_probes):
        result = attempt(rate)
        probes.append(result)
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
            if failing / passing <= precision:
                break
            rate = math.sqrt(passing * failing)
    return passing, probes


def bracket(
    attempt: Attempt, start: float, step: float, down_limit: int
) -> tuple[float | None, list[dict[str, Any]]]:
    """One round's highest sustained rate, to within a factor `step`: a probe at `start`; while
    probes pass, one `step` higher, until one fails (or `MAX_RATE`); while they fail, one `step`
    lower, at most `down_limit` times (or down to `MIN_RATE`).

    Returns:
        The highest rate that passed (None if none did) and every probe, in order.
    """
    probes: list[dict[str, Any]] = []
    rate = min(MAX_RATE, max(MIN_RATE, start))
    result = attempt(rate)
    probes.append(result)
    if result["passed"]:
        best = rate
        while rate < MAX_RATE:
            rate = min(MAX_RATE, rate * step)
            result = attempt(rate)
            probes.append(result)
            if not result["passed"]:
                break
            best = rate
        return best, probes
    for _ in range(down_limit):
        if rate <= MIN_RATE:
            break
        rate = max(MIN_RATE, rate / step)
        result = attempt(rate)
        probes.append(result)
        if result["passed"]:
            return rate, probes
    return None, probes


def _describe(name: str, phase: str, result: dict[str, Any]) -> str:
    verdict = "pass" if result["passed"] else "FAIL"
    return (
        f"    {name:>11} {phase:<9} {result['rate']:>9,.0f}/s {verdict}  "
        f"achieved {result['achieved']:.3f}  lag p99 {result['lag_ms']['p99'] or 0:.1f} ms  "
        f"cpu {result['cpu_s_per_million'] or 0:.2f} s/M"
    )


def _summarise(rounds: list[dict[str, Any]], common_rate: float | None) -> dict[str, Any]:
    """A contender's rounds: the spread of its highest sustained rates; CPU per request at its
    own highest rate of each round and at the rate common to every contender; the load figures
    of the common-rate probes (the same rate and traffic for everybody, so comparable)."""
    rates = [r["max_rate"] for r in rounds]
    at_max = [r["at_max"] for r in rounds if r["at_max"] is not None]
    common = [r["common"] for r in rounds if r["common"] is not None]
    found = [rate for rate in rates if rate is not None]
    summary: dict[str, Any] = {
        "max_rate": statistics.median(found) if found else None,
        "rates": spread(rates),
        "rounds": len(rounds),
        "cpu_s_per_million": spread_field(at_max, "cpu_s_per_million"),
        "common_rate": common_rate,
        "common_passes": sum(1 for r in common if r["passed"]),
        "cpu_common": spread_field(common, "cpu_s_per_million"),
        "achieved": spread_field(common, "achieved"),
        "lag_p99_ms": spread_field(common, "lag_ms", "p99"),
        "peak_watched": spread_field(common, "peak_watched"),
        "peak_delayed": spread_field(common, "peak_delayed"),
        "gc_s": spread_field(common, "gc_s"),
        "gc_longest_s": spread_field(common, "gc_longest_s"),
    }
    for kind in ("completion", "expiry"):
        summary[f"{kind}_lateness_ms"] = {
            q: spread_field(common, f"{kind}_lateness_ms", q)["median"]
            for q in ("p50", "p99", "max")
        }
    return summary


def run_setting(
    setting: W1Setting,
    contenders: list[Contender[Any]],
    config: Config,
    log: Callable[[str], None],
    previous: dict[str, float | None],
) -> dict[str, Any]:
    """Every contender on one setting: a search for where to start, then `config.repeat` rounds,
    interleaved across contenders so that drift hits every contender alike. A round is a
    `bracket` from the contender's last rate and one probe at the common rate
    (`COMMON_SHARE` of the lowest rate the searches found): its CPU per request is the figure
    that compares contenders at the same offered load."""
    pools = make_pools(setting, config.seed)
    log(f"  {setting.name}: {pools.expire_fraction:.1%} of requests expire")

    def attempt(contender: Contender[Any], tag: str, phase: str) -> Attempt:
        offset = _offset(config.seed, setting, tag)

        def at(rate: float) -> dict[str, Any]:
            result = probe(
                contender, setting, pools, rate=rate, duration=config.probe_seconds, offset=offset
            )
            log(_describe(contender.name, phase, result))
            return result

        return at

    found: dict[str, float | None] = {}
    searches: dict[str, list[dict[str, Any]]] = {}
    fallback = config.start_rate
    for contender in contenders:
        # Start where this contender ended on the previous setting, else where the previous
        # contender ended on this one: fewer probes than starting from scratch.
        start = previous.get(contender.name) or fallback
        rate, probes = search(
            attempt(contender, "search", "search"),
            start,
            config.search_precision,
            config.max_search_probes,
        )
        found[contender.name], searches[contender.name] = rate, probes
        if rate is not None:
            fallback = rate

    reached = [rate for rate in found.values() if rate is not None]
    common_rate = COMMON_SHARE * min(reached) if reached else None
    if common_rate is not None:
        log(f"  common rate {common_rate:,.0f}/s ({COMMON_SHARE:.0%} of the lowest rate found)")
    estimate = {c.name: found[c.name] or config.start_rate for c in contenders}
    rounds: dict[str, list[dict[str, Any]]] = {c.name: [] for c in contenders}
    for index in range(config.repeat):
        for contender in contenders:
            name = contender.name
            rate, probes = bracket(
                attempt(contender, f"round{index}", f"round {index + 1}"),
                estimate[name],
                config.bracket_step,
                config.bracket_down,
            )
            at_max = next((p for p in reversed(probes) if p["passed"]), None)
            common = None
            if common_rate is not None:
                common = attempt(contender, f"common{index}", f"common {index + 1}")(common_rate)
            rounds[name].append(
                {"max_rate": rate, "probes": probes, "at_max": at_max, "common": common}
            )
            # The next round starts here; after a round that found nothing, one step lower.
            estimate[name] = rate or probes[-1]["rate"] / config.bracket_step

    results = {
        c.name: {
            "loop": c.loop,
            **_summarise(rounds[c.name], common_rate),
            "search": searches[c.name],
            "round_details": rounds[c.name],
        }
        for c in contenders
    }
    return {
        "setting": {**asdict(setting), "name": setting.name},
        "expire_fraction": pools.expire_fraction,
        "common_rate": common_rate,
        "contenders": results,
        "ratios": setting_ratios(results),
    }


def setting_ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per baseline X and the ours on its loop (`PAIRS`): the spreads over the rounds of
    ``rate ours/X`` (each round's highest sustained rates; > 1: ours sustains more) and
    ``cpu X/ours`` (CPU per request at the common rate; > 1: ours costs less). Round i of one
    is paired with round i of the other: they ran one after the other."""
    ratios: dict[str, dict[str, Any]] = {}
    for baseline, mine in PAIRS.items():
        ours, other = results.get(mine), results.get(baseline)
        if ours is None or other is None:
            continue
        rates = [
            _ratio(a["max_rate"], b["max_rate"])
            for a, b in zip(ours["round_details"], other["round_details"], strict=False)
        ]
        cpus = [
            _ratio(_cpu(b["common"]), _cpu(a["common"]))
            for a, b in zip(ours["round_details"], other["round_details"], strict=False)
        ]
        ratios[f"rate {mine}/{baseline}"] = spread(rates)
        ratios[f"cpu {baseline}/{mine}"] = spread(cpus)
    return ratios


def _cpu(result: dict[str, Any] | None) -> float | None:
    return None if result is None else result["cpu_s_per_million"]


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


def run(config: Config, log: Callable[[str], None], mode: str) -> dict[str, Any]:
    """Every W1 setting of `mode` for every contender (A-heap: W1-threshold only; ours on
    uvloop and B when uvloop is installed), after one warm-up probe per contender."""
    with_uvloop = uvloop_available()
    if not with_uvloop:
        log("uvloop is not installed: ours on uvloop and baseline B are left out")
    contenders: list[Contender[Any]] = list(w1_contenders(with_uvloop))
    if mode != "threshold":
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
        "rounds": config.repeat,
        "bracket_step": config.bracket_step,
        "common_share": COMMON_SHARE,
        "uvloop": with_uvloop,
        "settings": settings,
        "figures": _figures(settings),
    }


def _figures(settings: list[dict[str, Any]]) -> dict[str, Figure]:
    """Per setting and contender: the rates of its rounds and the CPU per request at the
    common rate; per pair, the ratios' spreads."""
    figures: dict[str, Figure] = {}
    for entry in settings:
        name = entry["setting"]["name"]
        for who, c in entry["contenders"].items():
            figures[f"{name} {who}: max rate"] = figure(c["rates"], "/s", "higher")
            figures[f"{name} {who}: CPU at the common rate"] = figure(c["cpu_common"], "s/M req")
        for label, ratio in entry["ratios"].items():
            figures[f"{name}: {label}"] = figure(ratio, "x", "higher")
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
