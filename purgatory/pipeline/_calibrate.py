"""``calibrate``: measure a cost profile for the load model on this machine and event loop.

Each cost is a micro-benchmark of the real `DelayedOperationPurgatory` on a real running loop
(the stock asyncio loop or uvloop), timed in CPU seconds of the loop's thread
(`time.thread_time`): what the work costs the core, not the idle time between timer wake-ups,
and less disturbed by other processes than wall time. The kinds and what they are charged for
are listed in `purgatory.pipeline._load.COST_KINDS`.

Most costs are differences of two runs (a turn of the loop is a chain of callbacks minus their
dispatch), and on a busy machine two runs taken seconds apart differ by more than the cost: a
difference of two medians came out negative. So the measurements are taken in **rounds**: each
round runs every micro-benchmark once, back to back (in an order rotated from round to round,
so that no measurement is always the first after a sleep), and solves every cost from that
round's own runs, paired in time; a cost is the median of its rounds' values (an outlier, a
round another process took the core in, moves it little). A median below zero is within its
noise of zero, and is kept as zero (`_estimate`). Rounds go on past the minimum while some
cost's median is less precise than asked (the spread between rounds wide), up to a maximum; the
profile records each cost's spread (its interquartile range over the rounds) and the number of
rounds, so a busy machine gives a profile that says how blurred it is, never no profile.

Costs are those of a loaded loop, the regime where they matter: a callback is one of many due
at once (no wait in the selector between them); a try (``attempt``) on keys whose operations are
out of the cache, as on a server with many keys. Beside them, what a loop pays per turn and per
sleep: ``iteration``, a turn of the loop beyond its callbacks (a chain of callbacks each
scheduled by the one before, so each runs in a turn of its own, minus a due callback's
dispatch); ``wake``, what waking an idle loop costs beyond that (callbacks a tick apart, each
finding the loop asleep in its selector and doing an arrival's and a condition's work on a
purgatory, minus the same callbacks all due at once, minus a turn: the wake-up with the
slowdown of the work that follows it, its caches cold from the sleep); and, not CPU but time,
``wake_latency``: how much later than its selector's timeout an idle loop's callback runs (the
thread woken and scheduled by the operating system), as quantiles of a thousand wake-ups.
Solved, not measured directly: ``watch_key`` (a watch on four keys minus one on one key, over
three), and ``expiry`` and ``timer_pass`` from two runs: one pass per expiry (each operation on a
tick of its own) and one pass for thousands; a spaced pass wakes an idle loop (its timer in one
turn, its task in the next), so an idle wake-up (a turn and a dispatch included) and one more
turn are taken out of it and a dispatch put back.

The costs are means; what a loop near its knee suffers from is the events far from them. So,
once, callbacks are also timed one by one (`_per_event`: an arrival's and a condition's work
on a busy loop, the operations created as it runs): their CPU over the mean gives the
profile's ``cost_shape`` (quantiles: a callback after cold caches, a page fault; not, on
CPython before 3.13, a garbage collection: see `_per_event`), their wall time beyond their
CPU its ``stall`` (another process preempting the loop; as likely per CPU second, so
``stall_basis`` keeps the mean CPU of the callbacks timed, and ``stall_mean`` the stalls'
mean, which the quantiles alone overstate).
Those are distributions, not differences of runs, and are measured rather than solved; they
are chosen over a distribution of the loop's batch lengths because a batch's length depends
on the offered rate and the workload, which the replay knows and a profile cannot, while an
event's cost and its chance of being preempted do not. Last, ``stall_credit``
(`_stall_credit`): how long a loop that woke from its selector runs before it is first
preempted (the scheduler favours a thread that slept: under a load of 15 on 2 cores a loop
sleeping between callbacks was held off 0.2 times its CPU, one running back to back 9 times).
And ``speed`` (`_speed`, `speed_of`): the core's speed over a few seconds, the CPU of a fixed
unit of work per window of `SPEED_WINDOW` of wall time, over the mean. Measured because the
real loop of the load validation fell behind in spells no independent draw gives: the median
arrival's CPU went from 14.9 to 22.6 us for 160 ms at once, with no wait for a CPU (the
workload of several timeouts at 26,211/s), its lag from 1 to 16 ms meanwhile; and a busy loop
timed alone on the same machine (a load average of 1.6, other processes on the other core)
cost 1.2 times its mean or more in 13 % of its 20 ms windows, in spells up to 300 ms.
"""

