"""The load model's inputs: a cost profile (CPU seconds per event kind) and the clock it drives.

Without a profile the replay runs in virtual time where the purgatory's own work costs nothing,
so no work queues behind other work and a timer pass is never late: an arrival rate changes how
many operations are pending at once (``watched()``, the tries per condition, the purges) and
where each deadline falls within its tick (a condition in the last tick completes late or
expires), not whether the core keeps up. With one, each (purgatory, configuration) group is served
as one event loop on one core serves it, iteration by iteration: the loop collects the
callbacks due (arrivals, conditions that fire, the reaper's timer), runs them in the order of
their times, each keeping the core busy for what its work costs by the profile, and collects
again; an idle loop sleeps in its selector until the next is due (rounded up to the selector's
resolution) and wakes that much later again as the operating system schedules it. Work queues
behind work, the reaper's pass runs after the callbacks collected with its timer, and operations
wait longer and expire more once the offered work exceeds the core.

An event's cost is not constant on a real loop: most callbacks cost about the same, and a few
cost many times more (caches taken by another process, a page fault), or are held off the
core for a while (another process preempting the loop). Near the knee one such event
delays a whole batch and the reaper behind it, and the backlog takes a long time to drain:
that is where expiry lateness gets its tail. A profile of version 4 or later holds both as measured
(``cost_shape``: an event's CPU cost over the mean, as quantiles; ``stall``: the seconds an
event is held off the core beyond its CPU, as quantiles), and a replay draws every arrival's,
condition's and timer pass's from them, by a hash of the group and the event (not from a
sequence), so the same event gets the same draw however the replay is split. An older
profile (version 3) has neither and is replayed with constant costs (its description says so).

Nor is the core's speed constant from one moment to the next: on a shared machine (a virtual
machine's core shares its caches and its physical core with other work) the same callbacks
cost 1.2 to 1.8 times their mean CPU for spells of 100 to 300 ms, every event of the spell
alike (measured: the real loop's median arrival at 22.6 us for 160 ms against 14.9 us around
it, with no wait for a CPU). Independent draws per event average out within a batch; a spell
does not, and a loop 60 to 85 % busy that is slowed by half for a tenth of a second falls
behind by tens of milliseconds, the backlog of the expiries due meanwhile. A profile of
version 5 holds the speed as measured (``speed``: the CPU of a fixed unit of work in each
window of ``speed_window`` seconds, back to back, over its mean), and a replay multiplies the
cost of every event starting in a window by that window's factor, the measured sequence laid
along the trace's time from an offset drawn by the group (the same for the same group
however the replay is split).

A profile is measured by ``python -m purgatory.pipeline calibrate`` (in `._calibrate`) on the
machine and loop that matter, and stored as a small versioned JSON file.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from .._clock import Timer

__all__ = (
    "COST_KINDS",
    "GIVEN_KINDS",
    "LATENCY_QUANTILES",
    "MAX_COST",
    "PROFILE_VERSION",
    "SHAPE_QUANTILES",
    "CostProfile",
    "LoadClock",
    "load_profile",
)

#: The version of the profile file's layout written; a file of another version than
#: `READABLE_VERSIONS` is refused.
PROFILE_VERSION: Final = 5
#: The versions read: 3 has no cost distributions (``cost_shape``, ``stall``) and is replayed
#: with constant costs; 4 has them but no ``speed`` (its core runs at one speed).
READABLE_VERSIONS: Final = (3, 4, 5)
#: The most factors a profile's ``speed`` holds (minutes of 20 ms windows).
MAX_SPEED_WINDOWS: Final = 100_000
#: The probabilities at which a profile gives the scheduling latency of a wake-up
#: (``wake_latency``): its quantiles, between which a replay draws its latencies.
LATENCY_QUANTILES: Final = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 1.0)
#: The probabilities at which a profile gives an event's cost over the mean (``cost_shape``)
#: and its stall (``stall``): finer in the tail, where the rare long events are, than
#: `LATENCY_QUANTILES`.
SHAPE_QUANTILES: Final = (
    0.0,
    0.1,
    0.25,
    0.5,
    0.75,
    0.9,
    0.95,
    0.99,
    0.995,
    0.999,
    0.9995,
    0.9999,
    1.0,
)
#: The most an event may cost over the mean (a ``cost_shape`` quantile): beyond it the
#: measurement was not of one callback.
MAX_SHAPE: Final = 1e5
#: The most one event may cost, in seconds of one core: a loop that spends more on a single
#: callback is not serving a purgatory, and a larger figure is a broken profile (it would
#: also carry the model's clock past what a double counts in nanoseconds).
MAX_COST: Final = 1.0

#: The costs `calibrate` does not measure (the application's, given by its caller): a
#: profile file may leave them out (0).
GIVEN_KINDS: Final = ("application", "application_condition")

#: A measured cost whose spread between rounds (its interquartile range) is wider than this
#: share of it is called noisy in the profile's description.
NOISY_SHARE: Final = 0.25

#: What each cost of a profile is charged for, in seconds of one core.
COST_KINDS: Final = {
    "dispatch": "the loop running one callback: an arrival, a condition firing",
    "wake": "waking an idle loop (its selector returning), beyond the dispatch: charged to an "
    "event that finds the core idle",
    "watch": "try_complete_else_watch of an operation that waits, on one key (its two tries)",
    "watch_key": "each key of a watch after the first",
    "attempt": "one try_complete that finds its condition unmet",
    "completion": "one try_complete that completes: force_complete and on_complete",
    "expiry": "one operation expired by a timer pass",
    "timer_pass": "one wake-up of the reaper: the timer handle, the task step, the wheel",
    "purged_entry": "one watcher-list entry removed by a purge",
    "application": "the application's own work per operation (0 unless given)",
    "application_condition": "the application's own work per condition callback, beyond the "
    "dispatch: scheduling it when its operation waits, and serving it (0 unless given)",
    "iteration": "one turn of the loop beyond its callbacks: a selector call that finds work "
    "due, collecting the timers due, the ready queue",
}


@dataclass(frozen=True, slots=True)
class CostProfile:
    """CPU seconds per event kind (see `COST_KINDS`), and where they were measured."""

    dispatch: float
    wake: float
    watch: float
    watch_key: float
    attempt: float
    completion: float
    expiry: float
    timer_pass: float
    purged_entry: float
    application: float = 0.0
    iteration: float = 0.0
    #: The application's own work per condition callback (`COST_KINDS`): charged apart from
    #: `application`, per condition event, because a loop that is behind completes an operation
    #: whose condition has already come at its watch and schedules no callback for it, so
    #: this work is not done once per operation. 0 unless given.
    application_condition: float = 0.0
    #: The granularity of the loop's sleep in its selector: an idle loop sleeps until its next
    #: timer rounded up to this (epoll's and libuv's timeouts are whole milliseconds), then runs
    #: every event due by then for one wake-up. 0: it wakes exactly on time.
    wake_resolution: float = 0.0
    #: How much later than its selector's timeout an idle loop runs (the operating system
    #: scheduling the thread that woke), in seconds: its quantiles at `LATENCY_QUANTILES`, as
    #: measured; a replay draws each wake-up's from them (seeded by the group). Empty: none.
    wake_latency: tuple[float, ...] = ()
    #: An event's CPU cost over the mean cost of its kind, measured per callback on a busy
    #: loop: its quantiles at `SHAPE_QUANTILES`. A replay draws a factor for each arrival,
    #: condition and timer pass from them, scaled so that their mean is 1 (the costs above are
    #: means, and stay so). Empty: every event costs exactly its kind's cost.
    cost_shape: tuple[float, ...] = ()
    #: How long an event is held off the core beyond its CPU (wall time minus thread time of
    #: one callback on a busy loop: another process preempting the loop), in seconds: its
    #: quantiles at `SHAPE_QUANTILES`, drawn per event as `cost_shape` is. Not CPU: it delays
    #: the loop without adding to its busy time. Empty: none.
    stall: tuple[float, ...] = ()
    #: The mean CPU seconds of the callbacks `stall` was measured on: an event costing k times
    #: this is k times as likely to be held off the core (preemption comes per second run).
    #: 0: every event draws from `stall` as it is.
    stall_basis: float = 0.0
    #: How long a loop that woke from its selector runs before another process preempts it,
    #: in seconds: the scheduler favours a thread that slept (a loop that is often idle is
    #: rarely held off mid-callback, a loop busy for longer is held off as often as `stall`
    #: says). An event starting within this of the loop's last wake-up draws no stall. 0:
    #: every event draws one.
    stall_credit: float = 0.0
    #: The measured mean of the stalls, in seconds: the drawn stalls are scaled to it. The
    #: quantiles alone overstate it (linear up to the largest, one sample, their mean came out
    #: 1.6 to 1.8 times the sample's under load). 0: the quantiles' own mean is kept.
    stall_mean: float = 0.0
    #: The core's speed over time: the CPU seconds a fixed unit of work took in each window of
    #: `speed_window` seconds, run back to back, over their mean (a sequence, in the order
    #: measured: its spells are what matters). A replay multiplies the cost of an event that
    #: starts in a window of the trace's time by a factor of this sequence (scaled so that
    #: their mean is 1), laid from an offset drawn per group. Empty: one speed throughout.
    speed: tuple[float, ...] = ()
    #: The seconds each factor of `speed` covers (0 without one).
    speed_window: float = 0.0
    loop: str = "asyncio"
    python: str = ""
    machine: str = ""
    #: How widely each measured cost varied between the calibration's rounds: the
    #: interquartile range of its per-round values, in seconds (the cost is their median). A
    #: busy machine gives wide spreads, not a refusal. Empty: not measured (a profile by hand).
    spread: dict[str, float] = field(default_factory=dict, hash=False)
    #: How many rounds of every measurement the costs are the medians of (0: not measured).
    rounds: int = 0
    #: Spells the core is held off at given times, as (start, seconds) in the trace's time,
    #: sorted and apart: a replay's work that reaches one waits for its end, and a loop waking
    #: inside one wakes at its end. Not measured by `calibrate` and not kept in a profile file:
    #: it replays a run whose preemptions were measured (the load validation's), where the
    #: drawn ``stall`` is a minute's guess of them. Empty: none.
    holdoffs: tuple[tuple[float, float], ...] = ()
    #: The mean of what `cost_shape` draws (1 without one): `cost_factor` divides by it.
    shape_mean: float = field(default=1.0, init=False, repr=False, compare=False)
    #: What `stall_at` multiplies the quantiles' stall by: `stall_mean` over their mean.
    stall_scale: float = field(default=1.0, init=False, repr=False, compare=False)
    #: The mean of `speed` (1 without one): `speed_at` divides by it.
    speed_mean: float = field(default=1.0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_latency()
        self._check_spread()
        self._check_holdoffs()
        for kind in (
            *COST_KINDS,
            "wake_resolution",
            "stall_basis",
            "stall_credit",
            "stall_mean",
            "speed_window",
        ):
            value = getattr(self, kind)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"cost {kind!r} must be a number of seconds, got {value!r:.40}")
            try:
                seconds = float(value)
            except OverflowError:
                seconds = math.inf
            if not 0 <= seconds <= MAX_COST:
                raise ValueError(
                    f"cost {kind!r} must be a number of seconds in [0, {MAX_COST:g}], got "
                    f"{value!r:.40}"
                )
            object.__setattr__(self, kind, seconds)
        self._check_speed()

    def _check_speed(self) -> None:
        speed = self.speed
        if not isinstance(speed, tuple | list) or len(speed) > MAX_SPEED_WINDOWS:
            raise ValueError(
                f"speed must be at most {MAX_SPEED_WINDOWS:,} factors, got {speed!r:.60}"
            )
        factors = []
        for value in speed:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"speed holds a value that is not a factor: {value!r:.40}")
            if not 0 < value <= MAX_SHAPE:
                raise ValueError(f"speed holds {value!r:.40}, not a factor in (0, {MAX_SHAPE:g}]")
            factors.append(float(value))
        if factors and not self.speed_window > 0:
            raise ValueError("speed is given without its window (speed_window > 0 seconds)")
        object.__setattr__(self, "speed", tuple(factors))
        if factors:
            object.__setattr__(self, "speed_mean", math.fsum(factors) / len(factors))

    def speed_at(self, when: float, offset: int) -> float:
        """The core's speed factor (mean 1) for work starting at `when` seconds of a trace whose
        group laid `speed` from window `offset`; 1 without one."""
        speed = self.speed
        if not speed:
            return 1.0
        window = math.floor(when / self.speed_window) if math.isfinite(when) else 0
        return speed[(offset + window) % len(speed)] / self.speed_mean

    def _check_latency(self) -> None:
        for name, points, unit, top in (
            ("wake_latency", LATENCY_QUANTILES, "seconds", MAX_COST),
            ("cost_shape", SHAPE_QUANTILES, "factors", MAX_SHAPE),
            ("stall", SHAPE_QUANTILES, "seconds", MAX_COST),
        ):
            values = _quantiles(name, getattr(self, name), points, unit, top)
            object.__setattr__(self, name, values)
        if self.cost_shape:
            mean = _mean(SHAPE_QUANTILES, self.cost_shape)
            if not mean > 0:
                raise ValueError("cost_shape's quantiles are all 0: an event's cost has no scale")
            object.__setattr__(self, "shape_mean", mean)
        if self.stall and self.stall_mean > 0:
            mean = _mean(SHAPE_QUANTILES, self.stall)
            if not mean > 0:
                raise ValueError("stall_mean is given, but stall's quantiles are all 0")
            object.__setattr__(self, "stall_scale", self.stall_mean / mean)

    def _check_spread(self) -> None:
        spread = self.spread
        if not isinstance(spread, dict):
            raise ValueError(f"spread must be an object of costs, got {spread!r:.60}")
        checked = {}
        for kind, value in spread.items():
            if kind not in COST_KINDS:
                raise ValueError(f"spread of an unknown cost {kind!r:.40}")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"spread of {kind!r} must be seconds, got {value!r:.40}")
            if not 0 <= value <= MAX_COST:
                raise ValueError(
                    f"spread of {kind!r} must be seconds in [0, {MAX_COST:g}], got {value!r:.40}"
                )
            checked[kind] = float(value)
        object.__setattr__(self, "spread", checked)
        rounds = self.rounds
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"rounds must be a whole number >= 0, got {rounds!r:.40}")

    def _check_holdoffs(self) -> None:
        spells = []
        end = -math.inf
        for spell in self.holdoffs:
            if not isinstance(spell, tuple | list) or len(spell) != 2:
                raise ValueError(f"holdoffs holds {spell!r:.40}, not a (start, seconds) pair")
            start, held = spell
            for value in spell:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ValueError(f"holdoffs holds {spell!r:.40}, not seconds")
            if not (math.isfinite(start) and 0 <= held <= MAX_COST):
                raise ValueError(
                    f"holdoffs holds {spell!r:.40}: a finite start and seconds in [0, {MAX_COST:g}]"
                )
            if start < end:
                raise ValueError(f"holdoffs must be sorted and apart, got {spell!r:.40} too early")
            end = start + held
            spells.append((float(start), float(held)))
        object.__setattr__(self, "holdoffs", tuple(spells))

    def held_until(self, start: float, end: float) -> float:
        """When work running from `start`, needing the core until `end` without hold-offs,
        ends with them: a hold-off under way at `start` delays it to the hold-off's end, and
        each one beginning within it delays the rest by its length."""
        spells = self.holdoffs
        i = bisect.bisect_left(spells, (start, -math.inf))
        if i and spells[i - 1][0] + spells[i - 1][1] > start:  # (one under way at `start`)
            end += spells[i - 1][0] + spells[i - 1][1] - start
        while i < len(spells) and spells[i][0] < end:
            end += spells[i][1]
            i += 1
        return end

    def awake_at(self, when: float) -> float:
        """When a loop due to wake at `when` runs: the end of a hold-off it falls in, or
        `when`."""
        spells = self.holdoffs
        i = bisect.bisect_right(spells, (when, math.inf)) - 1
        if i >= 0:
            start, held = spells[i]
            if when < start + held:
                return start + held
        return when

    def noisy(self, share: float = NOISY_SHARE) -> list[str]:
        """The measured costs whose spread is wider than `share` of the cost (or that are 0
        with a spread): what a busy machine blurred."""
        return [
            kind
            for kind, spread in self.spread.items()
            if spread > share * getattr(self, kind) and spread > 0
        ]

    def latency(self, u: float) -> float:
        """The wake-up latency at probability `u` in [0, 1] (linear between the quantiles)."""
        return _between(LATENCY_QUANTILES, self.wake_latency, u)

    def cost_factor(self, u: float) -> float:
        """An event's cost over its kind's mean at probability `u` in [0, 1] (linear between
        the quantiles of `cost_shape`, scaled so that the factors' mean is 1); 1 without one."""
        if not self.cost_shape:
            return 1.0
        return _between(SHAPE_QUANTILES, self.cost_shape, u) / self.shape_mean

    def stall_at(self, u: float, cost: float) -> float:
        """The stall of an event costing `cost` CPU seconds, at probability `u` in [0, 1], in
        seconds; 0 without `stall`.

        A stall is as likely per second of CPU: an event costing k times `stall_basis` is
        stalled beyond x k times as often as a measured one, P(> x) = k P_measured(> x), so
        its quantile at `u` is the measured one at 1 - (1 - u) / k (0 below the measured
        quantile 0).
        """
        if not self.stall:
            return 0.0
        basis = self.stall_basis
        if basis > 0:
            if cost <= 0:
                return 0.0
            u = max(0.0, 1.0 - (1.0 - u) * basis / cost)
        return _between(SHAPE_QUANTILES, self.stall, u) * self.stall_scale

    @property
    def constant(self) -> bool:
        """Whether every event of a kind costs the same (no `cost_shape`, no `stall`, no
        `speed`: a profile of version 3, or one made by hand): the replay's batches then have
        no tail."""
        return not self.cost_shape and not self.stall and not self.speed

    def spells(self, slower: float = 1.2) -> float:
        """The share of `speed`'s windows whose work cost `slower` times the mean or more."""
        if not self.speed:
            return 0.0
        return sum(f >= slower * self.speed_mean for f in self.speed) / len(self.speed)

    @property
    def zero(self) -> bool:
        """Whether every event costs nothing and the core is never held off (the replay is
        then exactly the plain one)."""
        return all(getattr(self, kind) == 0 for kind in COST_KINDS) and not self.holdoffs

    def to_json(self) -> dict[str, Any]:
        """The file's content: version, where it was measured, the costs in seconds."""
        data = asdict(self)
        del data["shape_mean"], data["stall_scale"], data["speed_mean"]
        del data["holdoffs"]  # (a run's, not a profile's)
        return {
            "version": PROFILE_VERSION,
            "loop": data.pop("loop"),
            "python": data.pop("python"),
            "machine": data.pop("machine"),
            "wake_resolution": data.pop("wake_resolution"),
            "wake_latency": list(data.pop("wake_latency")),
            "cost_shape": list(data.pop("cost_shape")),
            "stall": list(data.pop("stall")),
            "stall_basis": data.pop("stall_basis"),
            "stall_credit": data.pop("stall_credit"),
            "stall_mean": data.pop("stall_mean"),
            "speed": list(data.pop("speed")),
            "speed_window": data.pop("speed_window"),
            "rounds": data.pop("rounds"),
            "spread": data.pop("spread"),
            "costs": data,
        }

    def describe(self) -> str:
        """One line for a summary: the loop, and the costs in microseconds."""
        costs = ", ".join(f"{kind} {getattr(self, kind) * 1e6:.2f}" for kind in COST_KINDS)
        latency = ""
        if self.wake_latency:
            p50, p99 = (self.latency(p) * 1e6 for p in (0.5, 0.99))
            latency = f", wake latency p50 {p50:.0f} us, p99 {p99:.0f} us"
        if self.constant:
            shape = (
                "; constant costs per event kind (no cost distributions in the profile: "
                "calibrate's before version 4, or one made by hand)"
            )
        else:
            factors = ", ".join(
                f"p{100 * p:g} x{self.cost_factor(p):.2f}" for p in (0.5, 0.99, 0.999, 1.0)
            )
            stalls = ", ".join(
                f"p{100 * p:g} {_between(SHAPE_QUANTILES, self.stall, p) * 1e6:.0f} us"
                for p in (0.99, 0.999, 1.0)
            )
            basis = f" (of events of {self.stall_basis * 1e6:.2f} us)" if self.stall_basis else ""
            if self.stall_mean:
                basis += f", mean {self.stall_mean * 1e6:.2f} us"
            if self.stall_credit:
                basis += f", none within {self.stall_credit * 1e3:.2f} ms of a wake-up"
            shape = f"; an event's cost over the mean {factors}; stall {stalls}{basis}"
        if self.speed:
            ordered = sorted(f / self.speed_mean for f in self.speed)
            n = len(ordered)
            points = ", ".join(
                f"p{100 * p:g} x{ordered[min(n - 1, max(0, math.ceil(p * n) - 1))]:.2f}"
                for p in (0.5, 0.9, 0.99, 1.0)
            )
            shape += (
                f"; the core's speed over {n} windows of {self.speed_window * 1e3:g} ms "
                f"(CPU over the mean): {points}, {self.spells():.0%} of them slowed by 20 % or more"
            )
        measured = ""
        if self.rounds:
            noisy = ", ".join(
                f"{kind} {getattr(self, kind) * 1e6:.2f} (IQR {self.spread[kind] * 1e6:.2f})"
                for kind in self.noisy()
            )
            measured = f"; medians of {self.rounds} rounds" + (
                f", noisy (spread over {NOISY_SHARE:.0%} of the cost, us): {noisy}" if noisy else ""
            )
        held = ""
        if self.holdoffs:
            longest = max(h for _, h in self.holdoffs) * 1e3
            total = sum(h for _, h in self.holdoffs) * 1e3
            held = (
                f"; held off {len(self.holdoffs)} times at given times (longest {longest:.2f} ms, "
                f"{total:.2f} ms in all)"
            )
        return (
            f"{self.loop} loop, {self.machine or 'unknown machine'}; costs (us): {costs}; "
            f"wake resolution {self.wake_resolution * 1e3:g} ms{latency}{shape}{measured}{held}"
        )


def profile_from_json(data: Any, where: str) -> CostProfile:
    """Check a decoded profile file whole; `where` names it in the one-line errors."""
    if not isinstance(data, dict):
        raise ValueError(f"cost profile {where}: expected a JSON object, got {data!r:.60}")
    version = data.get("version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise ValueError(
            f"cost profile {where}: version {version!r:.40}, expected "
            f"{' or '.join(map(str, READABLE_VERSIONS))} "
            "(make a new one with: python -m purgatory.pipeline calibrate --out FILE)"
        )
    costs = data.get("costs")
    if not isinstance(costs, dict):
        raise ValueError(f"cost profile {where}: 'costs' must be an object, got {costs!r:.60}")
    unknown = [kind for kind in costs if kind not in COST_KINDS]
    if unknown:
        raise ValueError(
            f"cost profile {where}: unknown cost {unknown[0]!r:.40} "
            f"(known: {', '.join(COST_KINDS)})"
        )
    missing = [kind for kind in COST_KINDS if kind not in costs and kind not in GIVEN_KINDS]
    if missing:
        raise ValueError(f"cost profile {where}: missing cost {missing[0]!r}")
    meta: dict[str, Any] = {
        "wake_resolution": data.get("wake_resolution", 0.0),
        "wake_latency": data.get("wake_latency", []),
        # (Version 3 has no distributions: its costs are constant.)
        "cost_shape": data.get("cost_shape", []) if version >= 4 else [],
        "stall": data.get("stall", []) if version >= 4 else [],
        "stall_basis": data.get("stall_basis", 0.0) if version >= 4 else 0.0,
        "stall_credit": data.get("stall_credit", 0.0) if version >= 4 else 0.0,
        "stall_mean": data.get("stall_mean", 0.0) if version >= 4 else 0.0,
        # (Version 5 has the core's speed over time; before, one speed throughout.)
        "speed": data.get("speed", []) if version >= 5 else [],
        "speed_window": data.get("speed_window", 0.0) if version >= 5 else 0.0,
        "spread": data.get("spread", {}),  # (none in a profile of an older calibrate)
        "rounds": data.get("rounds", 0),
    }
    for name in ("loop", "python", "machine"):
        value = data.get(name, "")
        if not isinstance(value, str):
            raise ValueError(f"cost profile {where}: {name!r} must be a string, got {value!r:.40}")
        meta[name] = value
    try:
        return CostProfile(**{**costs, **meta})
    except ValueError as exc:
        raise ValueError(f"cost profile {where}: {exc}") from None


def load_profile(path: str) -> CostProfile:
    """Read and check a profile file.

    Raises:
        ValueError: One line naming the file: unreadable, not UTF-8, not JSON, another
            version, a cost missing, unknown, not a number, negative, or beyond `MAX_COST`.
    """
    try:
        with open(path, "rb") as file:
            raw = file.read(_LARGEST + 1)
    except OSError as exc:
        raise ValueError(f"cost profile {path}: cannot read it: {exc.strerror}") from None
    if len(raw) > _LARGEST:
        raise ValueError(f"cost profile {path}: larger than {_LARGEST:,} bytes: not a profile")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"cost profile {path}: not UTF-8 text (byte {exc.start}: {raw[exc.start]:#04x})"
        ) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"cost profile {path}: not JSON: {_one_line(exc)}") from None
    return profile_from_json(data, path)


