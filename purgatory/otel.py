"""Export purgatories' figures to OpenTelemetry: observable instruments on the OTel API.

`PurgatoryInstruments` creates asynchronous (observable) instruments on a meter; their callbacks
read each purgatory's `statistics() <purgatory.DelayedOperationPurgatory.statistics>` when the
SDK collects, so the purgatory's hot path pays nothing for it::

    from opentelemetry import metrics
    from purgatory.otel import PurgatoryInstruments

    async def main() -> None:
        produce = DelayedOperationPurgatory[DelayedProduce]("produce")
        meter = metrics.get_meter("my.service")
        PurgatoryInstruments(meter, [produce])      # on the loop that drives it

Only the API is needed here; the application picks the SDK, its readers and exporters. Each
purgatory is told apart by the attribute ``purgatory.name``. The instruments:
``purgatory.delayed`` (operations parked now: Kafka's ``NumDelayedOperations``),
``purgatory.watched`` (watcher-list entries, finished ones not purged yet included: Kafka's
``PurgatorySize``) and ``purgatory.keys`` are up-down counters (their sum over purgatories
means something); ``purgatory.next_deadline`` (seconds) is a gauge, with no point while nothing
is timed; ``purgatory.completed``, ``purgatory.expired``, ``purgatory.drained``,
``purgatory.cancelled``, ``purgatory.purged``, ``purgatory.timer_passes`` and
``purgatory.purges`` are counters.

Given ``histograms=HistogramBuckets()`` (opt-in, with bounds of your own if need be), it also
records two histograms: ``purgatory.parked`` (seconds operations stayed parked, with the attribute
``purgatory.outcome``) and ``purgatory.expiry_lateness`` (seconds expiries came after their
deadline). The purgatory hands its operations over in its event sink's batches; the OpenTelemetry
API takes one value per ``record`` call, so the values are held (at most `HELD_VALUES` per
purgatory) and recorded on the SDK's thread when it collects, not on the event loop.

Needs the ``otel`` extra (``pip install 'asyncio-purgatory[otel]'``).
"""

from __future__ import annotations

import inspect
import math
import threading
from array import array
from collections.abc import Callable, Iterable
from typing import Any, Final, final

try:
    from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "purgatory.otel needs the OpenTelemetry API: pip install 'asyncio-purgatory[otel]'"
    ) from exc

from ._histograms import PARKED_OUTCOMES, HistogramBuckets, Tap, _Values
from ._metrics import DEFAULT_TIMEOUT, FIELDS, Field, Tracked
from ._purgatory import DelayedOperationPurgatory

__all__ = ("ATTRIBUTE", "OUTCOME", "PurgatoryInstruments")

ATTRIBUTE = "purgatory.name"
"""The attribute that tells purgatories apart: each one's `name
<purgatory.DelayedOperationPurgatory.name>`."""

OUTCOME = "purgatory.outcome"
"""The attribute of the time-parked histogram's points that tells outcomes apart:
``completed``, ``expired``, ``drained`` or ``cancelled``."""

_Callback = Callable[[CallbackOptions], Iterable[Observation]]


