"""Histograms of how long operations stay parked, per outcome, and of how late expiries come.

Opt-in, for the metrics exporters (`purgatory.prometheus`, `purgatory.otel`): an exporter given
`HistogramBuckets` taps each purgatory it exports (``DelayedOperationPurgatory._tap``) and is
handed the purgatory's events in the batches its event sink already collects (the bulk path of
the event log, see ``purgatory._events``): the purgatory makes no call per operation for it,
and a purgatory that no exporter taps pays nothing at all. Per batch, a `Tap` pairs each end
with its watch (``op, keys, marks, watched_at`` and ``op, outcome, ended_at``, flat) in C-level
loops (slices, ``map`` over ``dict.pop``, ``operator.sub``; a batch of one outcome, the usual
one, in one pass), and hands the values to its targets: a `Histograms` of bucket counts
(Prometheus; counted by sorting the values and bisecting them once per bound, not once per
value), or the values themselves (OpenTelemetry, whose API takes one value per call).

- *Time parked*: ``ended_at - watched_at``, per outcome (``completed``, ``expired``,
  ``drained``, ``cancelled``; a refused watch never parked). An operation completed at its first
  try counts, with a time near zero: it is what a caller waited.
- *Expiry lateness*: ``ended_at - (watched_at + timeout)`` of each expired operation: the rounding
  of its deadline up to the tick plus how late the timer pass came.

Operations watched before the tap was made are not counted (their watch was not seen). The
counts are written on the event loop's thread and read by a scrape's under a lock, taken once
per batch on one side and once per scrape on the other.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, eq, sub
from typing import Any, Final, final

__all__ = (
    "DEFAULT_LATENESS",
    "DEFAULT_PARKED",
    "PARKED_OUTCOMES",
    "ByName",
    "HistogramBuckets",
    "Histograms",
    "Series",
    "Tap",
)

#: Upper bounds (seconds) of the time-parked buckets by default: a millisecond to a minute,
#: which covers requests answered at once and long-polls held to their timeout.
DEFAULT_PARKED: Final = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: Upper bounds (seconds) of the expiry-lateness buckets by default: from half a one-millisecond
#: tick (the rounding alone) to a second (a loop that stalls).
DEFAULT_LATENESS: Final = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
#: The outcomes whose time parked is counted (a refused watch never parked).
PARKED_OUTCOMES: Final = ("completed", "expired", "drained", "cancelled")

_timeout_of = attrgetter("_timeout")


def _bounds(name: str, values: Iterable[float]) -> tuple[float, ...]:
    bounds = tuple(values)
    if not bounds:
        raise ValueError(f"{name} must name at least one bucket bound")
    for bound in bounds:
        if isinstance(bound, bool) or not isinstance(bound, int | float):
            raise TypeError(f"{name} must be numbers of seconds, got {bound!r}")
        if not math.isfinite(bound):
            raise ValueError(
                f"{name} must be finite (+Inf is always the last bucket), got {bound!r}"
            )
    if any(b >= a for a, b in zip(bounds[1:], bounds, strict=False)):
        raise ValueError(f"{name} must be strictly increasing, got {bounds!r}")
    return tuple(map(float, bounds))


@final
@dataclass(frozen=True, slots=True)
class HistogramBuckets:
    """The bucket bounds of the two histograms an exporter adds when given this.

    Each bound is the upper bound (inclusive, Prometheus's ``le``) of a bucket, in seconds; a
    last bucket, ``+Inf``, holds the rest.

    Args:
        parked: Bounds of the time operations stay parked.
        lateness: Bounds of how late expired operations expire.

    Raises:
        ValueError: A list is empty, not strictly increasing, or holds NaN or an infinity.
        TypeError: A bound is not a number.
    """

    parked: Sequence[float] = DEFAULT_PARKED
    lateness: Sequence[float] = DEFAULT_LATENESS

    def __post_init__(self) -> None:
        object.__setattr__(self, "parked", _bounds("parked", self.parked))
        object.__setattr__(self, "lateness", _bounds("lateness", self.lateness))


@final
class Series:
    """One histogram: counts per bucket (the last is ``+Inf``) and the sum of the values."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def add(self, values: list[float]) -> None:
        """Count `values` (sorted here, in place): one bisection per bound, not per value."""
        values.sort()
        counts = self.counts
        below = 0
        for index, bound in enumerate(self.bounds):
            upto = bisect_right(values, bound)  # values <= bound: Prometheus's ``le``
            counts[index] += upto - below
            below = upto
        counts[-1] += len(values) - below
        self.total += sum(values)

    def cumulative(self) -> tuple[list[int], float]:
        """Counts at or below each bound (``+Inf`` last: the count of values), and the sum."""
        running, out = 0, []
        for n in self.counts:
            running += n
            out.append(running)
        return out, self.total


@final
@dataclass(slots=True)
class _Values:
    """What one batch adds: the times parked of each of its outcomes, and the lateness of its
    expiries."""

    runs: list[tuple[str, list[float]]]
    lateness: list[float] = field(default_factory=list)

    def by_outcome(self) -> list[tuple[str, list[float]]]:
        """The times parked, a list per outcome."""
        return self.runs


@final
class Histograms:
    """The histograms of the purgatories of one name, for one exporter: written by `Tap`s on
    the loop's thread, read by scrapes on theirs."""

    __slots__ = ("_lock", "lateness", "parked")

    def __init__(self, buckets: HistogramBuckets) -> None:
        self._lock = threading.Lock()
        #: Time parked, per outcome.
        self.parked = {outcome: Series(buckets.parked) for outcome in PARKED_OUTCOMES}
        #: Lateness of the expiries.
        self.lateness = Series(buckets.lateness)

    def add(self, values: _Values) -> None:
        """Count one batch's values."""
        with self._lock:
            parked = self.parked
            for outcome, times in values.runs:
                series = parked.get(outcome)
                if series is not None:
                    series.add(times)
            if values.lateness:
                self.lateness.add(values.lateness)

    def snapshot(self) -> tuple[dict[str, tuple[list[int], float]], tuple[list[int], float]]:
        """The cumulative counts and sums: time parked per outcome, and the lateness."""
        with self._lock:
            parked = {outcome: series.cumulative() for outcome, series in self.parked.items()}
            return parked, self.lateness.cumulative()


@final
class Tap:
    """One purgatory's events, paired and handed on: the watch time of each operation still
    open, and the targets each batch's values go to (called on the purgatory's loop)."""

    __slots__ = ("_started", "targets")

    def __init__(self, targets: Iterable[Callable[[_Values], None]]) -> None:
        # Each operation watched and not ended yet: its watch time.
        self._started: dict[Any, float] = {}
        #: Where each batch's values go.
        self.targets = list(targets)

    def __call__(self, watches: list[Any], ends: list[Any]) -> None:
        """Take one batch of the event sink (its flat lists, left as they are)."""
        started = self._started
        if watches:
            started.update(zip(watches[0::4], watches[3::4], strict=True))
        if not ends:
            return
        ops, outcomes, at = ends[0::3], ends[1::3], ends[2::3]
        begun: list[Any] = list(map(started.pop, ops, repeat(None)))
        if None in begun:  # watched before the tap: dropped
            kept = [i for i, when in enumerate(begun) if when is not None]
            ops, outcomes = [ops[i] for i in kept], [outcomes[i] for i in kept]
            at, begun = [at[i] for i in kept], [begun[i] for i in kept]
        parked = list(map(sub, at, begun))
        values = _Values([])
        kinds = set(outcomes)
        if len(kinds) == 1:  # the usual batch: a pass's expiries, or a burst of completions
            (kind,) = kinds
            values.runs.append((kind, parked))
            expired_ops: Iterable[Any] = ops
        else:
            for kind in kinds:
                chosen = list(map(eq, outcomes, repeat(kind)))
                values.runs.append((kind, list(compress(parked, chosen))))
                if kind == "expired":
                    expired_ops = compress(ops, chosen)
        for kind, times in values.runs:
            if kind == "expired":  # lateness = time parked - timeout
                values.lateness = list(map(sub, times, map(_timeout_of, expired_ops)))
        values.runs = [run for run in values.runs if run[0] != "refused"]  # never parked
        if values.runs:
            for target in self.targets:
                target(values)


@final
class ByName:
    """An exporter's histograms, one `Histograms` per purgatory name: a purgatory that takes the
    name of one that left goes on counting into the same buckets (a bucket count is a counter,
    and never goes back)."""

    __slots__ = ("_lock", "buckets", "histograms")

    def __init__(self, buckets: HistogramBuckets) -> None:
        if not isinstance(buckets, HistogramBuckets):
            raise TypeError(
                f"histograms must be a purgatory.HistogramBuckets (or None), got {buckets!r}"
            )
        self.buckets = buckets
        self._lock = threading.Lock()
        #: Per purgatory name.
        self.histograms: dict[str, Histograms] = {}

    def tap(self, purgatory: Any) -> None:
        """Count `purgatory`'s operations from now on (`purgatory._tap`, on its loop)."""
        with self._lock:
            histograms = self.histograms.get(purgatory.name)
            if histograms is None:
                histograms = self.histograms[purgatory.name] = Histograms(self.buckets)
        purgatory._tap(Tap([histograms.add]))

    def get(self, name: str) -> Histograms | None:
        with self._lock:
            return self.histograms.get(name)