def _quantiles(
    name: str, values: Any, points: tuple[float, ...], unit: str, top: float
) -> tuple[float, ...]:
    """`values` checked as quantiles at `points`, each `unit` in [0, `top`], not decreasing;
    or none."""
    if not isinstance(values, tuple | list) or (values and len(values) != len(points)):
        raise ValueError(
            f"{name} must be {len(points)} quantiles (at {', '.join(map(str, points))}) or "
            f"none, got {values!r:.60}"
        )
    checked = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} holds a value that is not {unit}: {value!r:.40}")
        if not 0 <= value <= top:
            raise ValueError(f"{name} holds {value!r:.40}, not {unit} in [0, {top:g}]")
        checked.append(float(value))
    if checked != sorted(checked):
        raise ValueError(f"{name}'s quantiles must not decrease, got {values!r:.80}")
    return tuple(checked)


def _between(points: tuple[float, ...], values: tuple[float, ...], u: float) -> float:
    """The quantile function through (`points`, `values`) at `u` (linear between them); 0 if
    there are none."""
    if not values:
        return 0.0
    i = min(bisect.bisect_right(points, u), len(points) - 1)
    lo, hi = points[i - 1], points[i]
    share = (u - lo) / (hi - lo) if hi > lo else 0.0
    return values[i - 1] + share * (values[i] - values[i - 1])