class PurgatoryInstruments:
    """Observable instruments on `meter` that report purgatories' gauges and counters.

    Create one per meter (the instruments' names are fixed), and `add` purgatories to it from
    the event loop that drives them. The SDK collects on a thread of its own (its periodic
    reader), which reads each purgatory without waiting for its loop: a collection answers at
    once however busy the loop is.

    Purgatories are held weakly: exporting one never keeps it alive. A purgatory that is shut
    down is dropped from later collections, as Kafka's ``shutdown`` removes its gauges, and a
    new purgatory may take its name, its counters going on from where the last one's were (a
    cumulative counter never goes back).

    Args:
        meter: The meter to create the instruments on.
        purgatories: Purgatories to export now (more with `add`).
        timeout: Seconds a collection waits for a purgatory's event loop, the rare time it must
            read there (a read on the collecting thread that keeps failing; at most the
            collection's own timeout); past it the callback fails, which the SDK reports.
        histograms: `purgatory.HistogramBuckets` to also record the histograms
            ``purgatory.parked`` and
            ``purgatory.expiry_lateness`` (their bucket bounds given to the SDK as advice,
            which needs opentelemetry-api 1.30 or later, and an SDK of 1.31 or later for its
            OTLP exporter to honour them); ``None``, the default, records none and costs the
            purgatories nothing.

    Raises:
        ValueError: As `add`, or `timeout` is not positive.
        TypeError: `histograms` is not a `purgatory.HistogramBuckets`, or the API is too old
            to take bucket bounds.
    """

    def __init__(
        self,
        meter: Meter,
        purgatories: Iterable[DelayedOperationPurgatory[Any]] = (),
        *,
        timeout: float = DEFAULT_TIMEOUT,
        histograms: HistogramBuckets | None = None,
    ) -> None:
        if histograms is not None and not isinstance(histograms, HistogramBuckets):
            raise TypeError(
                f"histograms must be a purgatory.HistogramBuckets (or None), got {histograms!r}"
            )
        self._tracked = Tracked(timeout)
        self._recorders: dict[str, _Recorder] = {}
        self._instruments: tuple[Histogram, Histogram] | None = None
        if histograms is not None:
            _check_advice(meter)
            self._instruments = (
                meter.create_histogram(
                    "purgatory.parked",
                    "s",
                    "Seconds operations stayed parked, from their watch to their outcome.",
                    explicit_bucket_boundaries_advisory=list(histograms.parked),
                ),
                meter.create_histogram(
                    "purgatory.expiry_lateness",
                    "s",
                    "Seconds expired operations expired after their deadline.",
                    explicit_bucket_boundaries_advisory=list(histograms.lateness),
                ),
            )
        for index, field in enumerate(FIELDS):
            observer = self._observer(field, replay=index == 0)
            name, callbacks = f"purgatory.{field.metric}", [observer]
            unit, description = field.unit, field.description
            if field.kind == "counter":
                meter.create_observable_counter(name, callbacks, unit, description)
            elif field.kind == "count":
                meter.create_observable_up_down_counter(name, callbacks, unit, description)
            else:
                meter.create_observable_gauge(name, callbacks, unit, description)
        for purgatory in purgatories:
            self.add(purgatory)

    def add(self, purgatory: DelayedOperationPurgatory[Any]) -> None:
        """Export `purgatory` too; call it on the event loop that drives it, if any.

        Args:
            purgatory: The purgatory to export (and, with histograms, to record from now on).

        Raises:
            TypeError: Not a `DelayedOperationPurgatory`.
            ValueError: It is shut down, already exported here, or another purgatory exported
                here has its name (their points could not be told apart).
        """
        self._tracked.add(purgatory)
        if self._instruments is not None:
            recorder = self._recorders.get(purgatory.name)
            if recorder is None:
                recorder = self._recorders[purgatory.name] = _Recorder(
                    purgatory.name, *self._instruments
                )
            purgatory._tap(Tap([recorder.add]))

    def _observer(self, field: Field, replay: bool) -> _Callback:
        tracked, attribute, recorders = self._tracked, field.attribute, self._recorders

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            if replay:  # once per collection, before the SDK reads its histograms
                for recorder in list(recorders.values()):
                    recorder.record()
            snapshot = tracked.snapshot(options.timeout_millis / 1000)
            observations = []
            for name, stats in snapshot:
                value = getattr(stats, attribute)
                if math.isfinite(value):  # no deadline: no point (OTel has no infinity)
                    observations.append(Observation(value, {ATTRIBUTE: name}))
            return observations

        return observe


def _check_advice(meter: Meter) -> None:
    """Refuse histograms where the API cannot be told their buckets (before 1.30)."""
    if (
        "explicit_bucket_boundaries_advisory"
        not in inspect.signature(meter.create_histogram).parameters
    ):
        raise TypeError(
            "histograms= needs opentelemetry-api >= 1.30 (the instruments take their bucket "
            "bounds as advice from then on): pip install -U opentelemetry-api opentelemetry-sdk"
        )


#: Values one purgatory name holds between two collections; past it, the ones that come are
#: recorded at once, on the loop's thread (a collection that comes rarely, under heavy load).
HELD_VALUES: Final = 2**16


@final
class _Recorder:
    """One purgatory name's histogram values: buffered by its taps on the loop's thread, and
    recorded on the SDK's at each collection (the API takes one value per call, and the SDK
    spends microseconds on each: better there than on the loop)."""

    __slots__ = ("_held", "_lateness", "_lock", "_parked", "attributes", "instruments", "name")

    def __init__(self, name: str, parked: Histogram, lateness: Histogram) -> None:
        self.name = name
        self.instruments = (parked, lateness)
        self._lock = threading.Lock()
        self._parked: dict[str, array[float]] = {}
        self._lateness: array[float] = array("d")
        self._held = 0
        #: The attributes of each outcome's points, and of the lateness's.
        self.attributes = {
            outcome: {ATTRIBUTE: name, OUTCOME: outcome} for outcome in PARKED_OUTCOMES
        }

    def add(self, values: _Values) -> None:
        """A tap's batch (on the loop's thread): held, or recorded at once if that would hold
        more than `HELD_VALUES` (a collection that comes rarely must not let memory grow)."""
        count = len(values.lateness)
        with self._lock:
            for outcome, times in values.by_outcome():
                held = self._parked.get(outcome)
                if held is None:
                    held = self._parked[outcome] = array("d")
                held.extend(times)
                count += len(times)
            self._lateness.extend(values.lateness)
            self._held += count
            full = self._held > HELD_VALUES
        if full:
            self.record()

    @property
    def held(self) -> int:
        """How many values wait for the next collection (at most `HELD_VALUES` between batches)."""
        with self._lock:
            return self._held

    def record(self) -> None:
        """Record everything held (at a collection, on the SDK's thread)."""
        with self._lock:
            parked, self._parked = self._parked, {}
            lateness, self._lateness = self._lateness, array("d")
            self._held = 0
        histogram, late = self.instruments
        for outcome, times in parked.items():
            attributes = self.attributes.get(outcome) or {ATTRIBUTE: self.name, OUTCOME: outcome}
            for value in times:
                histogram.record(value, attributes)
        attributes = {ATTRIBUTE: self.name}
        for value in lateness:
            late.record(value, attributes)
