"""The replay engine: a trace, streamed in arrival order, through a real purgatory in virtual time.

Pure Python plus pyarrow, no Spark: the Spark job runs it inside ``mapInArrow`` on each
partition, and `replay_table` runs it in one process (the reference the tests compare against).

Theory of operation. The input is a stream of Arrow record batches whose rows are sorted by
(group, arrival, op_id), a *group* being one (purgatory, configuration) pair. For each group a
`DelayedOperationPurgatory` is built on a `purgatory.testing.ManualClock`. Before each arrival
the driver moves the clock forward through every event due until then, in time order: timer
passes at each tick where the purgatory has work (``ManualClock.advance_to``, so a pass runs
where a reaper would wake), and the condition of earlier operations becoming true
(the op is marked ready and its first key is triggered with ``check_and_complete``, or it is
completed with ``force_complete`` in ``trigger="force"`` mode). At one instant, timer passes run
first, then triggers, then the arrival. Then the operation is watched with
``try_complete_else_watch``; if its condition holds at arrival it completes inside the call.
When a group's rows end, the clock runs on until nothing is timed.

With a cost profile (`purgatory.pipeline._load`), a group is served as one core serves an event
loop (`_LoadedGroup`), in the loop's turns: each turn collects the events due when it starts and
serves them in the order of their times, each when the core is free, with the clock moved
there, keeping the core busy for what it costs; the reaper's pass comes at the start of the turn
after its timer's. A timer pass then runs late, expiring whatever is due by the time it runs, as
a late reaper does. With every cost zero this is exactly the plain replay. A profile's cost
distributions (`purgatory.pipeline._load`) make each event cost its kind's mean times a drawn
factor and hold the core for a drawn stall; each draw is a hash of the group and the event
(its operation and kind, or a pass's tick), and a stall needs the loop to have run for the
profile's credit since it last woke, a state that an idle moment resets: so a group's replay
is the same in any task, and from any moment its core was idle.

Each group's summary (counts, exact percentiles of the waits and of the expiry lateness) is
computed here, inside the group's task, so the Spark job needs no aggregation over every
operation, and emitting each operation's row is optional.

What the engine holds is what the purgatory holds (the pending operations), one heap entry per
pending operation whose condition comes before its deadline, the current input batch, at most
``OUTPUT_ROWS`` finished rows, and 8 bytes per finished operation of the group (its wait, and
its lateness if it expired) for the exact percentiles. A whole group's trace is never in memory.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from heapq import heappop, heappush
from itertools import pairwise
from operator import itemgetter
from typing import Any, Final, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import DelayedOperation, DelayedOperationPurgatory, JsonLinesEventLog
from ..testing import ManualClock, check_invariants
from ._load import CostProfile, LoadClock

__all__ = (
    "OUTPUT_ROWS",
    "OUTPUT_SCHEMA",
    "ReplayConfig",
    "replay_batches",
    "replay_table",
)

#: Finished rows gathered before a batch is emitted.
OUTPUT_ROWS: Final = 8192

#: What the replay emits: one row per operation (``op_id`` set; optional), then one row per
#: group (``op_id`` null) with the group's summary and gauges. The Spark job splits the two.
OUTPUT_SCHEMA: Final = pa.schema(
    [
        pa.field("purgatory", pa.string(), nullable=False),
        pa.field("config_id", pa.int32(), nullable=False),
        pa.field("op_id", pa.int64()),
        pa.field("outcome", pa.string()),
        pa.field("watched_at", pa.float64()),
        pa.field("deadline", pa.float64()),
        pa.field("ended_at", pa.float64()),
        pa.field("operations", pa.int64()),
        pa.field("completed", pa.int64()),
        pa.field("expired", pa.int64()),
        pa.field("missed", pa.int64()),
        pa.field("wait_p50", pa.float64()),
        pa.field("wait_p99", pa.float64()),
        pa.field("wait_max", pa.float64()),
        pa.field("lateness_p50", pa.float64()),
        pa.field("lateness_p99", pa.float64()),
        pa.field("lateness_max", pa.float64()),
        pa.field("peak_watched", pa.int64()),
        pa.field("peak_delayed", pa.int64()),
        pa.field("timer_passes", pa.int64()),
        pa.field("purges", pa.int64()),
        pa.field("purged_entries", pa.int64()),
        pa.field("attempts", pa.int64()),
        pa.field("busy", pa.float64()),
        pa.field("span", pa.float64()),
        pa.field("pass_late_p50", pa.float64()),
        pa.field("pass_late_p99", pa.float64()),
        pa.field("pass_late_max", pa.float64()),
    ]
)

Trigger = Literal["key", "force"]


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """One configuration of the purgatory and of the traffic, applied to a whole trace.

    Attributes:
        tick: The wheel tick in seconds.
        wheel_size: Slots per wheel level.
        purge_interval: Kafka's purge interval.
        timeout_scale: Every timeout is multiplied by this.
        rate_scale: Arrivals come this many times faster (arrival times divided by it); each
            operation's latency (condition time minus arrival) is kept.
        trigger: ``"key"``: the condition fires ``check_and_complete`` on the operation's first
            key (the broker's path, which re-tries every operation on that key); ``"force"``:
            ``force_complete`` on the operation (Kafka's benchmark path).
    """

    tick: float = 0.001
    wheel_size: int = 1024
    purge_interval: int = 1000
    timeout_scale: float = 1.0
    rate_scale: float = 1.0
    trigger: Trigger = "key"

    def __post_init__(self) -> None:
        for name in ("tick", "timeout_scale", "rate_scale"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.trigger not in ("key", "force"):
            raise ValueError(f"trigger must be 'key' or 'force', got {self.trigger!r}")

    def label(self) -> str:
        """A short label for tables and charts."""
        return (
            f"tick={self.tick:g} wheel={self.wheel_size} purge={self.purge_interval} "
            f"timeout x{self.timeout_scale:g} rate x{self.rate_scale:g}"
        )


class ReplayOperation(DelayedOperation[None]):
    """A trace row as a delayed operation: complete once the replay marks its condition met.

    It keeps its group's summary itself when it ends (`on_complete`): one Python call fewer per
    operation than a method of the group, on a path run ten million times.
    """

    __slots__ = ("arrived_at", "ended", "group", "keys", "op_id", "ready", "watched_at")

    def __init__(
        self,
        group: _Group,
        op_id: int,
        keys: tuple[str, ...],
        timeout: float,
        *,
        ready: bool,
        arrived: float,
        at: float,
    ) -> None:
        super().__init__(timeout)
        self.group = group
        self.op_id = op_id
        self.keys = keys
        self.ready = ready
        self.arrived_at = arrived
        self.watched_at = at
        self.ended = False

    def try_complete(self) -> bool:
        self.group.attempts += 1
        if self.ready:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.ended = True
        group = self.group
        now = group.now()
        watched_at = self.watched_at
        # (The same arithmetic as the job's on the rows: the summaries are equal.)
        group.waits.append(now - watched_at)
        deadline = watched_at + self.timeout
        if self.is_expired:
            group.lateness.append(now - deadline)
            group.missed += 1
            if group.keep:
                group.out.append((self.op_id, "expired", watched_at, deadline, now))
        else:
            if now > self.arrived_at + self.timeout:  # completed, but after the client's timeout
                group.missed += 1
            if group.keep:
                group.out.append((self.op_id, "completed", watched_at, deadline, now))


class _Group:
    """The live state of one (purgatory, configuration) replay, and its summary as it goes.

    The summary (counts, exact nearest-rank percentiles of the waits and of the expiry
    lateness, the same as the Spark job's ``percentile_disc`` over the operations' rows) is
    kept here, in the group's own task, so the job need not shuffle every operation's row to
    compute it: it costs 8 bytes per ended operation (its wait) and per expiry (its lateness).
    """

    __slots__ = (
        "attempts",
        "check",
        "clock",
        "config",
        "config_id",
        "event_log",
        "heap",
        "horizon",
        "keep",
        "lateness",
        "missed",
        "name",
        "now",
        "out",
        "peak_delayed",
        "peak_watched",
        "purgatory",
        "seq",
        "waits",
    )

    def __init__(
        self,
        name: str,
        config_id: int,
        config: ReplayConfig,
        event_log: JsonLinesEventLog | None,
        check: bool = False,
        *,
        keep: bool = True,
        clock: LoadClock | None = None,
    ) -> None:
        self.name = name
        self.check = check
        self.keep = keep
        self.config_id = config_id
        self.config = config
        self.clock = ManualClock()
        # The clock the purgatory reads: the manual clock, or a loaded replay's own.
        self.now = self.clock.now if clock is None else clock.now
        self.event_log = event_log
        self.purgatory: DelayedOperationPurgatory[ReplayOperation] = DelayedOperationPurgatory(
            f"{name}@{config_id}",
            tick=config.tick,
            wheel_size=config.wheel_size,
            purge_interval=config.purge_interval,
            clock=self.clock if clock is None else clock,
            event_log=event_log,
        )
        self.heap: list[tuple[float, int, ReplayOperation]] = []
        self.seq = 0
        self.attempts = 0
        # The latest deadline of any operation watched so far (seconds, before rounding).
        self.horizon = 0.0
        self.peak_watched = 0
        self.peak_delayed = 0
        self.out: list[tuple[int, str, float, float, float]] = []
        self.waits = array("d")
        self.lateness = array("d")
        # Operations not answered by their condition within their timeout of their arrival:
        # expired, or completed later than that (after queueing for a busy core).
        self.missed = 0

    def run_until(self, t: float) -> None:
        """Run every timer pass and condition due at or before `t`, in time order."""
        purgatory = self.purgatory
        heap = self.heap
        advance_to = self.clock.advance_to
        force = self.config.trigger == "force"
        while heap and heap[0][0] <= t:
            trigger_at, _, op = heappop(heap)
            if op.ended:
                continue
            advance_to(trigger_at)
            if op.ended:  # expired in that pass: its deadline tick came first
                continue
            op.ready = True
            if force:
                op.force_complete()
            else:
                purgatory.check_and_complete(op.keys[0])

    def arrive(
        self, op_id: int, keys: tuple[str, ...], timeout: float, condition: float | None, t: float
    ) -> None:
        """Watch one operation arriving at `t` (scaled), whose condition comes at `condition`."""
        heap = self.heap
        if heap and heap[0][0] <= t:
            self.run_until(t)
        # (Time moves in one comparison while nothing is due: the clock's alarm.)
        self.clock.advance_to(t)
        ready = condition is not None and condition <= t
        op = ReplayOperation(self, op_id, keys, timeout, ready=ready, arrived=t, at=t)
        purgatory = self.purgatory
        if not purgatory.try_complete_else_watch(op, keys):
            # (Comparisons, not max(): a call costs more, once per operation.)
            deadline = t + timeout
            if deadline > self.horizon:  # noqa: PLR1730
                self.horizon = deadline
            watched = purgatory.watched()
            if watched > self.peak_watched:  # noqa: PLR1730
                self.peak_watched = watched
            delayed = purgatory.num_delayed()
            if delayed > self.peak_delayed:  # noqa: PLR1730
                self.peak_delayed = delayed
            # A condition a tick or more past the deadline can only lose to the expiry: not
            # queued (one closer to it is sorted out when popped, after the timer passes due).
            if condition is not None and condition < deadline + self.config.tick:
                self.seq += 1
                heappush(heap, (condition, self.seq, op))
        if self.check:
            check_invariants(purgatory)

    def prepare(self, t: float) -> None:
        """Run what comes before an arrival due at `t` (the start of `arrive`, which may follow:
        it then finds nothing more to run). A time shard's boundary is taken here."""
        if self.heap and self.heap[0][0] <= t:
            self.run_until(t)
        self.clock.advance_to(t)

    def drain(self) -> None:
        """Run the clock on until nothing is timed and no condition is pending."""
        self.run_until(math.inf)
        # Past the last deadline (and a tick, for its rounding up): every pass has run.
        self.clock.advance_to(max(self.clock.now(), self.horizon + self.config.tick))
        if self.event_log is not None:
            self.event_log.flush()

    def take_rows(self) -> pa.RecordBatch:
        n = len(self.out)
        ids, outcomes, watched, deadlines, ended = zip(*self.out, strict=True)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([self.name] * n, pa.string()),
                pa.array([self.config_id] * n, pa.int32()),
                pa.array(ids, pa.int64()),
                pa.array(outcomes, pa.string()),
                pa.array(watched, pa.float64()),
                pa.array(deadlines, pa.float64()),
                pa.array(ended, pa.float64()),
                *(pa.nulls(n, field.type) for field in list(OUTPUT_SCHEMA)[7:]),
            ],
            schema=OUTPUT_SCHEMA,
        )
        self.out = []
        return batch

    def load_stats(self) -> list[float]:
        """Busy seconds, span, and timer-pass lateness p50/p99/max: all 0 without a profile."""
        return [0.0] * 5

    def summary(self) -> list[Any]:
        """Operations, completed, expired, missed, then wait and lateness p50/p99/max (``None``:
        none)."""
        waits = _percentiles(self.waits)
        lateness = _percentiles(self.lateness)
        ended = len(self.waits)
        expired = len(self.lateness)
        return [ended, ended - expired, expired, self.missed, *waits, *lateness]

    def stats_row(self) -> pa.RecordBatch:
        stats = self.purgatory.statistics()
        values: list[Any] = [
            self.name,
            self.config_id,
            None,
            None,
            None,
            None,
            None,
            *self.summary(),
            self.peak_watched,
            self.peak_delayed,
            stats.timer_passes,
            stats.purges,
            stats.purged,
            self.attempts,
            *self.load_stats(),
        ]
        return pa.RecordBatch.from_arrays(
            [pa.array([v], f.type) for v, f in zip(values, OUTPUT_SCHEMA, strict=True)],
            schema=OUTPUT_SCHEMA,
        )


