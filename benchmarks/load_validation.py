"""The replay's load model against reality: predicted and measured outcomes at rising rates.

``python -m benchmarks.load_validation [--write]`` (needs the ``spark`` extra's numpy and
pyarrow; no Spark). In one run, on this machine:

1. **Calibrate**: a cost profile of the stock asyncio loop (`purgatory.pipeline._calibrate`),
   and the CPU cost of the synthetic application work each arrival does (a busy loop).
2. **Measure**: for each workload (`WORKLOADS`: the W1 of 100 keys and 200 ms timeouts, and one
   of 200 keys, 4 per operation, with 0.1 / 0.3 / 1 s timeouts) and each offered rate, a seeded
   trace (one purgatory, Poisson arrivals, log-normal latency, timeouts) is played open-loop
   on a real asyncio loop against a real `DelayedOperationPurgatory` with its reaper: each
   arrival is a timer callback at its time that does the application work and watches its
   operation; its condition is a timer callback at its time that marks it met and calls
   ``check_and_complete`` on its first key. The watch time, the end and the outcome of every
   operation are kept in memory (the trace itself is the recording: arrival, keys, timeout and
   condition time are the offered load, known in advance), and the loop thread's CPU time over
   the run.
3. **Predict**: the same trace replayed by the engine (`replay_table`) with the profile, whose
   events cost their kind's mean times a drawn factor and are held off the core by drawn
   stalls, and run at the speed of its window (the core's speed over time, as measured); and,
   for the expiry lateness's tail, with the profile's stalls left out, at one speed, and with
   constant costs (`VARIANTS`), to show what each distribution changes; with the run's own
   hold-offs (`RUN_HELD`); and with those and every cost scaled by one factor so that the
   replay's CPU is the run's (`RUN_CPU`, `given_cpu`): the tail given the right mean cost.
   The application's cost alone is measured at each rate too (the same trace played first
   without the purgatory, `application_overhead`) and shown, not given to the model: every
   row's profile has the figures measured at `STUB_RATE`, where the loop never idles, one
   per operation and one per condition callback (a loop that is behind schedules none for
   an operation whose condition has come by its watch, so that part is not per operation). (Given
   to the model row by row, on 2026-11-29, the per-rate figure moved from row to row by more
   than its effect: 21.2 us at 10,000/s, 25.9 at 20,000/s, 18.6 at 30,000/s in one run.)
   Each rate is played `RUNS` times and replayed as many times, each replay drawing afresh
   (`drawn_again`); the median run of each side by expiry lateness p99 is the row (near the
   knee a 2 s run's p99 is one draw of the host's spells of a slower core).
4. **Compare** per rate: expired share, wait p50/p99 (end minus watch), p99 expiry lateness
   (end minus deadline) and utilisation; and the saturation rate, on both sides the same two
   ways: from the overload (operations per CPU second in the most overloaded run, where the
   loop never idles), and from the knee (the offered rate where the loop becomes fully busy:
   utilisation reaches 95 % of the highest measured, interpolated between the rates measured).
   Below the knee an event often finds the loop idle and pays its wake-up (the profile's
   ``wake``, and its latency ``wake_latency``), so the knee comes before the overload's rate;
   the reaper's pass runs after the callbacks collected with its timer, as asyncio runs it.

Targets: within 25 % (or 2 ms, whichever is larger; for the expired share, 25 % or half a
percentage point) below saturation, and the saturation rate within 15 %. ``--write`` writes
``benchmarks/LOAD_VALIDATION.md`` and one chart per workload (``benchmarks/load_validation.png``,
``benchmarks/load_validation_2.png``). Every row gives the load averages as it started: on a
shared machine the real loop waits for a CPU, and the profile's stalls are those of the load
during the calibration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import pyarrow as pa

from purgatory import DelayedOperationPurgatory
from purgatory.pipeline import W1, ReplayConfig, replay_table
from purgatory.pipeline._calibrate import FlagOp, calibrate
from purgatory.pipeline._chart import saturation_mark, saturation_rate
from purgatory.pipeline._generate import chunk_plan, generate_chunk
from purgatory.pipeline._load import COST_KINDS, CostProfile

from .environment import describe_environment, load_average

HERE = Path(__file__).resolve().parent
TABLE = HERE / "LOAD_VALIDATION.md"
CHART = HERE / "load_validation.png"

TICK = 0.001
#: The offered rates, as shares of the saturation rate the profile predicts for a loop that
#: never idles (no wake-up charged).
SHARES = (0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.4)
#: The knee: utilisation at this share of the highest of the runs.
FULLY_BUSY = 0.95


def _busy(iterations: int) -> int:
    """The application's own work: a pure-Python loop of `iterations` steps."""
    total = 0
    for i in range(iterations):
        total += i
    return total


def application_cost(iterations: int, repeats: int = 3000) -> float:
    """CPU seconds of one `_busy` call (thread time, median of five batches)."""
    samples = []
    for _ in range(5):
        start = time.thread_time()
        for _ in range(repeats):
            _busy(iterations)
        samples.append((time.thread_time() - start) / repeats)
    return sorted(samples)[2]


def run_queue_wait() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux schedstat), or NaN.

    The model gives each loop a core of its own; on a shared machine the loop waits for one
    whenever other processes hold both, and the measurement then includes that wait.
    """
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as file:
            return int(file.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return math.nan


def make_trace(w1: W1, timeouts: tuple[float, ...] = ()) -> pa.Table:
    """A seeded W1 trace of one purgatory (arrivals from about 0); with `timeouts`, each
    operation's timeout drawn from them, equally likely (seeded too)."""
    trace = pa.Table.from_batches([generate_chunk(w1, chunk) for chunk in chunk_plan(w1)])
    if not timeouts:
        return trace
    drawn = np.random.default_rng([w1.seed, 0x7117]).choice(timeouts, trace.num_rows)
    return trace.set_column(
        trace.schema.get_field_index("timeout"), "timeout", pa.array(drawn, pa.float64())
    )


@dataclass(frozen=True)
class Workload:
    """One workload validated at rising rates: a W1 of one purgatory, its timeouts."""

    name: str
    w1: W1
    #: Each operation's timeout drawn from these; empty: every one is ``w1.timeout``.
    timeouts: tuple[float, ...] = ()

    def trace(self, rate: float, operations: int) -> pa.Table:
        return make_trace(replace(self.w1, rate=rate, operations=operations), self.timeouts)

    def describe(self) -> str:
        w1 = self.w1
        if self.timeouts:
            shown = " / ".join(f"{t * 1000:g}" for t in self.timeouts)
            timeouts = f"timeouts {shown} ms (equally likely)"
        else:
            timeouts = f"timeout {w1.timeout * 1000:g} ms"
        return (
            f"{self.name}: one purgatory, {w1.keys} keys, {w1.keys_per_op} keys per operation, "
            f"{timeouts}, latency p50/p75 {w1.p50 * 1000:g}/{w1.p75 * 1000:g} ms, "
            f"{w1.never:.0%} never complete, tick {TICK * 1000:g} ms"
        )


#: The workloads: the harness's W1, and one of several timeouts over many keys (the
#: independent check of issue 34: 4 of 200 keys, 0.1 / 0.3 / 1 s).
WORKLOADS = (
    Workload("W1", W1(purgatories=1, operations=1000, keys=100, keys_per_op=3, never=0.05)),
    Workload(
        "several timeouts",
        W1(purgatories=1, operations=1000, keys=200, keys_per_op=4, never=0.05, seed=2),
        timeouts=(0.1, 0.3, 1.0),
    ),
)