from __future__ import annotations

import asyncio
import math
import platform
import random
import selectors
import statistics
import sys
import time
from array import array
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from .. import DelayedOperation, DelayedOperationPurgatory
from ._load import LATENCY_QUANTILES, MAX_COST, MAX_SHAPE, SHAPE_QUANTILES, CostProfile

__all__ = (
    "LOOPS",
    "Estimate",
    "FlagOp",
    "calibrate",
    "estimate",
    "interleaved",
    "shape_and_stall",
    "solve",
    "speed_of",
)

#: The loops a profile can be measured on.
LOOPS: Final = ("asyncio", "uvloop")


class FlagOp(DelayedOperation[None]):
    """The one "ready flag" operation: it completes once its caller sets `ready`.

    The calibration times it, and the benchmarks (``benchmarks.ours``) run it, so "an operation"
    costs the same in a cost profile as in every benchmark. `deadline` is when its timeout falls
    due on the caller's clock, for callers that measure how late it expired (0: not kept).
    """

    __slots__ = ("deadline", "ready")

    def __init__(self, timeout: float, deadline: float = 0.0) -> None:
        super().__init__(timeout)
        self.deadline = deadline
        self.ready = False

    def try_complete(self) -> bool:
        if self.ready:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class _Sizes:
    """How much work each micro-benchmark does, and how many rounds of them are run."""

    min_rounds: int
    max_rounds: int
    #: Rounds go on (up to `max_rounds`) while a cost's median is less precise than this share
    #: of it (the half-width of its ~95 % interval, 1.58 IQR / sqrt(rounds), as a box plot's
    #: notch), or than `NOISE_FLOOR`, whichever is larger.
    precision: float
    callbacks: int
    watches: int
    attempts_per_key: int
    checks: int
    spaced_expiries: int
    bulk_expiries: int
    wake_ups: int
    #: Wake-ups after which the loop runs until preempted (`_stall_credit`).
    bursts: int
    #: Callbacks timed one by one for the distributions (``cost_shape``, ``stall``): enough
    #: for a few at their 0.9999 quantile.
    events: int
    #: Seconds of work timed back to back for the core's speed over time (``speed``).
    speed_seconds: float


_FULL: Final = _Sizes(7, 15, 0.05, 20_000, 5_000, 50, 5_000, 1_000, 4_000, 1_000, 60, 60_000, 6.0)
_QUICK: Final = _Sizes(5, 9, 0.15, 2_000, 500, 10, 500, 60, 500, 200, 15, 5_000, 1.5)
#: The window of the core's speed (`_speed`), in seconds: short against the spells measured
#: (100 to 300 ms), long enough to hold a few hundred units of work.
SPEED_WINDOW: Final = 0.02
#: Steps of the pure-Python loop one unit of work of `_speed` runs (about 10 us).
_SPEED_UNIT: Final = 400
_KEYS: Final = 100
#: A step held off the core longer than this (seconds of wall time beyond its CPU) was
#: preempted, in `_stall_credit`: well above a timer's or a page fault's microseconds.
PREEMPTED: Final = 1e-4
#: Operations pending at a time while events are timed one by one (`_per_event`).
_PENDING: Final = 1000
#: Seconds below which a cost's imprecision is not worth another round: 10 ns, a few
#: bytecodes, well below any cost a profile holds.
NOISE_FLOOR: Final = 1e-8


def _new_loop(loop: str) -> asyncio.AbstractEventLoop:
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            raise ValueError(
                "--loop uvloop: uvloop is not installed (pip install uvloop)"
            ) from None
        new_loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return new_loop
    if loop == "asyncio":
        return asyncio.new_event_loop()
    raise ValueError(f"loop must be one of {', '.join(LOOPS)}, got {loop!r}")