def _percentiles(values: array[float]) -> list[float | None]:
    """p50, p99 and max of `values` by nearest rank (Spark's ``percentile_disc``); ``None``s
    when there are none."""
    n = len(values)
    if not n:
        return [None, None, None]
    ordered = np.sort(np.frombuffer(values, dtype=np.float64))
    ranks = [_nearest_rank(p, n) - 1 for p in (0.5, 0.99)]
    return [float(ordered[rank]) for rank in (*ranks, n - 1)]


class _LoadedGroup(_Group):
    """A group served by one core, as one event loop serves it (see the module's docstring).

    The loop turns in iterations. An iteration collects every callback due when it starts (a
    loop that had nothing due slept in its selector until the next one, rounded up to the
    selector's resolution, and then woke later still, by a latency the profile draws) and runs
    them in the order of their times (at one instant: the reaper's timer, conditions, the
    arrival), each from ``busy_until``. The reaper's timer only wakes the reaper's task: its
    pass runs first in the next iteration, after every callback collected with its timer. What
    an event costs is counted from the work it did: the tries (``attempts``), the operations it
    finished, the expiries of a pass and the entries it purged (and a condition callback the
    application's own work for it, ``application_condition``, whatever it finds: none is
    scheduled for an operation completed at its watch); an iteration costs the
    profile's ``iteration``, plus ``wake`` when it followed a sleep; with the core's speed over
    time in the profile (``speed``), every cost times the factor of the window it starts in.
    """

    __slots__ = (
        "batch",
        "busy",
        "busy_until",
        "costs",
        "draw",
        "held",
        "last_pass",
        "late",
        "load",
        "owed",
        "pace",
        "pass_due",
        "pass_raw",
        "seed",
        "shaped",
        "start",
        "woke",
    )

    def __init__(
        self,
        name: str,
        config_id: int,
        config: ReplayConfig,
        event_log: JsonLinesEventLog | None,
        check: bool,
        *,
        keep: bool,
        costs: CostProfile,
    ) -> None:
        load = LoadClock()
        super().__init__(name, config_id, config, event_log, check, keep=keep, clock=load)
        self.load = load
        self.costs = costs
        self.busy_until = 0.0
        # Busy seconds in units of `BUSY_UNIT`, an integer: summed exactly, so that the time
        # shards of a split replay add up to the unsplit sum (floats would round differently).
        self.busy = 0
        self.start = math.nan
        # Timer-pass lateness in nanoseconds -> passes that late (bounded by the passes run).
        self.late: dict[int, int] = {}
        # The timer's next pass as the purgatory last said (`pass_raw`), and when it fell due.
        # A deadline is due at its tick, which comes after the last pass (that pass expired
        # everything due by then), however late the core gets to it. A purge owed is answered
        # with the tick of the last pass: it fell due during the event that made it owed, so it
        # is due at that event's end.
        self.pass_raw = math.inf
        self.pass_due = math.inf
        self.last_pass = 0.0
        # When the current iteration collected its callbacks (those due by then are its own),
        # and whether the reaper's timer was among them (its pass then opens the next one).
        self.batch = -math.inf
        self.owed = False
        # The wake-ups' latencies, drawn from the profile's: the same for the same group.
        seed = hashlib.sha256(f"{name}\0{config_id}".encode("utf-8", "surrogatepass"))
        self.draw = random.Random(int.from_bytes(seed.digest()[:8], "big")).random
        # Each event's cost and stall, drawn from the profile's distributions by a hash of this
        # seed and the event (`_unit`): the same draw for the same event of the same group,
        # whatever came before it in this replay (a replay split by time draws the same).
        self.seed = int.from_bytes(seed.digest()[8:16], "big")
        self.shaped = not costs.constant
        # Where the group lays the profile's measured speed sequence along the trace's time
        # (None: one speed throughout): a window drawn from the seed, so the same for the
        # same group however the replay is split.
        self.pace = self.seed % len(costs.speed) if costs.speed else None
        # Whether the core is held off at given times (a measured run's preemptions).
        self.held = bool(costs.holdoffs)
        # When the loop last woke from its selector (a stall comes only `stall_credit` later).
        self.woke = -math.inf

    def _served(self, start: float, cost: float, ran_pass: bool, event: int) -> None:
        """Book an event served from `start` for `cost` seconds; note when the next pass is due.

        `event` names it for its draws: with cost distributions in the profile it costs `cost`
        times a drawn factor (mean 1), and holds the core for a drawn stall beyond that; with
        the core's speed over time, it costs that times the speed of the window it starts in.
        """
        if self.shaped:
            costs = self.costs
            seed = self.seed
            cost *= costs.cost_factor(_unit(seed, 2 * event))
            cost *= self._speed(start)  # the core's speed in the window the event starts in
            end = start + cost
            if start >= self.woke + costs.stall_credit:
                end += costs.stall_at(_unit(seed, 2 * event + 1), cost)
        else:
            end = start + cost
        if self.held:
            end = self.costs.held_until(start, end)
        self.busy_until = end
        self.busy += int(cost * _PER_UNIT)
        raw = self.load.next_pass_at()
        if ran_pass:
            if raw <= start:
                raise RuntimeError(
                    f"the timer still has work at {start!r} right after a pass there (a callback "
                    "that keeps adding work due at once?)"
                )
            self.last_pass = start
        if raw != self.pass_raw or ran_pass:
            self.pass_raw = raw
            # (A tick's rounding slack: a deadline tick is a whole tick past the last pass.)
            purge = raw <= self.last_pass + 1e-3 * self.config.tick
            self.pass_due = end if purge and raw < start else raw

    def _speed(self, when: float) -> float:
        """The core's speed factor for work starting at `when` (1 without a measured speed)."""
        return 1.0 if self.pace is None else self.costs.speed_at(when, self.pace)

    def _iterate(self, first: float) -> None:
        """Start the next iteration: the callbacks of the last one are done, and the earliest
        still to come is due at `first` (the reaper's task owed a pass comes before it).

        With work ready (a pass owed, or `first` already due) the selector returns at once; an
        idle loop sleeps until `first` rounded up to the selector's resolution, from when it
        went to sleep, wakes later by a drawn latency, and pays ``wake``.
        """
        costs = self.costs
        free = self.busy_until
        if self.owed or first <= free:
            if math.isnan(self.start):
                self.start = free
            self.batch = free
            turn = costs.iteration * self._speed(free)
            self.busy_until = free + turn
            if self.held:
                self.busy_until = costs.held_until(free, self.busy_until)
            self.busy += int(turn * _PER_UNIT)
            if self.owed:
                self.owed = False
                self._serve_pass()
            return
        step = costs.wake_resolution
        wake = free + math.ceil((first - free) / step - 1e-9) * step if step > 0 else first
        wake += costs.latency(self.draw()) if costs.wake_latency else 0.0
        if self.held:
            wake = costs.awake_at(wake)
        if math.isnan(self.start):  # (the group's span starts with the core's first work)
            self.start = wake
        self.woke = wake
        self.batch = wake
        turn = (costs.wake + costs.iteration) * self._speed(wake)
        self.busy_until = wake + turn
        if self.held:
            self.busy_until = costs.held_until(wake, self.busy_until)
        self.busy += int(turn * _PER_UNIT)

    def _serve_pass(self) -> None:
        """The reaper's pass, at the start of the iteration after its timer's."""
        due = self.pass_due
        start = self.busy_until
        self.load.set(start)
        purgatory = self.purgatory
        watched = purgatory.watched()
        expired = self.load.run_pass()
        # (A pass takes entries off the watcher lists only by purging them.)
        purged = watched - purgatory.watched()
        late = round((start - due) * 1e9)
        self.late[late] = self.late.get(late, 0) + 1
        costs = self.costs
        cost = costs.timer_pass + expired * costs.expiry + purged * costs.purged_entry
        # (A pass is named by when it fell due, in nanoseconds.)
        self._served(start, cost, True, 4 * round(due * 1e9) + _PASS)

    def _serve_condition(self, op: ReplayOperation) -> None:
        start = self.busy_until
        self.load.set(start)
        costs = self.costs
        event = 4 * op.op_id + _CONDITION
        # (The application's work for the callback: scheduled when its operation began to
        # wait, and run whatever the purgatory then finds.)
        base = costs.dispatch + costs.application_condition
        if op.ended:  # expired or completed already: the event finds nothing to do
            self._served(start, base, False, event)
            return
        op.ready = True
        attempts = self.attempts
        finished = len(self.waits)
        if self.config.trigger == "force":
            op.force_complete()
        else:
            self.purgatory.check_and_complete(op.keys[0])
        done = len(self.waits) - finished
        tries = self.attempts - attempts - done
        cost = base + tries * costs.attempt + done * costs.completion
        self._served(start, cost, False, event)

    def prepare(self, t: float) -> None:
        """Serve what comes before an arrival due at `t` (`run_until`: `arrive` may follow)."""
        self.run_until(t)

    def run_until(self, t: float) -> None:
        """Serve what comes before an arrival due at `t`: the rest of the current iteration's
        callbacks due before it, and whole iterations until the one that collects it."""
        heap = self.heap
        while True:
            condition = heap[0][0] if heap else math.inf
            handle = math.inf if self.owed else self.pass_due
            batch = self.batch
            if handle <= condition and handle <= t and handle <= batch:
                self.owed = True  # the reaper's timer ran: its pass opens the next iteration
            elif condition <= t and condition <= batch:
                self._serve_condition(heappop(heap)[2])
            elif t <= batch:
                return  # the arrival is one of this iteration's callbacks
            else:
                first = min(handle, condition, t)
                if first == math.inf and not self.owed:
                    return
                self._iterate(first)

    def arrive(
        self, op_id: int, keys: tuple[str, ...], timeout: float, condition: float | None, t: float
    ) -> None:
        """Serve one arrival due at `t`, in the iteration that collects it."""
        self.run_until(t)
        start = self.busy_until
        self.load.set(start)
        ready = condition is not None and condition <= start
        op = ReplayOperation(self, op_id, keys, timeout, ready=ready, arrived=t, at=start)
        purgatory = self.purgatory
        costs = self.costs
        cost = costs.dispatch + costs.application
        if purgatory.try_complete_else_watch(op, keys):
            cost += costs.completion
        else:
            cost += costs.watch + (len(keys) - 1) * costs.watch_key
            self.horizon = max(self.horizon, start + timeout)
            self.peak_watched = max(self.peak_watched, purgatory.watched())
            self.peak_delayed = max(self.peak_delayed, purgatory.num_delayed())
            if condition is not None and condition < start + timeout + self.config.tick:
                self.seq += 1
                heappush(self.heap, (condition, self.seq, op))
        self._served(start, cost, False, 4 * op_id + _ARRIVAL)
        if self.check:
            check_invariants(purgatory)

    def drain(self) -> None:
        """Serve everything left: conditions and timer passes until nothing is timed."""
        self.run_until(math.inf)
        if self.event_log is not None:
            self.event_log.flush()

    def load_stats(self) -> list[float]:
        span = self.busy_until - self.start if self.busy_until > self.start else 0.0
        late = sorted(self.late.items())
        return [self.busy / _UNITS, span, *(_rank(late, p) / 1e9 for p in (0.5, 0.99, 1.0))]