class _Op(FlagOp):
    """The benchmarks' operation, telling its run when it ends."""

    __slots__ = ("i", "key", "run")

    def __init__(self, run: _Run, i: int, key: str, timeout: float, ready: bool) -> None:
        super().__init__(timeout)
        self.run = run
        self.i = i
        self.key = key
        self.ready = ready

    def on_complete(self) -> None:
        self.run.ended(self)


class _NoPurgatory:
    """The application without the purgatory: nothing is watched, nothing completes."""

    def try_complete_else_watch(self, op: _Op, keys: list[str]) -> bool:
        return False

    def check_and_complete(self, key: str) -> int:
        return 0

    async def shutdown(self) -> None:
        pass


#: How often (seconds of the run, at most) `HoldOffs` reads the thread's wait for a CPU.
SAMPLE: Final = 0.001
#: The selector's resolution on Linux (epoll's timeout is in milliseconds, rounded up): an
#: idle loop sleeps up to this past a callback's time.
_SELECTOR: Final = 0.001


class HoldOffs:
    """The spells the loop's thread had work but was not running, during a run: from its
    schedstat (Linux: the seconds it ran, and the seconds it was runnable but waited for a CPU
    another process held), read at the harness's callbacks at most every `SAMPLE` seconds.

    Between two reads, the wait's growth w is a hold-off of w seconds ending at the second
    read (the callback that read it started that late: the wait is counted when the thread
    gets its CPU back). And where that callback started L
    seconds after it was due, the loop did not sleep in those L seconds: whatever of them it
    neither ran nor waited for a CPU (at least L minus both) the thread was off its CPU for
    another reason, *unaccounted*: a virtual machine's CPU taken by its host (steal time,
    which the guest's schedstat does not count as a wait), or a blocking page fault. Both make
    one hold-off. Nothing on a system without schedstat.

    Reading costs about a microsecond, a thousand times a second at most: a tenth of a per
    cent of the loop. A hold-off is what the profile's ``stall`` draws from one calibration's
    minute; these are the run's own, at the times they came (`spells`).
    """

    def __init__(self) -> None:
        self.fd: int | None = None
        self.last = -math.inf
        self.ran = 0
        self.waited = 0
        self.spells: list[tuple[float, float]] = []
        #: Seconds of the spells that were not a wait for a CPU (`unaccounted`).
        self.unaccounted = 0.0

    def start(self, now: float) -> None:
        """Open the running thread's schedstat (in the loop's thread) and take a first read."""
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            return
        self.last = now
        self.ran, self.waited = self._read()

    def _read(self) -> tuple[int, int]:
        """The thread's CPU and its wait for a CPU so far, in nanoseconds. (The CPU from the
        thread's clock: schedstat's own is brought up to date only at the scheduler's ticks
        and switches, milliseconds stale while the thread runs.)"""
        assert self.fd is not None
        return time.thread_time_ns(), int(os.pread(self.fd, 64, 0).split()[1])

    def sample(self, now: float, due: float) -> None:
        """At `now` (run seconds), in a callback due at `due`, read schedstat if `SAMPLE` has
        passed since the last read."""
        last = self.last
        if now - last < SAMPLE or self.fd is None:
            return
        self.last = now
        ran, waited = self._read()
        ran_s, waited_s = (ran - self.ran) / 1e9, (waited - self.waited) / 1e9
        self.ran, self.waited = ran, waited
        # (Late by less than the selector's millisecond, an idle loop may have slept it.)
        other = max(0.0, min(now - due - _SELECTOR, now - last) - ran_s - waited_s)
        held = min(waited_s + other, now - last)
        if held > 0:
            self.unaccounted += other
            self.spells.append((max(now - held, last), held))

    def stop(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def longest(self) -> float:
        """The longest hold-off, in seconds (0 if none)."""
        return max((held for _, held in self.spells), default=0.0)


class Collections:
    """The cyclic garbage collector's passes during a run (`gc.callbacks`): generation, start
    (run seconds) and pause.

    On CPython before 3.13 a pass is triggered when the objects the collector tracks have
    grown by 700 (the first threshold) since the last: allocations count up, deallocations
    down. Every arrival's timer handle here is made before the run (and frozen) and freed as
    the arrival runs, so the run frees more tracked objects than it makes, and the count stays
    near 0: no pass runs during a run at all (measured: none in the runs of W1 at 20,518/s). A
    server that makes each request's objects when it comes would see the passes its growth
    triggers (a backlog building near the knee); this records whatever runs, so a row says
    what its run had.
    """

    def __init__(self) -> None:
        self.passes: list[tuple[int, float, float]] = []
        self._base = 0.0
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.monotonic()
        else:
            end = time.monotonic()
            self.passes.append((info["generation"], self._began - self._base, end - self._began))

    def start(self, base: float) -> None:
        self._base = base
        gc.callbacks.append(self._callback)

    def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)

    def longest(self) -> float:
        """The longest pause, in seconds (0 if none)."""
        return max((pause for _, _, pause in self.passes), default=0.0)


class _Run:
    """One trace played on the running loop: every operation's watch, end and outcome."""

    def __init__(
        self, trace: pa.Table, iterations: int, stub: bool = False, conditions: bool = True
    ) -> None:
        self.arrivals: list[float] = trace.column("arrival").to_pylist()
        self.keys: list[list[str]] = trace.column("keys").to_pylist()
        self.timeouts: list[float] = trace.column("timeout").to_pylist()
        n = len(self.arrivals)
        # (Without `conditions`, no operation has one: none schedules a condition callback.)
        self.conditions: list[float | None] = (
            trace.column("condition_at").to_pylist() if conditions else [None] * n
        )
        self.n = n
        self.iterations = iterations
        self.watched = [0.0] * n
        self.end = [0.0] * n
        self.expired = [False] * n
        self.left = n
        self.base = 0.0
        self.loop = asyncio.get_running_loop()
        self.done = self.loop.create_future()
        self.stub = stub
        self.triggers = 0
        self.purgatory: DelayedOperationPurgatory[_Op] | _NoPurgatory = (
            _NoPurgatory() if stub else DelayedOperationPurgatory("validate", tick=TICK)
        )
        # What held the loop off during the run, besides its own work: the spells it waited
        # for a CPU (`HoldOffs`), and the cyclic collector's passes (`Collections`).
        self.holdoffs = HoldOffs()
        self.collections = Collections()

    def ended(self, op: _Op) -> None:
        self.end[op.i] = time.monotonic() - self.base
        self.expired[op.i] = op.is_expired
        self.left -= 1
        if not self.left:
            self.done.set_result(None)

    def arrive(self, i: int) -> None:
        loop = self.loop
        _busy(self.iterations)
        now = time.monotonic() - self.base
        condition = self.conditions[i]
        timeout = self.timeouts[i]
        keys = self.keys[i]
        self.holdoffs.sample(now, self.arrivals[i])
        op = _Op(self, i, keys[0], timeout, condition is not None and condition <= now)
        self.watched[i] = now
        if (
            not self.purgatory.try_complete_else_watch(op, keys)
            and condition is not None
            and condition < now + timeout + TICK
        ):
            loop.call_at(self.base + condition, self.trigger, op)
        elif self.stub:  # without a purgatory: what the run does when an operation ends
            self.ended(op)

    def trigger(self, op: _Op) -> None:
        self.triggers += 1
        condition = self.conditions[op.i]
        self.holdoffs.sample(time.monotonic() - self.base, condition or 0.0)
        if op.is_completed:
            return
        op.ready = True
        self.purgatory.check_and_complete(op.key)
        if self.stub:
            self.ended(op)

    async def play(self) -> dict[str, float]:
        # time.monotonic is the asyncio loop's clock and the purgatory's.
        # Every arrival is a timer handle from the start, so that the loop serves arrivals,
        # conditions and the reaper in the order of their times, as the model does (a chain in
        # which each arrival schedules the next would put a backlog of arrivals behind
        # everything else).
        self.base = time.monotonic() + 0.05 + 1e-5 * self.n
        for i, arrival in enumerate(self.arrivals):
            self.loop.call_at(self.base + arrival, self.arrive, i)
        # (Without a purgatory, an operation "ends" at its condition, or at its arrival when it
        # has none to wait for: done once every one has.)
        # The handles and the trace are long-lived: out of the collector's full passes, which
        # would otherwise walk them all, every few thousand allocations, during the run.
        # (Freezing them also keeps the collector from running at all during the run, on
        # CPython before 3.13: see `Collections`.)
        gc.collect()
        gc.freeze()
        await asyncio.sleep(self.base - time.monotonic() - 0.01)
        cpu = time.thread_time()
        waited = run_queue_wait()
        self.holdoffs.start(time.monotonic() - self.base)
        self.collections.start(self.base)
        try:
            await self.done
        finally:
            self.collections.stop()
            self.holdoffs.stop()
            gc.unfreeze()
        cpu = time.thread_time() - cpu
        waited = run_queue_wait() - waited
        span = max(self.end) - self.watched[0] if not self.stub else 1.0
        await self.purgatory.shutdown()
        return {"cpu": cpu, "span": span, "waited": waited}