def _run(loop_kind: str, scenario: Callable[[], Awaitable[float]]) -> float:
    """Run `scenario` on a fresh loop of `loop_kind`; it returns the CPU seconds it measured."""
    loop = _new_loop(loop_kind)
    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


async def _callbacks(n: int, spacing: float) -> float:
    """`n` timer callbacks `spacing` seconds apart: CPU seconds per callback.

    With a spacing of a nanosecond they are all due at once and a busy loop runs them one after
    another, without waiting in the selector (what a callback costs when the core is the
    bottleneck: ``dispatch``); a tick apart, each wakes an idle loop from its selector (what
    the first event after an idle spell costs: ``dispatch`` plus ``wake``).
    """
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    left = n

    def step() -> None:
        nonlocal left
        left -= 1
        if not left:
            done.set_result(None)

    when = loop.time() + (2 * spacing if spacing >= 1e-3 else 0.0)
    for i in range(n):
        loop.call_at(when + i * spacing, step)
    start = time.thread_time()
    await done
    return (time.thread_time() - start) / n


async def _iterations(n: int) -> float:
    """A chain of `n` callbacks, each scheduled by the one before with ``call_soon`` (so each
    runs in a turn of the loop of its own, the selector asked and answering at once): CPU
    seconds per callback."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    left = n

    def step() -> None:
        nonlocal left
        left -= 1
        if left:
            loop.call_soon(step)
        else:
            done.set_result(None)

    loop.call_soon(step)
    start = time.thread_time()
    await done
    return (time.thread_time() - start) / n


async def _wake_latency(n: int, resolution: float) -> list[float]:
    """How much later than its selector's timeout each of `n` callbacks, spaced so that the
    loop sleeps before each, starts: the operating system's scheduling latency of the woken
    thread, in seconds (the loop's own turn included, a few microseconds).

    The loop goes to sleep when a callback ends, until the next one's time rounded up to the
    selector's `resolution`: a callback that starts later than that was late by the rest.
    """
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    late: list[float] = []
    ended = time.monotonic()
    spacing = 1.37e-3  # (not a whole number of milliseconds: the roundings differ)

    def step(when: float) -> None:
        nonlocal ended
        start = time.monotonic()
        if resolution > 0:
            woken = ended + math.ceil((when - ended) / resolution - 1e-9) * resolution
        else:
            woken = when
        late.append(max(0.0, start - max(woken, when)))
        if len(late) == n:
            done.set_result(None)
        ended = time.monotonic()

    first = loop.time() + 0.01
    for i in range(n):
        when = first + i * spacing
        loop.call_at(when, step, when)
    await done
    return late


def _quantiles(
    values: Sequence[float], points: Sequence[float] = LATENCY_QUANTILES
) -> tuple[float, ...]:
    """`values`' quantiles at `points` (nearest rank)."""
    ordered = sorted(values)
    n = len(ordered)
    return tuple(ordered[min(n - 1, max(0, math.ceil(p * n) - 1))] for p in points)


async def _per_event(n: int) -> list[tuple[int, int]]:
    """`n` callbacks all due at once on a busy loop, each doing an arrival's work and a
    condition's on a purgatory (a new operation watched on three of `_KEYS` keys, and the one
    watched `_PENDING` callbacks before completed by ``check_and_complete``): each callback's
    (thread CPU, wall) nanoseconds, timed around it alone.

    What the mean costs leave out: how unequal events are. Most cost about the same; a few
    cost many times more (one after another process took the caches), and some are held off
    the core beyond their CPU (preempted: wall time minus thread time). The operations are
    created during the run and about `_PENDING` are pending at a time, as on a server; the
    timings go to arrays allocated beforehand.

    No garbage collection runs among the callbacks timed (none counted in 60,000, CPython
    3.11): before 3.13 a pass is triggered when the tracked objects grow by 700 (allocations
    count up, deallocations down), and here each callback frees its timer handle, made before
    the run, while the pending operations stay about `_PENDING`. A server whose heap grows
    (a backlog near its knee) sees the passes its growth triggers; no profile holds them.
    """
    loop = asyncio.get_running_loop()
    purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory("calibrate")
    purgatory.try_complete_else_watch(FlagOp(60.0), ("k0",))  # the reaper started, not measured
    done = loop.create_future()
    pending: list[FlagOp | None] = [None] * _PENDING
    cpus, walls = array("q", bytes(8 * n)), array("q", bytes(8 * n))
    cpu, wall = time.thread_time_ns, time.perf_counter_ns
    keys = [tuple(f"k{(i + j * 7) % _KEYS}" for j in range(3)) for i in range(_KEYS)]

    def step(i: int) -> None:
        start, began = cpu(), wall()
        op = FlagOp(60.0)
        slot = i % _PENDING
        earlier = pending[slot]
        pending[slot] = op
        purgatory.try_complete_else_watch(op, keys[i % _KEYS])
        if earlier is not None:
            earlier.ready = True
            purgatory.check_and_complete(keys[(i - _PENDING) % _KEYS][0])
        cpus[i] = cpu() - start
        walls[i] = wall() - began
        if i == n - 1:
            done.set_result(None)

    when = loop.time()
    for i in range(n):
        loop.call_at(when + i * 1e-9, step, i)
    await done
    await purgatory.shutdown()
    return list(zip(cpus, walls, strict=True))


async def _stall_credit(bursts: int, longest: float = 0.03, sleep: float = 0.005) -> float:
    """How long a loop that woke from its selector runs before another process preempts it:
    `bursts` times, the loop sleeps `sleep` seconds in its selector, then runs back-to-back
    steps of work timed one by one until one is held off the core more than
    `PREEMPTED` (wall minus CPU), or `longest` seconds have passed; the median of the
    seconds run before it (`longest` if none was), in seconds.
    """
    offsets = []
    cpu, wall = time.thread_time_ns, time.perf_counter_ns
    for _ in range(bursts):
        await asyncio.sleep(sleep)
        woke = wall()
        end = woke + round(longest * 1e9)
        offset = longest
        while True:
            start, began = cpu(), wall()
            total = 0
            for i in range(300):
                total += i
            now = wall()
            if now - began - (cpu() - start) > PREEMPTED * 1e9:
                offset = (began - woke) / 1e9
                break
            if now >= end:
                break
        offsets.append(offset)
    return statistics.median(offsets)


def _speed(seconds: float) -> list[tuple[int, int]]:
    """`seconds` of a fixed unit of work run back to back: each unit's start (wall
    nanoseconds from the first) and CPU nanoseconds, for `speed_of`.

    On a shared machine the same work costs more CPU for spells of a tenth of a second and
    more (another virtual machine on the physical core, caches taken): every callback of the
    spell alike, which independent draws per event (``cost_shape``) cannot give. The unit is
    a pure-Python loop, as most of a callback's work is interpreted bytecode.
    """
    cpu, wall = time.thread_time_ns, time.perf_counter_ns
    starts, cpus = array("q"), array("q")
    units = range(_SPEED_UNIT)
    began = wall()
    end = began + round(seconds * 1e9)
    while True:
        start, at = cpu(), wall()
        if at >= end:
            break
        total = 0
        for i in units:
            total += i
        cpus.append(cpu() - start)
        starts.append(at - began)
    return list(zip(starts, cpus, strict=True))


def speed_of(units: Sequence[tuple[int, int]], window: float = SPEED_WINDOW) -> tuple[float, ...]:
    """The core's speed over time from units of work's (start, CPU) nanoseconds (the start
    counted from the first): for each window of `window` seconds of wall time, the mean CPU
    of the units started in it over the mean of all units, in the order measured (a profile's
    ``speed``). A window in which no unit started (the thread held off the core throughout: a
    wait, which is ``stall``'s, not a slower core) is left out; none at all: empty."""
    span = round(window * 1e9)
    sums: dict[int, int] = {}
    counts: dict[int, int] = {}
    for start, spent in units:
        slot = start // span
        sums[slot] = sums.get(slot, 0) + spent
        counts[slot] = counts.get(slot, 0) + 1
    overall = sum(sums.values()) / max(1, sum(counts.values()))
    if not overall > 0:
        return ()
    return tuple(
        min(MAX_SHAPE, max(sums[slot] / counts[slot] / overall, 1e-3)) for slot in sorted(sums)
    )


def shape_and_stall(
    timings: Sequence[tuple[int, int]],
) -> tuple[tuple[float, ...], tuple[float, ...], float, float]:
    """From callbacks' (CPU, wall) nanoseconds, the profile's ``cost_shape`` (each callback's
    CPU over their mean, as quantiles at `SHAPE_QUANTILES`), ``stall`` (wall minus CPU, in
    seconds, as quantiles), ``stall_basis`` (their mean CPU, in seconds) and ``stall_mean``
    (the stalls' mean, in seconds)."""
    mean = statistics.fmean(c for c, _ in timings)
    stalls = [max(0, w - c) / 1e9 for c, w in timings]
    shape = _quantiles([c / mean for c, _ in timings], SHAPE_QUANTILES)
    stall = _quantiles(stalls, SHAPE_QUANTILES)
    return (
        tuple(min(v, MAX_SHAPE) for v in shape),
        tuple(min(v, MAX_COST) for v in stall),
        min(mean / 1e9, MAX_COST),
        min(statistics.fmean(stalls), MAX_COST),
    )


async def _working(n: int, spacing: float) -> float:
    """`n` callbacks `spacing` seconds apart, each doing what an arrival and a condition do to a
    purgatory (a watch, and a completion by ``check_and_complete``): CPU seconds per callback.

    A tick apart, each finds the loop asleep and its caches cold from the sleep (other threads
    ran on the core): the wake-up's cost then includes the work's slowdown after it, which a
    callback doing nothing (`_callbacks`) does not show.
    """
    loop = asyncio.get_running_loop()
    purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory("calibrate")
    purgatory.try_complete_else_watch(FlagOp(60.0), ("k0",))  # the reaper started, not measured
    done = loop.create_future()
    ops = [FlagOp(60.0) for _ in range(n + 1)]
    left = n

    def step() -> None:
        nonlocal left
        left -= 1
        purgatory.try_complete_else_watch(ops[left], (f"k{left % _KEYS}",))
        waiting = ops[left + 1]
        waiting.ready = True
        purgatory.check_and_complete(f"k{(left + 1) % _KEYS}")
        if not left:
            done.set_result(None)

    purgatory.try_complete_else_watch(ops[n], (f"k{n % _KEYS}",))
    when = loop.time() + (2 * spacing if spacing >= 1e-3 else 0.0)
    for i in range(n):
        loop.call_at(when + i * spacing, step)
    start = time.thread_time()
    await done
    spent = time.thread_time() - start
    await purgatory.shutdown()
    return spent / n


async def _watches(n: int, keys_per_op: int) -> float:
    """A chain of `n` callbacks, each watching a new operation that waits: seconds per callback."""
    loop = asyncio.get_running_loop()
    purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory("calibrate")
    purgatory.try_complete_else_watch(FlagOp(60.0), ("k0",))  # the reaper started, not measured
    done = loop.create_future()
    keys = [tuple(f"k{(i + j * 7) % _KEYS}" for j in range(keys_per_op)) for i in range(_KEYS)]
    left = n

    def step() -> None:
        nonlocal left
        left -= 1
        purgatory.try_complete_else_watch(FlagOp(60.0), keys[left % _KEYS])
        if not left:
            done.set_result(None)

    when = loop.time()
    for i in range(n):
        loop.call_at(when + i * 1e-9, step)
    start = time.thread_time()
    await done
    spent = time.thread_time() - start
    await purgatory.shutdown()
    return spent / n


async def _attempts(per_key: int, keys: int = 300, rounds: int = 5) -> float:
    """``check_and_complete`` on keys whose operations all stay unmet: seconds per try.

    As in a server, a key's operations are far apart in memory (watched in turn with other
    keys', other objects allocated between them) and a key is tried after the others: each
    check finds its operations out of the cache, as a loop serving many keys does (a thousand
    operations of one key tried again and again cost about two thirds of this).
    """
    purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory("calibrate")
    others = []
    for _ in range(per_key):
        for k in range(keys):
            purgatory.try_complete_else_watch(FlagOp(60.0), (f"k{k}",))
            others.append([0] * 8)
    order = [f"k{k}" for k in range(keys)]
    shuffle = random.Random(1).shuffle
    start = time.thread_time()
    for _ in range(rounds):
        shuffle(order)
        for key in order:
            purgatory.check_and_complete(key)
    spent = time.thread_time() - start
    await purgatory.shutdown()
    return spent / (per_key * keys * rounds)


async def _completions(n: int) -> float:
    """``check_and_complete`` that completes the one operation of its key: seconds per call."""
    purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory("calibrate")
    ops = [FlagOp(60.0) for _ in range(n)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, (f"k{i}",))
    start = time.thread_time()
    for i, op in enumerate(ops):
        op.ready = True
        purgatory.check_and_complete(f"k{i}")
    spent = time.thread_time() - start
    await purgatory.shutdown()
    return spent / n


async def _expiries(n: int, spaced: bool) -> float:
    """`n` operations expired by the reaper, one per tick or all in one pass: CPU seconds."""
    loop = asyncio.get_running_loop()
    tick = 0.001
    purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory("calibrate", tick=tick)
    done = loop.create_future()
    ops = [FlagOp((i + 2) * tick if spaced else 2 * tick) for i in range(n)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, (f"k{i % _KEYS}",))
    start = time.thread_time()

    def check() -> None:  # not a timer pass of its own: it rides on the loop's idle wake-ups
        if purgatory.statistics().expired >= n:
            done.set_result(None)
        else:
            loop.call_at(loop.time() + n * tick, check)

    loop.call_at(loop.time() + (n + 2) * tick if spaced else loop.time() + 2 * tick, check)
    await done
    spent = time.thread_time() - start
    await purgatory.shutdown()
    return spent


async def _purges(n: int) -> float:
    """`purge` of the entries of `n` completed operations on three keys: seconds per entry."""
    purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory(
        "calibrate", purge_interval=10 * n
    )
    ops = [FlagOp(60.0) for _ in range(n)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, tuple(f"k{(i + j) % _KEYS}" for j in range(3)))
    for op in ops:
        op.force_complete()
    start = time.thread_time()
    removed = purgatory.purge()
    spent = time.thread_time() - start
    await purgatory.shutdown()
    return spent / max(1, removed)


def _machine() -> str:
    """The CPU model (Linux), else the architecture; and the operating system."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            for line in file:
                if line.startswith("model name"):
                    model = line.partition(":")[2].strip()
                    break
    except OSError:
        pass
    return f"{model}, {platform.system()}"


def _resolution(loop: str) -> float:
    """The granularity of the loop's sleep: whole milliseconds for libuv (uvloop) and for the
    epoll, poll and devpoll selectors (their timeouts are in ms, Python rounds up); a
    microsecond for select; none for kqueue (nanoseconds)."""
    if loop == "uvloop":
        return 0.001
    name = selectors.DefaultSelector.__name__
    return {"SelectSelector": 1e-6, "KqueueSelector": 0.0}.get(name, 0.001)


def _run_list(loop_kind: str, scenario: Callable[[], Awaitable[list[float]]]) -> list[float]:
    """Run `scenario` on a fresh loop of `loop_kind`; the values it measured."""
    loop = _new_loop(loop_kind)
    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


def _run_timings(
    loop_kind: str, scenario: Callable[[], Awaitable[list[tuple[int, int]]]]
) -> list[tuple[int, int]]:
    """Run `scenario` on a fresh loop of `loop_kind`; the timings it took."""
    loop = _new_loop(loop_kind)
    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


@dataclass(frozen=True, slots=True)
class Estimate:
    """One cost solved from rounds of paired measurements."""

    #: The median of the rounds' values, or 0 if that is negative (within its noise of 0).
    value: float
    #: The interquartile range of the rounds' values, in seconds.
    spread: float
    #: The rounds' values, in the order measured.
    values: tuple[float, ...]


def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """The first quartile, the median and the third quartile of `values`."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def _settled(values: Sequence[float], precision: float) -> bool:
    """Whether the median of `values` is as precise as asked: the half-width of its ~95 %
    interval (McGill's notch, 1.58 IQR / sqrt(n)) within `precision` of it or `NOISE_FLOOR`."""
    q1, median, q3 = _quartiles(values)
    return 1.58 * (q3 - q1) / math.sqrt(len(values)) <= max(precision * abs(median), NOISE_FLOOR)


def _estimate(values: Sequence[float]) -> Estimate:
    """The median of the rounds' values and their spread; a cost cannot be negative, and a
    negative median is one within its noise of zero (a round is a difference of runs), so 0."""
    q1, median, q3 = _quartiles(values)
    return Estimate(max(0.0, median), q3 - q1, tuple(values))


def estimate(
    measure_round: Callable[[int], Mapping[str, float]],
    *,
    min_rounds: int,
    max_rounds: int,
    precision: float,
) -> tuple[dict[str, Estimate], int]:
    """Solve each cost from rounds of `measure_round` (given the round's index, it returns
    each cost solved from that round's runs alone), and how many rounds were taken.

    At least `min_rounds`; then more while any cost's median is less precise than `precision`
    (`_settled`), at most `max_rounds`: a wide spread buys more rounds, never a refusal.
    """
    if not 1 <= min_rounds <= max_rounds:
        raise ValueError(f"rounds must satisfy 1 <= min <= max, got {min_rounds}, {max_rounds}")
    samples: dict[str, list[float]] = {}
    rounds = 0
    while rounds < max_rounds:
        for kind, value in measure_round(rounds).items():
            samples.setdefault(kind, []).append(value)
        rounds += 1
        if rounds >= min_rounds and all(_settled(v, precision) for v in samples.values()):
            break
    return {kind: _estimate(values) for kind, values in samples.items()}, rounds


def interleaved(measurements: Mapping[str, Callable[[], float]], index: int) -> dict[str, float]:
    """Run each of `measurements` once, back to back, starting with the `index`-th (the order
    rotated from round to round): the raw values of one round."""
    names = list(measurements)
    start = index % len(names)
    return {name: measurements[name]() for name in names[start:] + names[:start]}


def solve(raw: Mapping[str, float], spaced_expiries: int, bulk_expiries: int) -> dict[str, float]:
    """Every cost from one round's raw measurements (CPU seconds; see the module's doc).

    ``spaced`` = n_s * (pass + expiry) and ``bulk`` = pass + n_b * expiry, where a pass woke an
    idle loop (wake, a turn, its timer's dispatch) and ran its task in the next turn. The model
    charges a pass the timer and the task (``timer_pass``), the turns and the wake-up apart: so
    out of it go the idle wake-up (``idle``: wake, a turn, a dispatch) and one more turn; a
    dispatch is put back for its timer's callback.
    """
    dispatch = raw["callbacks"]
    iteration = raw["turns"] - dispatch
    expiry = (raw["bulk"] - raw["spaced"] / spaced_expiries) / (bulk_expiries - 1)
    return {
        "dispatch": dispatch,
        "iteration": iteration,
        # (With the work's slowdown after a sleep: what an idle wake-up costs a real callback.)
        "wake": raw["asleep"] - raw["awake"] - iteration,
        "watch": raw["watch1"] - dispatch,
        "watch_key": (raw["watch4"] - raw["watch1"]) / 3,
        "attempt": raw["attempt"],
        "completion": raw["completion"],
        "expiry": expiry,
        "timer_pass": raw["spaced"] / spaced_expiries - raw["idle"] - expiry + dispatch - iteration,
        "purged_entry": raw["purged_entry"],
    }


def calibrate(
    loop: str = "asyncio",
    *,
    quick: bool = False,
    application: float = 0.0,
    application_condition: float = 0.0,
    progress: Callable[[str], None] | None = None,
) -> CostProfile:
    """Measure every cost of a profile on a loop of kind `loop` (``asyncio`` or ``uvloop``).

    Args:
        quick: Smaller runs and fewer rounds (a few seconds instead of about half a minute on
            a quiet machine): a rough profile.
        application: The application's own CPU seconds per operation, put in as given.
        application_condition: The application's own CPU seconds per condition callback
            (scheduling it and serving it), put in as given.
        progress: Told what is measured as it starts.

    Returns:
        The profile, with each cost's spread between rounds: a busy machine takes more rounds
        (15 at most, 9 with `quick`) and gives wider spreads, not an error.

    Raises:
        ValueError: An unknown loop, or uvloop asked for and not installed.
    """
    _new_loop(loop).close()  # an unknown or missing loop fails before any measurement
    sizes = _QUICK if quick else _FULL
    say = progress or (lambda _: None)
    n_s, n_b = sizes.spaced_expiries, sizes.bulk_expiries

    def run(scenario: Callable[[], Awaitable[float]]) -> Callable[[], float]:
        return lambda: _run(loop, scenario)

    measurements = {
        "callbacks": run(lambda: _callbacks(sizes.callbacks, 1e-9)),
        "turns": run(lambda: _iterations(sizes.callbacks)),
        "watch1": run(lambda: _watches(sizes.watches, 1)),
        "watch4": run(lambda: _watches(sizes.watches, 4)),
        "attempt": run(lambda: _attempts(sizes.attempts_per_key)),
        "completion": run(lambda: _completions(sizes.checks)),
        "bulk": run(lambda: _expiries(n_b, False)),
        # A spaced pass and an idle wake-up are each tens of microseconds of a sleeping loop's
        # wake-up, the pass a few more: next to each other in every round.
        "spaced": run(lambda: _expiries(n_s, True)),
        "idle": run(lambda: _callbacks(n_s, 0.001)),
        "asleep": run(lambda: _working(n_s, 0.001)),
        "awake": run(lambda: _working(n_s, 1e-9)),
        "purged_entry": run(lambda: _purges(sizes.checks)),
    }

    def measure_round(index: int) -> dict[str, float]:
        say(f"round {index + 1} (at least {sizes.min_rounds}, at most {sizes.max_rounds})")
        return solve(interleaved(measurements, index), n_s, n_b)

    costs, rounds = estimate(
        measure_round,
        min_rounds=sizes.min_rounds,
        max_rounds=sizes.max_rounds,
        precision=sizes.precision,
    )
    say("wake latency")
    resolution = _resolution(loop)
    latency = _quantiles(_run_list(loop, lambda: _wake_latency(sizes.wake_ups, resolution)))
    say("cost per event")
    shape, stall, basis, stall_mean = shape_and_stall(
        _run_timings(loop, lambda: _per_event(sizes.events))
    )
    say("stall credit")
    credit = _run(loop, lambda: _stall_credit(sizes.bursts))
    say("speed over time")
    speed = speed_of(_speed(sizes.speed_seconds))
    return CostProfile(
        **{kind: cost.value for kind, cost in costs.items()},
        application=application,
        application_condition=application_condition,
        wake_resolution=resolution,
        wake_latency=latency,
        cost_shape=shape,
        stall=stall,
        stall_basis=basis,
        stall_credit=credit,
        stall_mean=stall_mean,
        speed=speed,
        speed_window=SPEED_WINDOW if speed else 0.0,
        loop=loop,
        python=f"{platform.python_implementation()} {platform.python_version()}",
        machine=_machine(),
        spread={kind: cost.spread for kind, cost in costs.items()},
        rounds=rounds,
        holdoffs=(),  # (a measured run's, never a calibration's)
    )


if __name__ == "__main__":  # pragma: no cover - a manual check
    print(calibrate(sys.argv[1] if len(sys.argv) > 1 else "asyncio", quick=True))
