"""Instructions per operation on the core's hot paths, under ``valgrind --tool=callgrind``.

``python -m benchmarks.instructions [--paths ...] [--against DIR --label NAME] [--write]``
runs each path below in a child Python under callgrind twice, with ``--short`` and ``--long``
operations after the same set-up, and prints the difference divided by the difference in
operations: start-up, imports and set-up cancel, and what is left is the path's own cost. The
count does not depend on the machine's load (the same binary, inputs and ``PYTHONHASHSEED=0``
give the same total), which is why hot-path changes are decided and guarded with it, and
wall-clock figures are kept for the user-facing tables.

Every path runs on a `purgatory.testing.ManualClock` purgatory that already delays 10,000
operations (each on a key of its own, an hour away), through the public API only, so the same
script measures any version of the core (``--against`` a checkout's directory).

The Floor is the user's own work per operation, which no design can go below: create the
operation (a plain slotted class with the same fields), call its ``try_complete`` twice (the
watch's two tries) and its ``on_complete``, and keep it in a dict for its key meanwhile (the
benchmarks' Floor everywhere: "create the operation object and insert it into one dict per
key"), in the same loop as ``watch_force`` (the same key per operation, the same test every 100
operations). Targets are ratios to it.

Paths:
    floor: the Floor.
    plain_create: create the plain slotted class (``timeout`` and the user's two fields).
    subclass_create: create a `DelayedOperation` subclass with the same two fields.
    watch_force: create with a 30 s timeout (a request timeout: the wheel's second level),
        ``try_complete_else_watch`` on a key of its own, ``force_complete``; a timer pass every
        100 operations (the purges are paid here).
    watch_expire: create, watch on a key of its own with a 50 ms timeout; a timer pass every
        100 operations expires them (``on_complete`` and ``on_expiration`` run).
    threshold: 100 keys, each with 100 watchers at increasing offsets; per operation, one
        watch at the key's next offset (30 s timeout, as ``watch_force``) and one
        ``check_and_complete(key, reached)`` that completes the key's oldest watcher.
    threshold_shuffled: the same with the offsets of each key watched out of order.
    hot_key_retry: a watcher re-tried on a hot key: one key with 100 watchers (30 s timeouts,
        never ready), ``check_and_complete(key)`` once per 100 operations, so that each
        operation is one watcher re-tried (the user's ``try_complete`` called, false) and a
        hundredth of the trigger's own work: the W1-key path with 100 keys.
    user_try_complete: what the user's own code costs for the same: a Python loop calling
        ``op.try_complete()`` on 100 operations of the same class (unwatched), once per 100
        operations. ``hot_key_retry`` against it is what the purgatory adds per re-try.
    w1_threshold: a deterministic replica of W1-threshold 20/60 with 100 keys (the README's
        acks=all story) in virtual time: W1's pools (Poisson arrivals at 40,000/s, log-normal
        completion latency, 3 of 100 keys per request, 200 ms timeout), each request watched on
        its 3 keys at its completion time and completed by ``check_and_complete(first key,
        completion time)``, the clock moved by ``ManualClock.advance_to`` to each arrival and
        completion. Per request, after 20,000 requests of warm-up (the steady state: about
        2,000 pending). The driver's own work is in the figure, the same for every version.
    w1_threshold_lean: the same, each request watched with ``threshold=`` (one threshold for
        its 3 keys) rather than a mapping of key to threshold.
    floor_driver, watch_force_driver, watch_expire_driver: the issue's shape, driven as a user
        drives a purgatory with a clock of their own (``docs/testing.md``, "Writing a driver"):
        a plain class whose ``current_time`` returns its ``now`` and whose ``attach`` keeps the
        timer (no `Alarm`), moved 1 ms per 20 operations by the user's loop, which then runs
        the timer's pass if ``next_pass_at`` says one is due (not `ManualClock`, whose read the
        core once special-cased). 1,000 keys, operation ``i`` on key ``i % 1000``, on a
        purgatory that already delays 10,000 operations an hour away. ``floor_driver`` is the
        Floor in that loop (the operation created, ``try_complete`` twice, ``on_complete``,
        kept in a dict per key meanwhile, the clock moved); ``watch_force_driver`` watches
        with a 30 s timeout and ``force_complete``s; ``watch_expire_driver`` watches with a
        50 ms timeout and lets the passes expire them (about 1,000 pending).
    record_none, record_json, record_arrow: what recording costs (``benchmarks.eventlog``'s
        workload): rounds of 1,000 operations on a purgatory of their own, each watched on one of
        100 keys, half completed by ``force_complete``, half expired by a timer pass; with no
        event log, `JsonLinesEventLog` or `ArrowEventLog` (in a temporary directory, anchored to
        the manual clock, flushed at the end of the run so that every record is rendered and
        written). The recorder's cost is the difference from ``record_none``.
    record_histograms: the same workload with no event log and the exporters' histograms on
        (``purgatory._histograms``, default bounds: what ``histograms=HistogramBuckets()`` taps
        into each purgatory), counted from the event sink's batches (one per timer pass on a manual
        clock). Their cost is the difference from ``record_none`` (the goal: at most 0.3 us per
        operation, judged in wall time by ``python -m benchmarks.histograms``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ("PATHS", "main", "measure")

PENDING = 10_000
KEYS = 100
HOT_WATCHERS = 100
DRIVER_KEYS = 1_000
"""Keys of the ``*_driver`` paths (operation ``i`` on key ``i % DRIVER_KEYS``)."""
DRIVER_STEP = 20
"""Operations per 1 ms move of the ``*_driver`` paths' clock."""
"""Watchers on the hot key of ``hot_key_retry`` (and operations in ``user_try_complete``'s loop):
both run lengths must be multiples of it."""
PATHS = (
    "floor",
    "plain_create",
    "subclass_create",
    "watch_force",
    "watch_expire",
    "threshold",
    "threshold_shuffled",
    "hot_key_retry",
    "user_try_complete",
    "w1_threshold",
    "w1_threshold_lean",
    "floor_driver",
    "watch_force_driver",
    "watch_expire_driver",
    "record_none",
    "record_json",
    "record_arrow",
    "record_histograms",
)
RESULTS_JSON = Path(__file__).with_name("instructions.json")