def _mean(points: tuple[float, ...], values: tuple[float, ...]) -> float:
    """The mean of what `_between` draws from a uniform `u`: the area under it."""
    return sum(
        (p1 - p0) * (v0 + v1) / 2
        for p0, p1, v0, v1 in zip(points, points[1:], values, values[1:], strict=False)
    )


#: A profile file is a few hundred bytes.
_LARGEST: Final = 1 << 20


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def save_profile(profile: CostProfile, path: str) -> None:
    """Write `profile` as JSON (whole: written beside, then renamed over `path`; nothing is
    left beside it if that fails)."""
    staging = f"{path}.part"
    try:
        with open(staging, "w", encoding="utf-8") as file:
            json.dump(profile.to_json(), file, indent=2)
            file.write("\n")
        os.replace(staging, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(staging)
        raise


class LoadClock:
    """The driven clock of a loaded replay: it moves to each event's service time, and runs a
    timer pass only when the engine serves one.

    `purgatory.testing.ManualClock.advance_to` runs every pass due on the way, on time; a loaded
    core runs a pass late, when it gets to it, and meanwhile serves arrivals with the clock
    already past the pass's tick. So this clock moves without running anything (`set`), and
    runs one pass at the current time (`run_pass`). It serves one purgatory's timer, through
    the public `purgatory.DrivenClock` protocol every driven clock uses.
    """

    __slots__ = ("_now", "_timer")

    def __init__(self) -> None:
        self._now = 0.0
        self._timer: Timer | None = None

    def now(self) -> float:
        """The current time in seconds."""
        return self._now

    def current_time(self) -> float:
        """The current time in seconds (the `Clock` protocol)."""
        return self._now

    def attach(self, timer: Timer) -> None:
        """Serve `timer`, a purgatory's (one only)."""
        if self._timer is not None:
            raise ValueError("a LoadClock serves one purgatory")
        self._timer = timer

    def set(self, when: float) -> None:
        """Move to `when` (never backwards) without running a timer pass."""
        if when < self._now:
            raise ValueError(f"time never goes backwards: {when!r} < now {self._now!r}")
        self._now = when

    def next_pass_at(self) -> float:
        """When the purgatory's timer next has work, in seconds; ``math.inf`` if never."""
        assert self._timer is not None
        return self._timer.next_pass_at()

    def run_pass(self) -> int:
        """Run the purgatory's timer pass at the current time; return how many expired."""
        assert self._timer is not None
        return self._timer.run_pass(self._now)
