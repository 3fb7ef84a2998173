"""The load model's inputs: a cost profile (CPU seconds per event kind) and the clock it drives.

Without a profile the replay runs in virtual time where the purgatory's own work costs nothing,
so an arrival rate changes nothing. With one, each (purgatory, configuration) group is served
as one event loop on one core serves it, iteration by iteration: the loop collects the
callbacks due (arrivals, conditions that fire, the reaper's timer), runs them in the order of
their times, each keeping the core busy for what its work costs by the profile, and collects
again; an idle loop sleeps in its selector until the next is due (rounded up to the selector's
resolution) and wakes that much later again as the operating system schedules it. Work queues
behind work, the reaper's pass runs after the callbacks collected with its timer, and operations
wait longer and expire more once the offered work exceeds the core.

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
    "LATENCY_QUANTILES",
    "MAX_COST",
    "PROFILE_VERSION",
    "CostProfile",
    "LoadClock",
    "load_profile",
)

#: The version of the profile file's layout; a file of another version is refused.
PROFILE_VERSION: Final = 3
#: The probabilities at which a profile gives the scheduling latency of a wake-up
#: (``wake_latency``): its quantiles, between which a replay draws its latencies.
LATENCY_QUANTILES: Final = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 1.0)
#: The most one event may cost, in seconds of one core: a loop that spends more on a single
#: callback is not serving a purgatory, and a larger figure is a broken profile (it would
#: also carry the model's clock past what a double counts in nanoseconds).
MAX_COST: Final = 1.0

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
    #: The granularity of the loop's sleep in its selector: an idle loop sleeps until its next
    #: timer rounded up to this (epoll's and libuv's timeouts are whole milliseconds), then runs
    #: every event due by then for one wake-up. 0: it wakes exactly on time.
    wake_resolution: float = 0.0
    #: How much later than its selector's timeout an idle loop runs (the operating system
    #: scheduling the thread that woke), in seconds: its quantiles at `LATENCY_QUANTILES`, as
    #: measured; a replay draws each wake-up's from them (seeded by the group). Empty: none.
    wake_latency: tuple[float, ...] = ()
    loop: str = "asyncio"
    python: str = ""
    machine: str = ""
    #: How widely each measured cost varied between the calibration's rounds: the
    #: interquartile range of its per-round values, in seconds (the cost is their median). A
    #: busy machine gives wide spreads, not a refusal. Empty: not measured (a profile by hand).
    spread: dict[str, float] = field(default_factory=dict, hash=False)
    #: How many rounds of every measurement the costs are the medians of (0: not measured).
    rounds: int = 0

    def __post_init__(self) -> None:
        self._check_latency()
        self._check_spread()
        for kind in (*COST_KINDS, "wake_resolution"):
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

    def _check_latency(self) -> None:
        latency = self.wake_latency
        if not isinstance(latency, tuple | list) or (
            latency and len(latency) != len(LATENCY_QUANTILES)
        ):
            raise ValueError(
                f"wake_latency must be {len(LATENCY_QUANTILES)} quantiles (at "
                f"{', '.join(map(str, LATENCY_QUANTILES))}) or none, got {latency!r:.60}"
            )
        values = []
        for value in latency:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"wake_latency holds a value that is not seconds: {value!r:.40}")
            if not 0 <= value <= MAX_COST:
                raise ValueError(
                    f"wake_latency holds {value!r:.40}, not seconds in [0, {MAX_COST:g}]"
                )
            values.append(float(value))
        if values != sorted(values):
            raise ValueError(f"wake_latency's quantiles must not decrease, got {latency!r:.80}")
        object.__setattr__(self, "wake_latency", tuple(values))

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
        values = self.wake_latency
        if not values:
            return 0.0
        points = LATENCY_QUANTILES
        i = min(bisect.bisect_right(points, u), len(points) - 1)
        lo, hi = points[i - 1], points[i]
        share = (u - lo) / (hi - lo) if hi > lo else 0.0
        return values[i - 1] + share * (values[i] - values[i - 1])

    @property
    def zero(self) -> bool:
        """Whether every event costs nothing (the replay is then exactly the plain one)."""
        return all(getattr(self, kind) == 0 for kind in COST_KINDS)

    def to_json(self) -> dict[str, Any]:
        """The file's content: version, where it was measured, the costs in seconds."""
        data = asdict(self)
        return {
            "version": PROFILE_VERSION,
            "loop": data.pop("loop"),
            "python": data.pop("python"),
            "machine": data.pop("machine"),
            "wake_resolution": data.pop("wake_resolution"),
            "wake_latency": list(data.pop("wake_latency")),
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
        measured = ""
        if self.rounds:
            noisy = ", ".join(
                f"{kind} {getattr(self, kind) * 1e6:.2f} (IQR {self.spread[kind] * 1e6:.2f})"
                for kind in self.noisy()
            )
            measured = f"; medians of {self.rounds} rounds" + (
                f", noisy (spread over {NOISY_SHARE:.0%} of the cost, us): {noisy}" if noisy else ""
            )
        return (
            f"{self.loop} loop, {self.machine or 'unknown machine'}; costs (us): {costs}; "
            f"wake resolution {self.wake_resolution * 1e3:g} ms{latency}{measured}"
        )


def profile_from_json(data: Any, where: str) -> CostProfile:
    """Check a decoded profile file whole; `where` names it in the one-line errors."""
    if not isinstance(data, dict):
        raise ValueError(f"cost profile {where}: expected a JSON object, got {data!r:.60}")
    version = data.get("version")
    if version != PROFILE_VERSION:
        raise ValueError(
            f"cost profile {where}: version {version!r:.40}, expected {PROFILE_VERSION} "
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
    missing = [kind for kind in COST_KINDS if kind not in costs and kind != "application"]
    if missing:
        raise ValueError(f"cost profile {where}: missing cost {missing[0]!r}")
    meta: dict[str, Any] = {
        "wake_resolution": data.get("wake_resolution", 0.0),
        "wake_latency": data.get("wake_latency", []),
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