#: A loaded group's busy time is counted in units of 2**-90 s: every cost (at most `MAX_COST`, a
#: double of 53 bits) from 2**-37 s (7 ps) up is a whole number of them, so the sum is exact.
_PER_UNIT: Final = 2.0**90
_UNITS: Final = 1 << 90  # (an int over an int divides with one rounding)


#: What an event's number (`_LoadedGroup._served`) ends with: 4 * op_id (or, for a timer pass,
#: 4 * the nanosecond it fell due) plus its kind.
_ARRIVAL: Final = 1
_CONDITION: Final = 2
_PASS: Final = 3
_MASK: Final = (1 << 64) - 1


def _unit(seed: int, event: int) -> float:
    """A number in [0, 1) that looks uniform, a function of `seed` and `event` alone
    (SplitMix64's finaliser): a draw that does not depend on the draws before it."""
    z = (seed + event * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return ((z ^ (z >> 31)) >> 11) * 2.0**-53


def _nearest_rank(p: float, n: int) -> int:
    """The 1-based rank of percentile `p` of `n` values (``percentile_disc``: Spark computes
    ``ceil(p * n)`` in doubles, as here)."""
    return max(1, math.ceil(p * n))


def _rank(counts: list[tuple[int, int]], p: float) -> int:
    """The nearest-rank percentile `p` of sorted (value, count) pairs (``percentile_disc``)."""
    total = sum(n for _, n in counts)
    if not total:
        return 0
    rank = _nearest_rank(p, total)
    seen = 0
    for value, n in counts:
        seen += n
        if seen >= rank:
            return value
    return counts[-1][0]


def replay_batches(
    batches: Iterable[pa.RecordBatch],
    configs: Mapping[int, ReplayConfig],
    *,
    event_log_dir: str | None = None,
    output_rows: int = OUTPUT_ROWS,
    check: bool = False,
    costs: CostProfile | None = None,
    operations: bool = True,
) -> Iterator[pa.RecordBatch]:
    """Replay a stream of trace batches sorted by (purgatory, config_id, arrival, op_id).

    Args:
        batches: Columns ``purgatory``, ``config_id``, ``op_id``, ``arrival``, ``keys``,
            ``timeout`` and ``condition_at`` (null: never), already validated.
        configs: The configuration of each ``config_id``.
        event_log_dir: If given, each group records its event log there (purgatory name
            ``"<purgatory>@<config_id>"``), flushed at the group's end.
        output_rows: Rows per emitted batch.
        check: After every arrival, check the purgatory's invariants
            (`purgatory.testing.check_invariants`, O(pending)): for tests.
        costs: A cost profile: each group is served as one core serves an event loop
            (`_LoadedGroup`). ``None``: virtual time where the purgatory's work costs nothing.
        operations: Emit each operation's row; ``False``: only each group's summary row.

    Yields:
        Batches of `OUTPUT_SCHEMA`: each operation's row (if `operations`), and after each
        group its summary and gauges row.

    Raises:
        ValueError: The stream is not sorted (a group appears twice, or arrivals go back).
    """
    group: _Group | None = None
    seen: set[tuple[str, int]] = set()
    last_arrival = -math.inf
    # One str object per distinct key: the purgatory's dicts then hash each key once.
    words: dict[str, str] = {}
    for batch in batches:
        rows = zip(
            batch.column("purgatory").to_pylist(),
            batch.column("config_id").to_pylist(),
            batch.column("op_id").to_pylist(),
            batch.column("arrival").to_pylist(),
            _key_tuples(batch.column("keys"), words),
            batch.column("timeout").to_pylist(),
            batch.column("condition_at").to_pylist(),
            strict=True,
        )
        for name, config_id, op_id, arrival, keys, timeout, condition_at in rows:
            if group is None or group.name != name or group.config_id != config_id:
                if group is not None:
                    yield from _finish(group)
                if (name, config_id) in seen:
                    raise ValueError(
                        f"replay input not grouped: group ({name!r}, {config_id}) seen twice"
                    )
                seen.add((name, config_id))
                group = _new_group(
                    name,
                    configs[config_id],
                    config_id=config_id,
                    event_log_dir=event_log_dir,
                    check=check,
                    operations=operations,
                    costs=costs,
                )
                last_arrival = -math.inf
            if arrival < last_arrival:
                raise ValueError(
                    f"replay input not sorted: purgatory {name!r} op_id {op_id} arrives at "
                    f"{arrival!r}, before the previous arrival {last_arrival!r}"
                )
            last_arrival = arrival
            config = group.config
            rate = config.rate_scale
            condition = condition_at
            if rate == 1.0:
                t = arrival
            else:
                t = arrival / rate
                if condition is not None:
                    condition = t + (condition - arrival)
            group.arrive(op_id, keys, timeout * config.timeout_scale, condition, t)
            if len(group.out) >= output_rows:
                yield group.take_rows()
    if group is not None:
        yield from _finish(group)


def _key_tuples(column: pa.Array, words: dict[str, str]) -> list[tuple[str, ...]]:
    """Each row's keys as a tuple, built in bulk (a third of the cost of one list per row),
    each distinct key one shared str object (its hash computed once)."""
    encoded = pc.dictionary_encode(column.flatten())
    known = [words.setdefault(word, word) for word in encoded.dictionary.to_pylist()]
    indices = encoded.indices.to_pylist()
    flat = itemgetter(*indices)(known) if len(indices) > 1 else [known[i] for i in indices]
    lengths = pc.list_value_length(column)
    width = pc.min_max(lengths)
    if width["min"].as_py() == width["max"].as_py():
        keys = iter(flat)
        return list(zip(*[keys] * (width["min"].as_py() or 0), strict=True))
    offsets = column.offsets.to_pylist()
    start = offsets[0]
    return [tuple(flat[a - start : b - start]) for a, b in pairwise(offsets)]


def _new_group(
    name: str,
    config: ReplayConfig,
    *,
    config_id: int,
    event_log_dir: str | None,
    check: bool,
    operations: bool,
    costs: CostProfile | None,
) -> _Group:
    """The state of a group starting, with its event log if `event_log_dir` is given."""
    log = None
    if event_log_dir is not None:
        # Readable, and injective thanks to the hash of the exact name; no leading "_" or "."
        # (Spark skips such files), bounded length.
        safe = "".join(c if (c.isascii() and c.isalnum()) or c in "-." else "_" for c in name)
        safe = safe.lstrip("_.")[:64] or "p"
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        log = _group_log(event_log_dir, f"{safe}-{digest}-c{config_id}")
    if costs is None:
        return _Group(name, config_id, config, log, check, keep=operations)
    return _LoadedGroup(name, config_id, config, log, check, keep=operations, costs=costs)


def _group_log(directory: str, prefix: str) -> JsonLinesEventLog:
    """A group's recorder, publishing only at the group's end; an earlier attempt's files go.

    Spark re-runs a failed task whole, so the published files of a group replayed by an earlier
    attempt (same prefix) are removed first: each group's lines are published exactly once.
    """
    if os.path.isdir(directory):
        mine = re.compile(re.escape(prefix) + r"-[0-9a-f]{12}-[0-9]{6}\.jsonl")
        for entry in os.listdir(directory):
            if mine.fullmatch(entry):
                os.remove(os.path.join(directory, entry))
    # Virtual time: no anchor to UTC (a replay's times are the trace's, not a real clock's).
    return JsonLinesEventLog(directory, prefix=prefix, max_bytes=1 << 62, op_id=_op_id, clock=None)


def _op_id(op: Any) -> int:
    return int(op.op_id)


def _finish(group: _Group) -> Iterator[pa.RecordBatch]:
    group.drain()
    if group.out:
        yield group.take_rows()
    yield group.stats_row()


def replay_table(
    trace: pa.Table,
    configs: Mapping[int, ReplayConfig],
    *,
    event_log_dir: str | None = None,
    check: bool = False,
    costs: CostProfile | None = None,
    operations: bool = True,
) -> pa.Table:
    """Replay a whole trace table in this process under every configuration (no Spark).

    The reference implementation: the same engine as the Spark job, fed the same order.
    Arguments as for `replay_batches`.
    """
    parts = []
    for config_id in sorted(configs):
        with_id = trace.append_column(
            "config_id", pa.array([config_id] * trace.num_rows, pa.int32())
        )
        parts.append(with_id)
    table = pa.concat_tables(parts) if parts else trace
    table = table.sort_by(
        [
            ("purgatory", "ascending"),
            ("config_id", "ascending"),
            ("arrival", "ascending"),
            ("op_id", "ascending"),
        ]
    )
    batches = replay_batches(
        table.to_batches(max_chunksize=10000),
        configs,
        event_log_dir=event_log_dir,
        check=check,
        costs=costs,
        operations=operations,
    )
    return pa.Table.from_batches(list(batches), schema=OUTPUT_SCHEMA)