def measure(trace: pa.Table, iterations: int) -> dict[str, Any]:
    """Play `trace` on a fresh asyncio loop; its outcomes and the loop thread's CPU seconds."""

    async def main() -> tuple[_Run, dict[str, float]]:
        run = _Run(trace, iterations)
        return run, await run.play()

    run, cpu = asyncio.run(main())
    deadlines = [w + t for w, t in zip(run.watched, run.timeouts, strict=True)]
    return outcome_stats(
        run.watched, run.end, deadlines, run.expired, cpu["cpu"] / max(cpu["span"], 1e-9)
    ) | {
        "cpu": cpu["cpu"],
        "waited": cpu["waited"] / max(cpu["span"], 1e-9),
        "held_longest": run.holdoffs.longest(),
        "unaccounted": run.holdoffs.unaccounted / max(cpu["span"], 1e-9),
        "holdoffs": run.holdoffs.spells,
        "collections": len(run.collections.passes),
        "collection_longest": run.collections.longest(),
    }


class _Turns:
    """The loop's turns during a run, counted at its selector: every turn of asyncio's loop
    calls ``select`` once, with a timeout of 0 when work is ready, and a longer one (or
    none) when it goes to sleep until its next timer (a wake-up, in the model's terms)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.selector: Any = getattr(loop, "_selector", None)
        self.select: Any = None
        self.turns = 0
        self.sleeps = 0

    def __call__(self, timeout: float | None = None) -> Any:
        self.turns += 1
        if timeout is None or timeout > 0:
            self.sleeps += 1
        return self.select(timeout)

    def __enter__(self) -> _Turns:
        if self.selector is not None:
            self.select = self.selector.select
            self.selector.select = self
        return self

    def __exit__(self, *exc: object) -> None:
        if self.selector is not None:
            del self.selector.select


@dataclass(frozen=True)
class Application:
    """The application's own CPU seconds (the harness's work around the purgatory), as the
    model charges them: per operation (its profile's ``application``) and per condition
    callback (``application_condition``)."""

    #: Per operation: the busy loop, reading the clock, creating the operation, popping its
    #: arrival's timer from a heap holding every arrival of the run, noting its end.
    operation: float
    #: Per condition callback, beyond the loop's dispatch: scheduling it as a timer when its
    #: operation waits, and serving it.
    condition: float


#: How many pairs of stub runs `application_overhead` takes the medians of by default.
STUB_ROUNDS: Final = 3
#: The rate of W1 at which the profile's application figures are measured: past saturation
#: with and without the conditions (about 1.7 and 1.2 times what the stub's loop sustains,
#: measured on 2026-11-29), so that neither run's loop idles.
STUB_RATE: Final = 90_000.0


def _stub_work(
    trace: pa.Table, iterations: int, profile: CostProfile, conditions: bool
) -> tuple[float, int, int]:
    """`trace` played with the purgatory taken out (and, without `conditions`, with none
    scheduled): the CPU seconds of the loop's thread less what the model charges the loop for
    it (`profile`'s ``dispatch`` of each arrival and condition callback, ``iteration`` of each
    of the loop's turns, and ``wake`` of each turn that slept, counted at the selector), the
    operations and the condition callbacks run."""

    async def main() -> tuple[_Run, dict[str, float], _Turns]:
        run = _Run(trace, iterations, stub=True, conditions=conditions)
        with _Turns(run.loop) as turns:
            cpu = await run.play()
        return run, cpu, turns

    run, cpu, turns = asyncio.run(main())
    loop = (
        profile.dispatch * (run.n + run.triggers)
        + profile.iteration * turns.turns
        + profile.wake * turns.sleeps
    )
    return cpu["cpu"] - loop, run.n, run.triggers


def application_overhead(
    trace: pa.Table, iterations: int, profile: CostProfile, rounds: int = STUB_ROUNDS
) -> Application:
    """The application's own CPU seconds per operation and per condition callback: `trace`
    played with the purgatory taken out, once as it is and once with no condition scheduled
    (every operation ends at its arrival), `rounds` times in turn; each less what the model
    charges the loop for it (`_stub_work`). Per operation: the medians of the runs without
    conditions; per condition callback: the medians of each pair's difference over the
    callbacks run.

    Apart, because they are not done as often: a loop that is behind completes an operation
    whose condition has already come at its watch and schedules no callback for it. Measured
    past saturation on 2026-11-29 (W1 at 64,000/s, a load average of 1.5 to 1.7), the real
    loop ran 0.10 to 0.15 condition callbacks an operation, the stub playing the same trace
    0.91; and 3.3 us a callback beside 11.7 us for the rest of an operation, in the same
    minute. One figure per operation from the stub charged the model's overloaded loop for
    about 0.8 callbacks an operation that it does not run either: replayed with the quiet
    run's means (19f2110's file, constant costs), the overload's rate came out 16 to 22 % low
    with its one figure of 18.2 us and 2 to 6 % low with it split in the proportions measured
    here (14.4 us an operation, 4.2 a callback).

    The figures at a lower rate come out higher (on a shared machine, 23 to 25 us an
    operation at 10,000/s of W1 with its conditions, 17.6 at 60,000/s), and not because an
    operation's own work is dearer: instrumented on 2026-11-29 (a load average of 1.2 to 3.2),
    the harness's callbacks cost the same CPU per operation at 9,000/s as at 36,000/s (20.1
    and 19.3 us, and 19.4 at 9,000/s with the loop kept from sleeping: medians of 3). What
    grows is the wake-up: an idle loop's selector call, and its batch's first callbacks
    after the sleep (+8 to 13, +1 to 2, +0.5 to 1 us for the first three), and more the
    longer the batch and the busier the machine (other processes' use of the caches while
    the loop slept). Less the figures measured here, the stub's CPU per sleep came to 33 to
    38 us at 2,000 and 4,000/s beside the profile's ``wake`` of 33.5 in the same minute (a
    load average of about 2), but to 35 to 57 at 2,000/s and 47 to 190 at 9,000 and
    18,000/s beside a ``wake`` of 28.8 in another (about 3). ``wake`` is timed with one
    small callback a wake-up, so the profile charges the wake-up of a short batch: the load
    validation shows the figures at each rate it plays, on that rate's trace, and does not
    give them to the model.
    """
    per_operation, per_condition = [], []
    for _ in range(rounds):
        scheduled, n, triggers = _stub_work(trace, iterations, profile, conditions=True)
        alone, _, _ = _stub_work(trace, iterations, profile, conditions=False)
        per_operation.append(alone / n)
        per_condition.append((scheduled - alone) / triggers if triggers else 0.0)
    return Application(
        operation=max(0.0, statistics.median(per_operation)),
        condition=max(0.0, statistics.median(per_condition)),
    )


def scale_costs(profile: CostProfile, factor: float) -> CostProfile:
    """`profile` with every cost of `COST_KINDS` (the per-event costs, ``wake``,
    ``iteration``, ``application``, ``timer_pass``...) multiplied by `factor`: the same work
    dearer or cheaper on average. What is not CPU stays as measured: the stalls and hold-offs
    (durations), the wake-up latency, the selector's resolution; so do the shapes (factors
    over the mean) and the core's speed over time, and ``stall_basis`` (a dearer event is
    held off proportionally more often, as per CPU second)."""
    if not factor > 0:
        raise ValueError(f"a cost factor must be positive, got {factor!r}")
    return replace(profile, **{kind: getattr(profile, kind) * factor for kind in COST_KINDS})


#: How many replays `given_cpu` makes to find its factor: the replay's busy time is
#: near-linear in the costs, less so where a dearer loop batches more events per wake-up.
MATCH_ROUNDS: Final = 3


def given_cpu(
    trace: pa.Table, profile: CostProfile, cpu: float, first: dict[str, Any] | None = None
) -> tuple[float, dict[str, Any]]:
    """The replay of `trace` with `profile`'s costs scaled by one factor so that its busy CPU
    is `cpu` (the real loop's thread CPU over the same trace): the factor and the replay.

    `first` is the replay with `profile` as it is, if already made. The first step scales by
    the ratio of `cpu` to its busy time; the next ones go along the secant of the last two
    (the busy time grows less than the costs where a dearer loop wakes less often), for
    `MATCH_ROUNDS` replays in all.
    """
    predicted = first if first is not None else predict(trace, profile)
    if not predicted["cpu"] > 0 or not cpu > 0:
        return 1.0, predicted
    # (factor, its replay's busy time): the last two replayed.
    last, last_cpu = 1.0, predicted["cpu"]
    factor = cpu / last_cpu
    for i in range(MATCH_ROUNDS):
        if i:
            busy = predicted["cpu"]
            step = (
                factor + (cpu - busy) * (factor - last) / (busy - last_cpu)
                if busy != last_cpu
                else factor * cpu / busy
            )
            last, last_cpu = factor, busy
            factor = step if step > 0 else factor * cpu / busy
        predicted = predict(trace, scale_costs(profile, factor))
    return factor, predicted


def predict(trace: pa.Table, profile: CostProfile) -> dict[str, Any]:
    """Replay `trace` with `profile`: the same statistics as `measure`."""
    table = replay_table(trace, {0: ReplayConfig(tick=TICK)}, costs=profile)
    ops = table.filter(pa.compute.is_valid(table["op_id"]))
    stats = table.filter(pa.compute.is_null(table["op_id"])).to_pylist()[0]
    return outcome_stats(
        ops.column("watched_at").to_pylist(),
        ops.column("ended_at").to_pylist(),
        ops.column("deadline").to_pylist(),
        [o == "expired" for o in ops.column("outcome").to_pylist()],
        stats["busy"] / stats["span"] if stats["span"] else 0.0,
    ) | {"cpu": stats["busy"]}


def _pdisc(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``percentile_disc``, as the pipeline's summaries)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p * len(ordered))) - 1]


def outcome_stats(
    watched: Sequence[float],
    end: Sequence[float],
    deadline: Sequence[float],
    expired: Sequence[bool],
    utilisation: float,
) -> dict[str, Any]:
    """Expired share, wait p50/p99 and p99 expiry lateness of one run's operations."""
    waits = [e - w for w, e in zip(watched, end, strict=True)]
    late = [e - d for e, d, x in zip(end, deadline, expired, strict=True) if x]
    return {
        "operations": len(waits),
        "expired_share": sum(expired) / max(1, len(waits)),
        "wait_p50": _pdisc(waits, 0.5),
        "wait_p99": _pdisc(waits, 0.99),
        "late_p99": _pdisc(late, 0.99),
        "utilisation": utilisation,
    }


def knee_rate(rows: Sequence[dict[str, Any]], side: str) -> float | None:
    """The offered rate where the loop becomes fully busy on `side`: where utilisation first
    reaches `FULLY_BUSY` of the highest utilisation of the runs (linear between the rates
    around it: a busy loop's utilisation, CPU over wall time, stays a little under 1);
    ``None`` if the lowest rate is already there or none gets there."""
    level = FULLY_BUSY * max(row[side]["utilisation"] for row in rows)
    points = [(row["rate"], row[side]["utilisation"]) for row in rows]
    for (r0, u0), (r1, u1) in itertools.pairwise(points):
        if u0 < level <= u1:
            rate: float = r0 + (r1 - r0) * (level - u0) / (u1 - u0)
            return rate
    return None


def within(predicted: float, measured: float, absolute: float) -> bool:
    """The target: within 25 % of the measurement, or `absolute`, whichever is larger."""
    return abs(predicted - measured) <= max(0.25 * abs(measured), absolute)


METRICS = (
    # (key, header, scale to display, absolute tolerance)
    ("expired_share", "expired %", 100.0, 0.005),
    ("wait_p50", "wait p50 ms", 1000.0, 0.002),
    ("wait_p99", "wait p99 ms", 1000.0, 0.002),
    ("late_p99", "expiry late p99 ms", 1000.0, 0.002),
    ("utilisation", "utilisation %", 100.0, math.inf),
)


#: The model's variants the tail is also predicted with: (name, what the profile loses).
VARIANTS: dict[str, dict[str, Any]] = {
    "cost shape, no stall": {"stall": ()},
    "one speed (version 4), no stall": {"stall": (), "speed": (), "speed_window": 0.0},
    "constant costs (version 3)": {
        "cost_shape": (),
        "stall": (),
        "speed": (),
        "speed_window": 0.0,
    },
}
#: The variant given the run's own hold-offs (`HoldOffs`) of at least `HELD` seconds at the
#: times they came, instead of the profile's drawn stalls: what the model predicts knowing
#: when other processes took the loop's CPU, which no profile can know in advance.
RUN_HELD: Final = "the run's hold-offs"
#: The `RUN_HELD` variant with its costs all scaled by one factor so that the replay's busy
#: CPU is the run's measured thread CPU (`given_cpu`): the model's tail given the right mean
#: cost, and the hold-offs the run had.
RUN_CPU: Final = "the run's hold-offs and CPU (costs x factor)"
#: The shortest hold-off the `RUN_HELD` variant replays: shorter ones are a wake-up's
#: scheduling latency, which the profile's ``wake_latency`` already draws.
HELD: Final = 0.001
#: Runs of each rate, on each side (`--runs`). Near the knee a 2 s run's expiry lateness p99
#: is one draw of the host's spells of a slower core (the same W1 trace at 32,068/s gave 2.8 to
#: 96 ms over 22 runs within three minutes), and the model's is one draw of the spells it
#: replays: one run against one replay compares two draws. A row is the median run of these
#: many, measured, against the median of as many replays drawing their spells afresh.
RUNS: Final = 3


def median_index(runs: Sequence[dict[str, Any]]) -> int:
    """Which of `runs` has the median expiry lateness p99 (the lower middle one of an even
    count): the row shows that run whole, so that its figures are one run's, not medians
    taken one by one from different runs."""
    order = sorted(range(len(runs)), key=lambda i: runs[i]["late_p99"])
    return order[(len(order) - 1) // 2]


def drawn_again(trace: pa.Table, draw: int) -> pa.Table:
    """`trace` for the model's `draw`-th replay: the same operations under another purgatory
    name after the first (``#draw`` appended), since the replay seeds a group's draws (its
    offset in the speed sequence, its costs' and stalls' factors) from the group's name."""
    if not draw:
        return trace
    index = trace.schema.get_field_index("purgatory")
    names = [f"{name}#{draw}" for name in trace.column(index).to_pylist()]
    return trace.set_column(index, "purgatory", pa.array(names, pa.string()))


def render(sections: list[dict[str, Any]], profile: CostProfile, run: dict[str, Any]) -> str:
    """The markdown report; each of `sections` has ``workload``, ``rows``, ``saturation`` and
    ``chart``; `run` has ``environment``, ``took`` and ``seconds``."""
    lines = [
        "# Load model validation",
        "",
        "Written by `python -m benchmarks.load_validation --write`: the real purgatory on a real "
        "asyncio loop at rising offered rates, against the replay of the same traces with a "
        "cost profile calibrated on the same machine in the same run. "
        "Each cell is predicted / measured; **bold** marks a miss of the target (25 % or 2 ms "
        "below the knee, whichever is larger; for the expired share 25 % or 0.5 point).",
        "",
        f"- Machine: {run['environment']}; run took {run['took']:.0f} s.",
        f"- Profile: {profile.describe()}.",
        f"- {run['seconds']:g} s of arrivals per rate, played {run['runs']} times on the "
        f"loop and replayed {run['runs']} times by the model, each replay drawing its spells "
        "of a slower core, its costs and its stalls afresh (the trace under another "
        "purgatory name: the replay seeds its draws from the name): a row is the median "
        "run of each side by expiry lateness p99, whole (every figure of the row is that "
        "run's), and the column after the table's figures lists every run's p99, since near "
        "the knee it is one draw of the host's spells (`RUNS`). The variants of the tail "
        "table replay the median draw, and take the hold-offs and CPU of the median run. "
        "Application work per arrival, in the "
        f"profile: {profile.application * 1e6:.1f} us an operation, and "
        f"{profile.application_condition * 1e6:.1f} us a condition callback, measured by "
        f"playing a trace at {STUB_RATE:,.0f}/s, where the loop never idles, with the "
        "purgatory taken out (a busy loop, reading the clock, creating the operation, timers "
        "popped from a heap holding every arrival of the run), once as it is and once with no "
        "condition scheduled, minus what the model charges the loop for it (the dispatch of "
        "its callbacks, its turns and wake-ups, counted at the selector): a condition "
        "callback's part (scheduling it as a timer and serving it) is charged per callback, "
        "since a loop that is behind completes an operation whose condition has come at its "
        "watch and schedules none. The same is measured on each row's trace and shown in the "
        "tail tables, not given to the model: row by row it moved by more than its effect.",
        "- The last three columns are measured only: the share of the run the loop's thread "
        "was runnable but waiting for a CPU held by another process (Linux schedstat), the "
        "share it had work due but neither ran nor waited (a virtual machine's CPU taken by "
        "its host, which the guest does not count as a wait), and the longest hold-off of "
        "either (read at most every millisecond at the harness's callbacks); the cyclic "
        "collector's passes during the run and the longest; and the load averages as the "
        "run started. The model gives the loop a core of its own but for "
        "the profile's stalls (an event held off the core, measured per callback by "
        "`calibrate` under the machine's load of the moment); where the share is more than a "
        "few per cent, the measured waits and lateness include the machine's other load, and "
        "one hold-off of several milliseconds near the knee is enough to set a run's expiry "
        "lateness p99 (the last table of each section replays the run's own).",
    ]
    for section in sections:
        lines += _section(section)
    lines += [
        "What the model charges, and what it leaves out:",
        "",
        "- **The loop's turns and wake-ups.** The model turns as asyncio's loop does: each "
        "iteration collects the callbacks due and runs them in the order of their times; an "
        "idle loop sleeps until its next timer rounded up to the selector's millisecond and "
        "wakes later by a scheduling latency drawn from the profile's measured quantiles "
        "(here "
        + _latency(profile)
        + "), paying `wake`, which includes the work's slowdown after a sleep.",
        "- **The reaper behind the batch.** The reaper's timer only wakes its task: the pass "
        "runs at the start of the next iteration, after every callback collected with the "
        "timer, so on a busy loop an expiry waits for a batch of arrivals and conditions.",
        "- **Unequal events.** Each arrival, condition and timer pass costs its kind's mean "
        "times a factor drawn from the profile's `cost_shape` (each callback's CPU over the "
        "mean, timed one by one on a busy loop: cold caches, a page fault), and holds "
        "the core for a stall drawn from `stall` (wall minus CPU of the same callbacks: "
        "another process preempting the loop), as likely per CPU second. Near the knee one "
        "long event delays a batch and the reaper behind it, and the backlog drains slowly: "
        "the tail of the expiry lateness. With constant costs (a profile of version 3) the "
        "predicted tail stops near the tick and the selector's millisecond.",
        "- **Spells of a slower core.** On this virtual machine the same work costs more CPU "
        "for spells of a tenth of a second and more, every callback alike (instrumented, the "
        "real loop's median arrival went from 14.9 to 22.6 us for 160 ms at once, with no "
        "wait for a CPU, and its lag from 1 to 16 ms meanwhile, at 26,211/s of several "
        "timeouts): independent draws per event average out within a batch, a spell does not. "
        "`calibrate` times a fixed unit of work back to back for a few seconds (the profile's "
        "`speed`, here "
        + _speed(profile)
        + "), and the model multiplies every event's cost by the factor of the window it "
        "starts in, the measured sequence laid along the trace's time from an offset drawn "
        "per group. Whether a spell meets a busy moment of a 2 s run is chance, in the model "
        "as on the machine: a run's p99 near the knee is one draw of it, so each row is the "
        "median of several runs on each side, every run's p99 listed. (Played 22 times "
        "within three minutes of 2026-11-29, a load average of 0.9 to 2.5, the same trace of "
        "W1 at 32,068/s gave an expiry lateness p99 of 2.8 to 96 ms; each run over 10 ms that "
        "did not wait for a CPU either had its arrivals cost 1.27 to 1.43 times its median "
        "CPU in the 150 ms before it was furthest behind, or cost 18 to 20 us an arrival "
        "throughout, against 14 in the runs under 10 ms.)",
        "- **Other processes.** The stalls are drawn from one calibration's minute; the "
        "machine's load changes from minute to minute (the load averages above), so on a "
        "shared machine the measured and predicted tails agree only as well as the load "
        "during the calibration matches the load during each run. Near the knee a single "
        "hold-off of a few milliseconds (another process given the loop's CPU) delays a "
        "whole batch and the backlog behind it drains slowly, so a 2 s run's p99 depends on "
        "whether one came, and when: the tail replayed with the run's own hold-offs, at the "
        "times they came, shows what the model makes of them. The overload's rate is "
        "compared in operations per CPU second, which that wait does not change.",
        _loop_cpu(sections),
        "- **The cyclic garbage collector** runs no pass during these runs (the column): on "
        "CPython before 3.13 a pass is triggered by the tracked objects' growth (allocations "
        "minus deallocations) by 700, and here every arrival frees its timer handle, made "
        "before the run. Nor during `calibrate`'s timed callbacks, scheduled the same way. A "
        "server that makes each request's objects as it comes sees the passes its growth "
        "triggers (a backlog building near the knee); the model charges none.",
        "- **Past the knee** the queue grows for as long as the run lasts, so waits and "
        "lateness there depend on the run's length as much as on the model; they are shown, "
        "not scored.",
        "",
    ]
    return "\n".join(lines)


#: The busiest rows scored: offered rates up to this share of the rate a fully busy loop
#: sustains (the measured overload's operations per CPU second), the target's "90 % busy".
SCORED_BUSY: Final = 0.9


def _edge(section: dict[str, Any]) -> float | None:
    """Where a section's rows stop being scored: the measured knee or `SCORED_BUSY` of the
    measured overload's rate, whichever comes first. The knee alone is not enough: utilisation
    is the loop's CPU over the whole run, whose end is the drain of the last operations'
    timeouts, an idle second with 1 s timeouts, so a loop that has fallen behind by hundreds
    of milliseconds still shows 70 % (the several-timeouts workload on 2026-11-29: its knee
    read at 74,946/s, above the 62,315/s its loop sustained)."""
    saturation = section["saturation"]
    knee, overload = saturation["knee"]["measured"], saturation["overload"]["measured"]
    edges = [edge for edge in (knee, overload and SCORED_BUSY * overload) if edge]
    return min(edges) if edges else None


def _loop_cpu(sections: list[dict[str, Any]]) -> str:
    """The caveat on the loop's CPU below the knee: this run's own figures (the factor the
    costs took to match each row's CPU, the application's cost at each rate), and the parts
    instrumented once."""
    parts = []
    for section in sections:
        edge = _edge(section)
        rows = section["rows"]
        below = [row["factor"] for row in rows if edge is None or row["rate"] < edge]
        first, last = rows[0], rows[-1]
        factors = "no row below the knee"
        if below:
            span = f" to x{max(below):.2f}" if len(below) > 1 else ""
            factors = f"x{min(below):.2f}{span} below the knee"
        parts.append(
            f"{section['workload'].name}: {factors}, x{last['factor']:.2f} at the highest "
            f"rate, the application {first['application'] * 1e6:.1f} us an operation at "
            f"{first['rate']:,.0f}/s and {last['application'] * 1e6:.1f} at "
            f"{last['rate']:,.0f}/s"
        )
    return (
        "- **The loop's CPU below the knee** is more than the model charges (the "
        "utilisation column; said per section where it is more than 10 %), and that, more "
        "than any distribution, is what puts the measured tail before the model's. In this "
        "run, for the replay's busy time to be the real loop's thread CPU, the model's costs "
        "took a factor of ("
        + "; ".join(parts)
        + "; the application's cost alone at each rate is in the tail tables' last but one "
        "column). "
        "Instrumented on 2026-11-29 on a shared machine (W1, a load average of 1.2 to 3.2), "
        "an operation's own work is not what grows at lower rates: the harness's callbacks "
        "cost 20.1 us of CPU an operation at 9,000/s and 19.3 at 36,000/s (19.4 at 9,000/s "
        "with the loop kept from sleeping). The rest has parts the profile's means do not "
        "hold, each larger the less busy the loop: a wake-up with the batch after it (the "
        "first four arrivals after a sleep +21, +4 to 5, +2 and +1.5 us over the rest; "
        "`calibrate` times one small callback a wake-up, and the application's own loop paid "
        "33 to 190 us a sleep, the more the longer its batch and the busier the machine, "
        "against a `wake` of 29 to 34 measured in the same minutes); a condition's "
        "`check_and_complete`, about 3.4 us a call at 9,000/s (15 tries a call) and 3.8 at "
        "32,000/s (49 tries), against the 1.3 and 3.3 charged (a completion and a cost per "
        "try: what the call costs beyond its tries is not in the profile); the reaper's "
        "work (the real loop's CPU outside the harness's callbacks less the stub's on the "
        "same trace: its passes, expiries and purges) 2.4 us an operation at 9,000/s against "
        "1.5 charged, 0.7 against 0.6 at 32,000/s; and a purge pass of about 1,000 "
        "finished operations 0.4 to 1.5 ms (0.8 to 1.6 us an entry removed) against 0.06 "
        "us an entry charged. Each is a cost of cold caches that depends on the working set, "
        "which a calibration on a small purgatory does not reproduce. What would close the "
        "gap: these costs measured where they arise, on a purgatory of the workload's size (a "
        "`check_and_complete` on a cold key, a wake-up with its batch, a purge pass over a "
        "long queue), as costs of their own; the per-sleep cost moved 2 to 4 times between "
        "identical runs here, too much for one calibration point."
    )


#: A run whose loop waited for a CPU longer than this share of it (the median of the rows)
#: measured the machine's other load as much as the loop.
SHARED: Final = 0.05
#: Rows below the knee whose loop used more CPU than the replay's busy time by more than this
#: share (their median) are said to be busier than the model.
BUSIER: Final = 0.1


def _caveats(
    rows: list[dict[str, Any]], over: dict[str, float | None], edge: float | None
) -> list[str]:
    """What limits this section's comparison, from its own figures: the loop's wait for a CPU,
    a real loop busier than the replay below the knee (rows below `edge`), and a profile whose
    CPU per operation is not the runs' (calibrated under another load)."""
    said = []
    waited = statistics.median(row["measured"]["waited"] for row in rows)
    if waited > SHARED:
        said.append(
            f"- **Not a quiet machine**: the loop waited for a CPU {waited:.0%} of a run's time "
            "(median of the rows), so every measured row is of a loop with a share of a core, "
            "near or past its own knee whatever the offered rate; the scores below test the "
            "model of a shared core, and a quiet run (this column under a few per cent) must "
            "confirm the target."
        )
    below = [row for row in rows if edge is None or row["rate"] < edge]
    ratios = sorted(
        row["measured"]["cpu"] / row["predicted"]["cpu"] for row in below if row["predicted"]["cpu"]
    )
    if ratios and statistics.median(ratios) > 1 + BUSIER:
        low, high = 100 * (ratios[0] - 1), 100 * (ratios[-1] - 1)
        # (A row below the knee can have used less CPU than the replay: its sign is said.)
        span = (
            f"{low:.0f} to {high:.0f} % more than"
            if low >= 0
            else f"{low:+.0f} to {high:+.0f} % off"
        )
        said.append(
            f"- **The real loop is busier below the knee than the model**: its thread's CPU "
            f"was {span} "
            "the replay's busy time in the rows below the knee (the utilisation column): the "
            "real loop works nearer its knee than the model's, so a spell of a slower core "
            "or a hold-off sends it further behind, and its expiry-lateness tail there is "
            "longer than predicted "
            "(where that CPU goes: the loop's CPU below the knee, below)."
        )
    predicted, measured = over["predicted"], over["measured"]
    if predicted and measured and abs(predicted - measured) > 0.15 * measured:
        said.append(
            f"- **The profile's CPU is not the runs'**: operations per CPU second at overload "
            f"are {_gap(predicted, measured)} from the measured, so the model's core saturates "
            "at another rate, and its waits and lateness differ by more than its tail: the "
            "calibration's minute ran under another load than the runs (CPU time grows with "
            "the caches other processes take)."
        )
    return said


def _section(section: dict[str, Any]) -> list[str]:
    """One workload's table, its saturation and its chart."""
    workload: Workload = section["workload"]
    rows = section["rows"]
    over, knee = section["saturation"]["overload"], section["saturation"]["knee"]
    # Rows are scored below where the measured loop becomes fully busy (or, without a knee in
    # the range, below the overload's rate).
    edge = _edge(section)
    lines = [
        "",
        f"## {workload.name}",
        "",
        f"- Workload: {workload.describe()}.",
        "- Saturation, read two ways, the same on both sides: **from the overload** (operations "
        "per CPU second of the loop's thread in the most overloaded run, where the loop never "
        f"idles): predicted {_num(over['predicted'])}/s, measured {_num(over['measured'])}/s "
        f"({_verdict(over)}); **from the knee** (the offered rate where the loop becomes fully "
        f"busy: utilisation at {FULLY_BUSY:.0%} of the highest of the runs, interpolated): "
        f"predicted {_num(knee['predicted'])}/s, measured {_num(knee['measured'])}/s "
        f"({_verdict(knee)}). Rows below the measured knee and below {SCORED_BUSY:.0%} of the "
        "measured overload's rate are scored (the knee alone misses a loop that has fallen "
        "behind while its utilisation, over a run that ends with the last timeouts' drain, "
        "stays low).",
        "",
        "| offered /s | ops | "
        + " | ".join(header for _, header, _, _ in METRICS)
        + " | expiry late p99 ms of each run "
        "| loop waited for a CPU %, off it otherwise %, longest hold-off ms "
        "| collections, longest ms | load average |",
        "|---:|---:|" + "---:|" * len(METRICS) + "---:|---:|---:|---:|",
    ]
    for row in rows:
        below = edge is not None and row["rate"] < edge
        cells = []
        for key, _, scale, tol in METRICS:
            p, m = row["predicted"][key], row["measured"][key]
            text = f"{p * scale:.2f} / {m * scale:.2f}"
            if below and not within(p, m, tol):
                text = f"**{text}**"
            cells.append(text)
        marker = "" if below else " (past)"
        seen = row["measured"]
        each = " / ".join(
            ", ".join(f"{late * 1e3:.1f}" for late in row["late_runs"][side])
            for side in ("predicted", "measured")
        )
        lines.append(
            f"| {row['rate']:,.0f}{marker} | {row['measured']['operations']:,} | "
            + " | ".join(cells)
            + f" | {each} | {100 * seen['waited']:.1f}, {100 * seen['unaccounted']:.1f}, "
            f"{1e3 * seen['held_longest']:.1f} | "
            f"{seen['collections']}, {1e3 * seen['collection_longest']:.1f} | {row['load']} |"
        )
    misses = [
        (row["rate"], header)
        for row in rows
        if edge is not None and row["rate"] < edge
        for key, header, _, tol in METRICS
        if not within(row["predicted"][key], row["measured"][key], tol)
    ]
    lines += ["", *_caveats(rows, over, edge)]
    tail = [
        "",
        "Expiry lateness p99 (ms) by what the model draws: the full profile (as in the table "
        "above), without its stalls (what a quiet machine's profile, whose stalls are near 0, "
        "would predict), without its stalls and at one speed (no spells of a slower core: a "
        "profile of version 4), with constant costs, and given the run's own hold-offs (the "
        "spells of "
        f"{HELD * 1e3:g} ms or more its loop waited for a CPU, at the times they came, instead "
        "of the drawn stalls: what the model predicts knowing when other processes took the "
        "loop's CPU, which no profile can know in advance; where the real loop fell far "
        "behind, its hold-offs came when the model's had caught up, and change little), and "
        "given the run's hold-offs and its CPU (the same, with every cost scaled by one "
        "factor, shown, so that the replay's busy time is the real loop's thread CPU: the "
        "model's tail given the right mean cost at that rate); a **bold** "
        "prediction misses the target below the knee. The last but one column: the "
        "application's cost alone at that rate (us per operation and per condition callback, "
        "its trace played without the purgatory), shown, not given to the model (whose "
        f"profile has the figures measured at {STUB_RATE:,.0f}/s).",
        "",
        "| offered /s | measured | "
        + " | ".join(["full profile", *VARIANTS, RUN_HELD, RUN_CPU])
        + " | application us, per operation / condition | load average |",
        "|---:|---:|" + "---:|" * (4 + len(VARIANTS)) + "---:|",
    ]
    for row in rows:
        below = edge is not None and row["rate"] < edge
        measured = row["measured"]["late_p99"]
        cells = []
        names = [*VARIANTS, RUN_HELD, RUN_CPU]
        for value in (row["predicted"]["late_p99"], *(row["variants"][n] for n in names)):
            text = f"{value * 1000:.2f}"
            cells.append(f"**{text}**" if below and not within(value, measured, 0.002) else text)
        cells[-1] += f" (x{row['factor']:.2f})"
        tail.append(
            f"| {row['rate']:,.0f}{'' if below else ' (past)'} | {measured * 1000:.2f} | "
            + " | ".join(cells)
            + f" | {row['application'] * 1e6:.1f} / {row['application_condition'] * 1e6:.1f} "
            f"| {row['load']} |"
        )
    return [
        *lines,
        "",
        f"Scored rows (below the knee and {SCORED_BUSY:.0%} busy): {len(misses)} cell(s) "
        "outside the target"
        + (": " + ", ".join(f"{h} at {r:,.0f}/s" for r, h in misses) if misses else "")
        + ".",
        *tail,
        "",
        f"![predicted against measured, {workload.name}]({section['chart'].name})",
        "",
    ]


def _speed(profile: CostProfile) -> str:
    """The profile's speed over time, in words."""
    if not profile.speed:
        return "none measured"
    n = len(profile.speed)
    return (
        f"{n} windows of {profile.speed_window * 1e3:g} ms, {profile.spells():.0%} of them "
        f"slowed by 20 % or more, the slowest x{max(profile.speed) / profile.speed_mean:.2f}"
    )


def _latency(profile: CostProfile) -> str:
    """The profile's wake-up latency, p50 and p99, in words."""
    if not profile.wake_latency:
        return "none measured"
    p50, p99 = (profile.latency(p) * 1e6 for p in (0.5, 0.99))
    return f"p50 {p50:.0f} us, p99 {p99:.0f} us"


def _verdict(pair: dict[str, float | None]) -> str:
    predicted, measured = pair["predicted"], pair["measured"]
    if predicted is None or measured is None:
        return "not both within the rates measured"
    gap = _gap(predicted, measured)
    return f"{gap}, within 15 %" if abs(predicted - measured) <= 0.15 * measured else f"**{gap}**"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _gap(predicted: float | None, measured: float | None) -> str:
    if predicted is None or measured is None:
        return "not estimated"
    return f"{100 * (predicted - measured) / measured:+.1f} %"


def chart(rows: list[dict[str, Any]], knee: dict[str, float | None], path: Path) -> None:
    """Predicted (dashed) against measured (solid) per rate; each side's knee a dotted line of
    its colour inside the measured rates, else a note under the chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5), sharex=True)
    rates = [row["rate"] for row in rows]
    sides: tuple[tuple[str, Literal["-", "--"], str], ...] = (
        ("measured", "-", "C0"),
        ("predicted", "--", "C1"),
    )
    notes: list[str] = []
    for ax, (key, header, scale, _) in zip(axes.ravel(), METRICS[:1] + METRICS[2:], strict=True):
        for side, style, color in sides:
            values = [row[side][key] * scale for row in rows]
            ax.plot(rates, values, linestyle=style, color=color, marker="o", markersize=4)
            note = saturation_mark(ax, knee[side], rates, color, f"knee ({side})")
            if note and note not in notes:
                notes.append(note)
        ax.set_ylabel(header)
        ax.grid(alpha=0.3)
    axes[0][0].legend(
        handles=[
            *(Line2D([], [], linestyle=s, color=c, label=side) for side, s, c in sides),
            Line2D([], [], linestyle=":", color="gray", label="knee: the loop fully busy"),
        ],
        fontsize=8,
    )
    for ax in axes[1]:
        ax.set_xlabel("offered rate (arrivals/s)")
    fig.suptitle("Load model: predicted (replay with a calibrated profile) vs measured (real loop)")
    if notes:
        fig.text(0.01, 0.005, "\n".join(notes), fontsize=8, va="bottom")
    fig.tight_layout(rect=(0, 0.03 * len(notes), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def validate(workload: Workload, profile: CostProfile, args: argparse.Namespace) -> dict[str, Any]:
    """`workload` measured and predicted at each rate: its rows and its saturation."""
    print(f"{workload.name}:", flush=True)
    # The rate the profile saturates at, from a replay at a low rate: rate / utilisation, with
    # every event priced as on a busy loop (a low rate wakes the loop for nearly every event),
    # at its mean cost (at one speed) and never stalled.
    busy_loop = replace(
        profile,
        wake=0.0,
        iteration=0.0,
        wake_latency=(),
        cost_shape=(),
        stall=(),
        speed=(),
        speed_window=0.0,
    )
    guess = 1000.0 / predict(workload.trace(1000.0, 2000), busy_loop)["utilisation"]
    print(f"predicted saturation from a probe: {guess:,.0f}/s", flush=True)
    rows = []
    for share in SHARES[::2] if args.quick else SHARES:
        rate = share * guess
        trace = workload.trace(rate, max(200, int(rate * args.seconds)))
        load = load_average()
        # The application's cost alone at this rate (the same trace without the purgatory):
        # shown beside the model's one figure, measured past saturation.
        application = application_overhead(trace, args.app_iterations, profile, rounds=1)
        # `RUNS` runs of the trace, and as many replays drawing afresh: the median of each.
        runs = [measure(trace, args.app_iterations) for _ in range(args.runs)]
        measured = runs[median_index(runs)]
        draws = [predict(drawn_again(trace, k), profile) for k in range(args.runs)]
        drawn = median_index(draws)
        predicted, trace = draws[drawn], drawn_again(trace, drawn)
        # What the distributions change (on the median replay's draw): the same replay without
        # the stalls, and with neither (constant costs, as a profile of version 3 replays).
        variants = {
            name: predict(trace, replace(profile, **changes))["late_p99"]
            for name, changes in VARIANTS.items()
        }
        held = tuple((start, h) for start, h in measured["holdoffs"] if h >= HELD)
        run_held = replace(profile, stall=(), holdoffs=held)
        first = predict(trace, run_held)
        variants[RUN_HELD] = first["late_p99"]
        # And besides, every cost scaled so that the replay's CPU is the run's: the model's
        # tail given the right mean cost at this rate (and when the loop was held off).
        factor, matched = given_cpu(trace, run_held, measured["cpu"], first)
        variants[RUN_CPU] = matched["late_p99"]
        rows.append(
            {
                "rate": rate,
                "measured": measured,
                "predicted": predicted,
                "late_runs": {
                    "measured": sorted(run["late_p99"] for run in runs),
                    "predicted": sorted(draw["late_p99"] for draw in draws),
                },
                "variants": variants,
                "factor": factor,
                "application": application.operation,
                "application_condition": application.condition,
                "load": load,
            }
        )
        print(
            f"{rate:9,.0f}/s application alone {application.operation * 1e6:.2f} us an "
            f"operation and {application.condition * 1e6:.2f} a condition (the model's "
            f"{profile.application * 1e6:.2f} and {profile.application_condition * 1e6:.2f}); "
            "given the run's "
            f"CPU and hold-offs: costs x{factor:.3f}, late p99 {matched['late_p99'] * 1e3:.2f} ms"
        )
        print(
            f"{rate:9,.0f}/s load {load} waited {100 * measured['waited']:.1f} % "
            f"(otherwise off {100 * measured['unaccounted']:.1f} %, longest hold-off "
            f"{measured['held_longest'] * 1e3:.1f} ms), "
            f"{measured['collections']} collections; late p99 of each run (ms): predicted "
            + ", ".join(f"{draw['late_p99'] * 1e3:.2f}" for draw in draws)
            + ", measured "
            + ", ".join(f"{run['late_p99'] * 1e3:.2f}" for run in runs)
            + "; the median's, with the run's hold-offs: late p99 "
            f"{variants[RUN_HELD] * 1e3:.2f} ms  "
            + "  ".join(
                f"{header} {predicted[key] * scale:.2f}/{measured[key] * scale:.2f}"
                for key, header, scale, _ in METRICS
            ),
            flush=True,
        )
    # The rate a fully busy core sustains: operations per CPU second in the most overloaded
    # run, where the loop never idles (CPU time: another process's use of the core is left out).
    top = rows[-1]
    saturation: dict[str, float | None] = {
        side: top[side]["operations"] / top[side]["cpu"] for side in ("measured", "predicted")
    }
    knee = {side: knee_rate(rows, side) for side in ("measured", "predicted")}
    for side in ("measured", "predicted"):
        estimate = saturation_rate([(row["rate"], row[side]["utilisation"]) for row in rows])
        print(f"{side}: rate / utilisation below 90 %: {_num(estimate)}/s")
    sat_p, sat_m = saturation["predicted"], saturation["measured"]
    print(f"saturation: predicted {_num(sat_p)}/s, measured {_num(sat_m)}/s ({_gap(sat_p, sat_m)})")
    print(
        f"knee: predicted {_num(knee['predicted'])}/s, measured {_num(knee['measured'])}/s "
        f"({_gap(knee['predicted'], knee['measured'])})"
    )
    return {
        "workload": workload,
        "rows": rows,
        "saturation": {"overload": saturation, "knee": knee},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load_validation")
    parser.add_argument("--seconds", type=float, default=2.0, help="arrivals per rate (seconds)")
    parser.add_argument("--app-iterations", type=int, default=400, help="busy-loop steps")
    parser.add_argument("--quick", action="store_true", help="quick calibration, fewer rates")
    parser.add_argument(
        "--runs", type=int, default=RUNS, help="runs of each rate on each side (the median's)"
    )
    parser.add_argument("--write", action="store_true", help="write the table and the charts")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    started = time.perf_counter()
    load_at_start = load_average()
    print("calibrating ...", flush=True)
    profile = calibrate("asyncio", quick=args.quick)
    busy = application_cost(args.app_iterations)
    stub = WORKLOADS[0].trace(STUB_RATE, int(60_000 * 0.6 * args.seconds))
    app = application_overhead(stub, args.app_iterations, profile)
    print(
        f"application: {app.operation * 1e6:.2f} us per operation, of which the busy loop "
        f"{busy * 1e6:.2f}, and {app.condition * 1e6:.2f} per condition callback"
    )
    profile = replace(profile, application=app.operation, application_condition=app.condition)
    print(profile.describe(), flush=True)
    sections = []
    for i, workload in enumerate(WORKLOADS):
        section = validate(workload, profile, args)
        section["chart"] = CHART if not i else CHART.with_name(f"load_validation_{i + 1}.png")
        sections.append(section)
    env = describe_environment()
    environment = (
        f"{env['cpu_model']}, {env['cpu_count']} cores, {env['implementation']} {env['python']}, "
        f"{env['date']}, git {env['git']}, niceness {os.nice(0)}; load average "
        f"{load_at_start} at the start, {load_average()} at the end"
    )
    took = time.perf_counter() - started
    text = render(
        sections,
        profile,
        {"environment": environment, "took": took, "seconds": args.seconds, "runs": args.runs},
    )
    if args.write:
        TABLE.write_text(text)
        for section in sections:
            chart(section["rows"], section["saturation"]["knee"], section["chart"])
        print(f"written: {TABLE}, " + ", ".join(str(s["chart"]) for s in sections))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
