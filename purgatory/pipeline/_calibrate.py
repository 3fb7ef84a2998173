"""``calibrate``: measure a cost profile for the load model on this machine and event loop.

Each cost is a micro-benchmark of the real `DelayedOperationPurgatory` on a real running loop
(the stock asyncio loop or uvloop), timed in CPU seconds of the loop's thread
(`time.thread_time`): what the work costs the core, not the idle time between timer wake-ups,
and less disturbed by other processes than wall time. Each is run a few times and the median
kept. The kinds and what they are charged for are listed in `purgatory.pipeline._load.COST_KINDS`.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from .. import DelayedOperation, DelayedOperationPurgatory
from ._load import LATENCY_QUANTILES, CostProfile

__all__ = ("LOOPS", "FlagOp", "calibrate")

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
    """How much work each micro-benchmark does, and how many times it is repeated."""

    repeats: int
    callbacks: int
    watches: int
    attempts_per_key: int
    checks: int
    spaced_expiries: int
    bulk_expiries: int
    wake_ups: int


_FULL: Final = _Sizes(5, 20_000, 5_000, 50, 5_000, 1_000, 4_000, 1_000)
_QUICK: Final = _Sizes(2, 2_000, 500, 10, 500, 60, 500, 200)
_KEYS: Final = 100
#: At least this many (spaced pass, idle wake-up) pairs, whose median difference is kept.
_WAKE_PAIRS: Final = 7


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


def _quantiles(values: list[float]) -> tuple[float, ...]:
    """`values`' quantiles at `LATENCY_QUANTILES` (nearest rank)."""
    ordered = sorted(values)
    n = len(ordered)
    return tuple(ordered[min(n - 1, max(0, math.ceil(p * n) - 1))] for p in LATENCY_QUANTILES)


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


def _median(repeats: int, loop: str, scenario: Callable[[], Awaitable[float]]) -> float:
    return statistics.median(_run(loop, scenario) for _ in range(repeats))


def _run_list(loop_kind: str, scenario: Callable[[], Awaitable[list[float]]]) -> list[float]:
    """Run `scenario` on a fresh loop of `loop_kind`; the values it measured."""
    loop = _new_loop(loop_kind)
    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


def calibrate(
    loop: str = "asyncio",
    *,
    quick: bool = False,
    application: float = 0.0,
    progress: Callable[[str], None] | None = None,
) -> CostProfile:
    """Measure every cost of a profile on a loop of kind `loop` (``asyncio`` or ``uvloop``).

    Args:
        quick: Smaller and fewer runs (about two seconds instead of about half a minute): a
            rough profile.
        application: The application's own CPU seconds per operation, put in as given.
        progress: Told the name of each measurement as it starts.

    Raises:
        ValueError: An unknown loop, or uvloop asked for and not installed.
        RuntimeError: A solved cost came out negative (the machine too noisy to measure).
    """
    _new_loop(loop).close()  # an unknown or missing loop fails before any measurement
    sizes = _QUICK if quick else _FULL
    say = progress or (lambda _: None)
    r = sizes.repeats
    say("dispatch")
    dispatch = _median(r, loop, lambda: _callbacks(sizes.callbacks, 1e-9))
    turn = _median(r, loop, lambda: _iterations(sizes.callbacks))
    say("watch")
    watch1 = _median(r, loop, lambda: _watches(sizes.watches, 1))
    watch4 = _median(r, loop, lambda: _watches(sizes.watches, 4))
    say("attempt")
    attempt = _median(r, loop, lambda: _attempts(sizes.attempts_per_key))
    say("completion")
    completion = _median(r, loop, lambda: _completions(sizes.checks))
    say("expiry")
    n_s, n_b = sizes.spaced_expiries, sizes.bulk_expiries
    bulk = _median(r, loop, lambda: _expiries(n_b, False))
    say("wake")
    # A spaced pass and an idle wake-up are each tens of microseconds of a sleeping loop's
    # wake-up, the pass a few more: measured in pairs, one right after the other, so that the
    # machine's drift between runs cancels in their difference, and the median difference kept.
    paired = [
        (_run(loop, lambda: _expiries(n_s, True)), _run(loop, lambda: _callbacks(n_s, 0.001)))
        for _ in range(max(r, _WAKE_PAIRS))
    ]
    spaced = statistics.median(s for s, _ in paired)
    beyond_idle = statistics.median(s / n_s - i for s, i in paired)
    asleep = _median(r, loop, lambda: _working(sizes.spaced_expiries, 0.001))
    awake = _median(r, loop, lambda: _working(sizes.spaced_expiries, 1e-9))
    resolution = _resolution(loop)
    latency = _quantiles(_run_list(loop, lambda: _wake_latency(sizes.wake_ups, resolution)))
    say("purge")
    purged_entry = _median(r, loop, lambda: _purges(sizes.checks))
    # spaced = n_s * (pass + expiry); bulk = pass + n_b * expiry, where a pass woke an idle
    # loop (wake, a turn, its timer's dispatch) and ran its task in the next turn. The model
    # charges a pass the timer and the task (timer_pass), the turns and the wake-up apart: so
    # out of it go the idle wake-up (wake, a turn, a dispatch) and one more turn; a dispatch
    # is put back for its timer's callback.
    expiry = (bulk - spaced / n_s) / (n_b - 1)
    iteration = turn - dispatch
    timer_pass = beyond_idle - expiry + dispatch - iteration
    costs = {
        "dispatch": dispatch,
        "iteration": iteration,
        # (With the work's slowdown after a sleep: what an idle wake-up costs a real callback.)
        "wake": asleep - awake - iteration,
        "watch": watch1 - dispatch,
        "watch_key": (watch4 - watch1) / 3,
        "attempt": attempt,
        "completion": completion,
        "expiry": expiry,
        "timer_pass": timer_pass,
        "purged_entry": purged_entry,
    }
    for kind, value in costs.items():
        if value < 0:
            raise RuntimeError(
                f"calibrate: the {kind} cost came out negative ({value * 1e6:.3f} us): the "
                "machine is too busy to measure; run it again on a quieter machine"
            )
    return CostProfile(
        **costs,
        application=application,
        wake_resolution=resolution,
        wake_latency=latency,
        loop=loop,
        python=f"{platform.python_implementation()} {platform.python_version()}",
        machine=_machine(),
    )


if __name__ == "__main__":  # pragma: no cover - a manual check
    print(calibrate(sys.argv[1] if len(sys.argv) > 1 else "asyncio", quick=True))