# -- the paths (run in the child) ----------------------------------------------------------------


Run = Callable[[int], None]


class _Paths:
    """The set-up every path shares, and one method per path that returns its loop."""

    def __init__(self) -> None:
        from purgatory import DelayedOperation, DelayedOperationPurgatory
        from purgatory.testing import ManualClock

        class Plain:
            __slots__ = ("deadline", "ready", "timeout")

            def __init__(self, timeout: float, deadline: float) -> None:
                self.timeout = timeout
                self.deadline = deadline
                self.ready = False

            def try_complete(self) -> bool:
                return self.ready

            def on_complete(self) -> None:
                return None

        class Op(DelayedOperation[None]):
            __slots__ = ("deadline", "ready")

            def __init__(self, timeout: float, deadline: float) -> None:
                super().__init__(timeout)
                self.deadline = deadline
                self.ready = False

            def try_complete(self) -> bool:
                if self.ready:
                    return self.force_complete()
                return False

            def on_complete(self) -> None:
                return None

            def on_expiration(self) -> None:
                return None

        reached: dict[int, int] = {}

        class AtOffset(DelayedOperation[None]):
            __slots__ = ("key", "offset")

            def __init__(self, timeout: float, key: int, offset: int) -> None:
                super().__init__(timeout)
                self.key = key
                self.offset = offset

            def try_complete(self) -> bool:
                if reached[self.key] >= self.offset:
                    return self.force_complete()
                return False

            def on_complete(self) -> None:
                return None

            def on_expiration(self) -> None:
                return None

        self.Plain = Plain
        self.Op = Op
        self.AtOffset = AtOffset
        self.reached = reached
        self.clock = ManualClock()
        self.purgatory: Any = DelayedOperationPurgatory("bench", clock=self.clock)
        watch = self.purgatory.try_complete_else_watch
        for key in range(PENDING):
            watch(Op(3600.0, 0.0), (("pending", key),))

    def floor(self) -> Run:
        plain = self.Plain

        def run(n: int) -> None:
            watchers: dict[Any, dict[Any, None]] = {}
            for i in range(n):
                op = plain(30.0, 0.0)
                key = (i,)
                op.try_complete()
                watchers[key] = {op: None}
                op.try_complete()
                op.on_complete()
                del watchers[key]
                if i % 100 == 99:
                    pass

        return run

    def plain_create(self) -> Run:
        plain = self.Plain

        def run(n: int) -> None:
            for _ in range(n):
                plain(30.0, 0.0)

        return run

    def subclass_create(self) -> Run:
        new = self.Op

        def run(n: int) -> None:
            for _ in range(n):
                new(30.0, 0.0)

        return run

    def watch_force(self) -> Run:
        new = self.Op
        watch = self.purgatory.try_complete_else_watch
        advance = self.clock.advance

        def run(n: int) -> None:
            for i in range(n):
                op = new(30.0, 0.0)
                watch(op, (i,))
                op.force_complete()
                if i % 100 == 99:
                    advance(0.0)

        return run

    def watch_expire(self) -> Run:
        new = self.Op
        watch = self.purgatory.try_complete_else_watch
        advance = self.clock.advance

        def run(n: int) -> None:
            for i in range(n):
                watch(new(0.05, 0.0), (i,))
                if i % 100 == 99:
                    advance(0.1)

        return run

    def threshold(self, shuffled: bool = False) -> Run:
        new = self.AtOffset
        reached = self.reached
        watch = self.purgatory.try_complete_else_watch
        check = self.purgatory.check_and_complete
        rng = random.Random(1)
        order = list(range(100))
        next_offset = dict.fromkeys(range(KEYS), 100)
        for key in range(KEYS):
            reached[key] = -1
            if shuffled:
                rng.shuffle(order)
            for offset in order:
                watch(new(30.0, key, offset), {key: offset})

        def run(n: int) -> None:
            for i in range(n):
                key = i % KEYS
                offset = next_offset[key]
                if shuffled:
                    offset += i * 37 % 50  # out of order, always ahead of what is reached
                watch(new(30.0, key, offset), {key: offset})
                next_offset[key] += 1
                reached[key] += 1
                check(key, reached[key])

        return run

    def threshold_shuffled(self) -> Run:
        return self.threshold(shuffled=True)

    def hot_key_retry(self) -> Run:
        new = self.Op
        check = self.purgatory.check_and_complete
        watch = self.purgatory.try_complete_else_watch
        for _ in range(HOT_WATCHERS):
            watch(new(30.0, 0.0), ("hot",))

        def run(n: int) -> None:
            for _ in range(n // HOT_WATCHERS):
                check("hot")

        return run

    def user_try_complete(self) -> Run:
        ops = [self.Op(30.0, 0.0) for _ in range(HOT_WATCHERS)]

        def run(n: int) -> None:
            for _ in range(n // HOT_WATCHERS):
                for op in ops:
                    op.try_complete()

        return run

    def _driver_purgatory(self) -> tuple[Any, Any]:
        """A user's own driver (`SteppingDriver`) and a purgatory on it, delaying `PENDING`
        operations an hour away as the `ManualClock` one does."""
        from purgatory import DelayedOperationPurgatory

        driver = SteppingDriver()
        purgatory: Any = DelayedOperationPurgatory("driver", clock=driver)
        watch = purgatory.try_complete_else_watch
        for key in range(PENDING):
            watch(self.Op(3600.0, 0.0), (("pending", key),))
        self.driven, self.driver = purgatory, driver
        return driver, purgatory

    def floor_driver(self) -> Run:
        plain = self.Plain
        driver = SteppingDriver()
        keys = [(key,) for key in range(DRIVER_KEYS)]
        watchers: dict[Any, dict[Any, None]] = {key: {} for key in keys}

        def run(n: int) -> None:
            for i in range(n):
                op = plain(30.0, 0.0)
                listed = watchers[keys[i % DRIVER_KEYS]]
                op.try_complete()
                listed[op] = None
                op.try_complete()
                op.on_complete()
                del listed[op]
                if i % DRIVER_STEP == DRIVER_STEP - 1:
                    driver.now += 0.001

        return run

    def watch_force_driver(self) -> Run:
        new = self.Op
        driver, purgatory = self._driver_purgatory()
        watch = purgatory.try_complete_else_watch
        keys = [(key,) for key in range(DRIVER_KEYS)]

        def run(n: int) -> None:
            for i in range(n):
                op = new(30.0, 0.0)
                watch(op, keys[i % DRIVER_KEYS])
                op.force_complete()
                if i % DRIVER_STEP == DRIVER_STEP - 1:
                    driver.step(0.001)

        return run

    def watch_expire_driver(self) -> Run:
        new = self.Op
        driver, purgatory = self._driver_purgatory()
        watch = purgatory.try_complete_else_watch
        keys = [(key,) for key in range(DRIVER_KEYS)]

        def run(n: int) -> None:
            for i in range(n):
                watch(new(0.05, 0.0), keys[i % DRIVER_KEYS])
                if i % DRIVER_STEP == DRIVER_STEP - 1:
                    driver.step(0.001)

        return run

    def record_none(self) -> Run:
        return self._record(None)

    def record_json(self) -> Run:
        return self._record("json")

    def record_arrow(self) -> Run:
        return self._record("arrow")

    def record_histograms(self) -> Run:
        return self._record("histograms")

    def _record(self, kind: str | None) -> Run:
        import tempfile

        from purgatory import ArrowEventLog, DelayedOperationPurgatory, JsonLinesEventLog
        from purgatory.testing import ManualClock

        clock = ManualClock()
        directory = tempfile.mkdtemp()
        log: Any = None
        if kind in ("json", "arrow"):
            recorder = JsonLinesEventLog if kind == "json" else ArrowEventLog
            log = recorder(directory, clock=clock.now)
        purgatory = DelayedOperationPurgatory[Any]("record", clock=clock, event_log=log)
        if kind == "histograms":
            from purgatory._histograms import ByName, HistogramBuckets

            ByName(HistogramBuckets()).tap(purgatory)
        keys = [(f"k{i}",) for i in range(100)]
        new = self.Op
        watch = purgatory.try_complete_else_watch

        def run(n: int) -> None:
            for _ in range(n // 1000):
                ops = [new(0.5, 0.0) for _ in range(1000)]
                for i, op in enumerate(ops):
                    watch(op, keys[i % 100])
                for op in ops[::2]:
                    op.force_complete()
                clock.advance(1.0)
            if log is not None:
                log.flush()

        run(2000)  # warm: imports, the first file, caches
        return run

    def w1_threshold(self) -> Run:
        replica = _W1Replica(lean=False)
        replica.run(20_000)
        return replica.run

    def w1_threshold_lean(self) -> Run:
        replica = _W1Replica(lean=True)
        replica.run(20_000)
        return replica.run


class SteppingDriver:
    """A user's own clock and driver, as ``docs/testing.md`` writes one: time moves only in
    `step`, which then runs the passes of the timers it drives that have work due."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Any] = []

    def current_time(self) -> float:
        return self.now

    def attach(self, timer: Any) -> None:
        self.timers.append(timer)  # no Alarm: it asks before each step

    def step(self, seconds: float) -> int:
        self.now += seconds
        now = self.now
        expired = 0
        for timer in self.timers:
            if timer.next_pass_at() <= now:
                expired += timer.run_pass(now)
        return expired


W1_POOL_SIZE = 1 << 16
W1_TIMEOUT = 0.2


def w1_pools(seed: int) -> dict[str, list[Any]]:
    """W1-threshold 20/60's pools with 100 keys, as `benchmarks.w1.make_pools` draws them (a test
    holds the two equal): made here so that the child imports nothing but the core it measures,
    whichever version ``--against`` points at."""
    rng = random.Random(f"w1/{seed}/20/60/100")
    mu = math.log(0.020)
    sigma = (math.log(0.060) - mu) / 0.67449
    names = [f"key-{i}" for i in range(100)]
    latencies = [rng.lognormvariate(mu, sigma) for _ in range(W1_POOL_SIZE)]
    return {
        "gaps": [rng.expovariate(1.0) for _ in range(W1_POOL_SIZE)],
        "latencies": latencies,
        "keys": [tuple(rng.sample(names, 3)) for _ in range(W1_POOL_SIZE)],
    }


class _W1Replica:
    """W1-threshold 20/60, 100 keys, at 40,000 requests per virtual second (see the docstring):
    `run` goes on from where the last call stopped, so the warm-up is shared by both lengths."""

    def __init__(self, lean: bool) -> None:
        from purgatory import DelayedOperation, DelayedOperationPurgatory
        from purgatory.testing import ManualClock

        class Request(DelayedOperation[None]):
            __slots__ = ("ready",)

            def __init__(self, timeout: float) -> None:
                super().__init__(timeout)
                self.ready = False

            def try_complete(self) -> bool:
                if self.ready:
                    return self.force_complete()
                return False

            def on_complete(self) -> None:
                return None

            def on_expiration(self) -> None:
                return None

        self.Request = Request
        self.pools = w1_pools(seed=1)
        self.mask = W1_POOL_SIZE - 1
        self.timeout = W1_TIMEOUT
        self.rate = 40_000.0
        self.clock = ManualClock()
        self.purgatory: Any = DelayedOperationPurgatory("w1", clock=self.clock)
        self.completions: list[tuple[float, int, Any, Any]] = []
        self.at = 0.0
        self.issued = 0
        self.lean = lean

    def run(self, n: int) -> None:
        import heapq

        pools, mask, rate, timeout = self.pools, self.mask, self.rate, self.timeout
        gaps, latencies, keypool = pools["gaps"], pools["latencies"], pools["keys"]
        new = self.Request
        watch = self.purgatory.try_complete_else_watch
        check = self.purgatory.check_and_complete
        advance_to = self.clock.advance_to
        completions = self.completions
        lean = self.lean
        at = self.at
        for i in range(self.issued, self.issued + n):
            at += gaps[i & mask] / rate
            while completions and completions[0][0] <= at:
                due, _, op, first_key = heapq.heappop(completions)
                advance_to(due)
                op.ready = True
                check(first_key, due)
            advance_to(at)
            keys = keypool[(i * 13 + 2) & mask]
            latency = latencies[(i * 7 + 1) & mask]
            op = new(timeout)
            if lean:
                watch(op, keys, threshold=at + latency)
            else:
                watch(op, dict.fromkeys(keys, at + latency))
            if latency < timeout:
                heapq.heappush(completions, (at + latency, i, op, keys[0]))
        self.at = at
        self.issued += n


def _build(path: str) -> Run:
    """Set `path` up (the part both run lengths share) and return its loop over `n` operations."""
    if path not in PATHS:
        raise SystemExit(f"unknown path {path!r}; choose from {', '.join(PATHS)}")
    run: Run = getattr(_Paths(), path)()
    return run


def _child(path: str, n: int) -> None:
    run = _build(path)
    # The set-up's objects out of the collector's way: a full collection that traverses the
    # 10,000 pending operations in one run length and not in the other would be counted as
    # the path's cost (the young generations still collect what the path allocates).
    gc.collect()
    gc.freeze()
    run(n)


# -- the parent ------------------------------------------------------------------------------


def _instructions(path: str, n: int, pythonpath: str | None) -> int:
    """Total instructions of one child run under callgrind."""
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONHASHSEED="0")
    env["PYTHONPATH"] = root if pythonpath is None else pythonpath
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--child",
                path,
                str(n),
            ],
            env=env,
            check=True,
            capture_output=True,
            cwd=tmp,
        )
        match = re.search(r"^(?:summary|totals):\s*(\d+)", out.read_text(), re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no instruction total in callgrind's output for {path}")
        return int(match.group(1))


def measure(path: str, short: int, long: int, pythonpath: str | None = None) -> int:
    """Instructions per operation of `path`: the two run lengths subtracted."""
    return round(
        (_instructions(path, long, pythonpath) - _instructions(path, short, pythonpath))
        / (long - short)
    )


#: The current goals: (what, path, against: a path of the same column, at most this ratio,
#: the moonshot (or ``None``), why).
TARGETS: tuple[tuple[str, str, str, float, float | None, str], ...] = (
    ("watch + force_complete", "watch_force", "floor", 2.0, 1.5, "near the user's own work"),
    (
        "watch + expire in a timer pass",
        "watch_expire",
        "floor",
        2.0,
        1.5,
        "near the user's own work",
    ),
    (
        "watch + force_complete, a user's driver",
        "watch_force_driver",
        "floor_driver",
        1.6,
        1.3,
        "1,000 keys, a clock of the user's own moved 1 ms per 20 operations",
    ),
    (
        "watch + expire, a user's driver",
        "watch_expire_driver",
        "floor_driver",
        1.6,
        1.3,
        "1,000 keys, a clock of the user's own moved 1 ms per 20 operations",
    ),
    (
        "threshold watch + trigger",
        "threshold",
        "watch_force",
        1.3,
        None,
        "a trigger at a threshold costs little more than force_complete",
    ),
    (
        "a watcher re-tried on a hot key",
        "hot_key_retry",
        "user_try_complete",
        1.2,
        None,
        "a re-try costs little more than the user's own try_complete call",
    ),
    (
        "a subclass created",
        "subclass_create",
        "plain_create",
        1.6,
        None,
        "its __init__ calling super().__init__(timeout), against a plain slotted class",
    ),
)
TODAY, PURE = "today", "pure"
"""Columns the "no worse than today" goal compares, when both are written: the core before the
native one (``--against`` a checkout of it, ``--label today``), and the pure-Python build of the
new one (``PURGATORY_NO_EXTENSIONS=1``, ``--label pure``)."""
NO_WORSE = (
    "floor",
    "subclass_create",
    "watch_force",
    "watch_expire",
    "threshold",
    "hot_key_retry",
    "w1_threshold_lean",
)
RESULTS_MD = Path(__file__).with_name("INSTRUCTIONS.md")


def goals(results: dict[str, dict[str, int]], column: str) -> list[list[str]]:
    """The goals table's rows judged on `column`: every `TARGETS` ratio it holds both paths of,
    then (when the `TODAY` and `PURE` columns exist) the pure build against today's core."""
    found = results.get(column, {})
    rows = []
    for what, path, against, limit, moonshot, why in TARGETS:
        if path not in found or not found.get(against):
            continue
        ratio = found[path] / found[against]
        verdict = "met" if ratio <= limit else "**not met**"
        wanted = f"<= {limit}x `{against}`"
        if moonshot is not None:
            wanted += f" (moonshot {moonshot}x)"
            if ratio <= moonshot:
                verdict += ", moonshot too"
        rows.append([f"{what} ({why})", wanted, f"{ratio:.2f}x", verdict])
    today, pure = results.get(TODAY, {}), results.get(PURE, {})
    for path in NO_WORSE:
        if today.get(path) and path in pure:
            ratio = pure[path] / today[path]
            rows.append(
                [
                    f"`{path}`, the pure-Python build no worse than today",
                    f"<= 1.0x `{path}` of `{TODAY}` (column `{PURE}`)",
                    f"{ratio:.2f}x",
                    "met" if ratio <= 1.0 else "**not met**",
                ]
            )
    return rows


def section(results: dict[str, dict[str, int]]) -> str:
    """`INSTRUCTIONS.md`: every column's figures, then the current goals against the last."""
    labels = list(results)
    last_label = labels[-1]
    last = results[last_label]
    first = results[labels[0]]
    lines = [
        "# Instructions per operation (callgrind)",
        "",
        "Written by `python -m benchmarks.instructions --write`; do not edit by hand. Each path of "
        "the core under `valgrind --tool=callgrind`, two run lengths subtracted so that start-up "
        "cancels, `PYTHONHASHSEED=0`; see the module's docstring for each path. These figures do "
        "not move with the machine's load (the recording paths write files with random names: "
        "up to 3 % between runs). Columns: " + ", ".join(f"`{label}`" for label in labels) + ".",
        "",
        "| path | " + " | ".join(labels) + " | change | vs the Floor |",
        "|---|" + "---:|" * len(labels) + "---:|---:|",
    ]
    for path in PATHS:
        cells = [f"{results[label][path]:,}" if path in results[label] else "-" for label in labels]
        change = ""
        if path in first and path in last and len(labels) > 1:
            change = f"{(last[path] - first[path]) / first[path]:+.1%}"
        floor = f"{last[path] / last['floor']:.2f}x" if path in last and "floor" in last else ""
        lines.append(f"| {path} | " + " | ".join(cells) + f" | {change} | {floor} |")
    lines += [
        "",
        f"## Goals against `{last_label}`",
        "",
        "| goal | wanted | measured | verdict |",
        "|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in goals(results, last_label)]
    recording = [
        p
        for p in ("record_json", "record_arrow", "record_histograms")
        if p in last and "record_none" in last
    ]
    if recording:
        lines += [
            "",
            "Recording, beyond `record_none` (the goal, <= 1 us per operation, is judged in wall "
            "time by the `eventlog` workload): "
            + ", ".join(f"`{p}` +{last[p] - last['record_none']:,}" for p in recording)
            + " instructions per operation.",
        ]
    return "\n".join(lines) + "\n"


def load() -> dict[str, dict[str, int]] | None:
    """The committed figures, if any."""
    if not RESULTS_JSON.exists():
        return None
    results: dict[str, dict[str, int]] = json.loads(RESULTS_JSON.read_text())
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.instructions",
        description="Instructions per operation on the core's hot paths (callgrind).",
    )
    parser.add_argument("--child", nargs=2, metavar=("PATH", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--short", type=int, default=2_000, help="operations of the short run")
    parser.add_argument("--long", type=int, default=6_000, help="operations of the long run")
    parser.add_argument(
        "--against", metavar="DIR", help="measure the purgatory package found in DIR instead"
    )
    parser.add_argument("--label", default="now", help="the column these figures go to")
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"keep the figures in {RESULTS_JSON.name} (the column --label) and the table in "
        f"{RESULTS_MD.name}",
    )
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return 0
    if not args.short < args.long:
        parser.error("--short must be smaller than --long")
    hot = {"hot_key_retry", "user_try_complete"} & set(args.paths)
    if hot and (args.short % HOT_WATCHERS or args.long % HOT_WATCHERS):
        parser.error(
            f"{', '.join(sorted(hot))}: --short and --long must be multiples of {HOT_WATCHERS}"
        )
    figures: dict[str, int] = {}
    for path in args.paths:
        figures[path] = measure(path, args.short, args.long, args.against)
        print(f"{path:20} {figures[path]:>8,} instructions per operation", flush=True)
    if args.write:
        results: dict[str, dict[str, int]] = (
            json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
        )
        results.setdefault(args.label, {}).update(figures)
        RESULTS_JSON.write_text(json.dumps(results, indent=2) + "\n")
        RESULTS_MD.write_text(section(results))
        print(section(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
