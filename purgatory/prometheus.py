"""Export purgatories' figures to Prometheus: a collector for ``prometheus_client``.

`PurgatoryCollector` reads each purgatory's `statistics()
<purgatory.DelayedOperationPurgatory.statistics>` when Prometheus scrapes, so the purgatory's
hot path pays nothing for it::

    from prometheus_client import REGISTRY, start_http_server
    from purgatory.prometheus import PurgatoryCollector

    async def main() -> None:
        produce = DelayedOperationPurgatory[DelayedProduce]("produce")
        REGISTRY.register(PurgatoryCollector([produce]))   # on the loop that drives it
        start_http_server(9464, addr="127.0.0.1")          # /metrics, on threads of its own

A scrape then shows, per purgatory (label ``purgatory``, its name), the gauges
``purgatory_delayed`` (operations parked now: Kafka's ``NumDelayedOperations``),
``purgatory_watched`` (watcher-list entries, finished ones not purged yet included: Kafka's
``PurgatorySize``), ``purgatory_keys`` and ``purgatory_next_deadline_seconds``, and the counters
``purgatory_completed_total``, ``purgatory_expired_total``, ``purgatory_drained_total``,
``purgatory_cancelled_total``, ``purgatory_purged_total``, ``purgatory_timer_passes_total`` and
``purgatory_purges_total``.

Given ``histograms=HistogramBuckets()`` (opt-in, with bounds of your own if need be), it also
exports the histograms ``purgatory_parked_seconds`` (labels ``purgatory`` and ``outcome``: how
long operations stayed parked, as an HTTP library's request-duration histogram) and
``purgatory_expiry_lateness_seconds`` (how late expiries came)::

    from purgatory import HistogramBuckets
    from purgatory.prometheus import PurgatoryCollector

    REGISTRY.register(PurgatoryCollector([produce], histograms=HistogramBuckets()))

Needs the ``prometheus`` extra (``pip install 'asyncio-purgatory[prometheus]'``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
    from prometheus_client.utils import floatToGoString
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "purgatory.prometheus needs prometheus_client: pip install 'asyncio-purgatory[prometheus]'"
    ) from exc

from ._histograms import ByName, HistogramBuckets
from ._metrics import DEFAULT_TIMEOUT, FIELDS, Field, Tracked
from ._purgatory import DelayedOperationPurgatory

__all__ = ("LABEL", "OUTCOME", "PurgatoryCollector")

LABEL = "purgatory"
"""The label that tells purgatories apart: each one's `name
<purgatory.DelayedOperationPurgatory.name>`."""

OUTCOME = "outcome"
"""The label of the time-parked histogram that tells outcomes apart: ``completed``,
``expired``, ``drained`` or ``cancelled``."""


class PurgatoryCollector(Collector):
    """A ``prometheus_client`` collector of purgatories' gauges and counters.

    Register it once (``REGISTRY.register(collector)``, or with a registry of your own), and
    `add` purgatories to it, from the event loop that drives them. A scrape reads each one on
    the thread that serves it (prometheus_client's ``start_http_server`` answers on threads of
    its own) without waiting for the loop, so it answers at once however busy the loop is.

    The collector holds its purgatories weakly: exporting one never keeps it alive. A
    purgatory that is shut down is dropped from later scrapes, as Kafka's ``shutdown`` removes
    its gauges: its series end, and a new purgatory may take its name, its counters going on
    from where the last one's were (a counter never goes back).

    Args:
        purgatories: Purgatories to export now (more with `add`).
        timeout: Seconds a scrape waits for a purgatory's event loop, the rare time it must read
            there (a read on the scraping thread that keeps failing), before it fails with
            `TimeoutError` (a blocked loop).
        histograms: `purgatory.HistogramBuckets` to also export two histograms,
            ``purgatory_parked_seconds``
            (the time operations stayed parked, by outcome) and
            ``purgatory_expiry_lateness_seconds`` (how late expiries came); ``None``, the
            default, exports none and costs the purgatories nothing. Each purgatory added is
            then counted from that moment, fed by its event sink's batches (no call per
            operation), within about a second on the event loop.

    Raises:
        ValueError: As `add`, or `timeout` is not positive.
    """

    def __init__(
        self,
        purgatories: Iterable[DelayedOperationPurgatory[Any]] = (),
        *,
        timeout: float = DEFAULT_TIMEOUT,
        histograms: HistogramBuckets | None = None,
    ) -> None:
        self._tracked = Tracked(timeout)
        self._histograms = None if histograms is None else ByName(histograms)
        for purgatory in purgatories:
            self.add(purgatory)

    def add(self, purgatory: DelayedOperationPurgatory[Any]) -> None:
        """Export `purgatory` too; call it on the event loop that drives it, if any.

        Args:
            purgatory: The purgatory to export (and, with histograms, to count from now on).

        Raises:
            TypeError: Not a `DelayedOperationPurgatory`.
            ValueError: It is shut down, already exported here, or another purgatory exported
                here has its name (Prometheus could not tell their samples apart).
        """
        self._tracked.add(purgatory)
        if self._histograms is not None:
            self._histograms.tap(purgatory)

    def describe(self) -> Iterable[Metric]:
        """The metric families, without samples: registering reads no purgatory."""
        families: list[Metric] = [_family(field) for field in FIELDS]
        if self._histograms is not None:
            families.extend(_histogram_families())
        return families

    def collect(self) -> Iterable[Metric]:
        """Every exported purgatory's figures, read now (on the scraping thread)."""
        figures = [_family(field) for field in FIELDS]
        snapshot = self._tracked.snapshot()
        for name, stats in snapshot:
            for family, field in zip(figures, FIELDS, strict=True):
                family.add_metric([name], float(getattr(stats, field.attribute)))
        families: list[Metric] = list(figures)
        if self._histograms is not None:
            parked, lateness = _histogram_families()
            for name, _ in snapshot:
                histograms = self._histograms.get(name)
                if histograms is None:
                    continue
                by_outcome, late = histograms.snapshot()
                bounds = self._histograms.buckets
                for outcome, (counts, total) in by_outcome.items():
                    parked.add_metric([name, outcome], _buckets(bounds.parked, counts), total)
                lateness.add_metric([name], _buckets(bounds.lateness, late[0]), late[1])
            families += (parked, lateness)
        return families


def _histogram_families() -> tuple[HistogramMetricFamily, HistogramMetricFamily]:
    return (
        HistogramMetricFamily(
            "purgatory_parked_seconds",
            "Seconds operations stayed parked, from their watch to their outcome, by outcome "
            "(counted from the histograms' start).",
            labels=[LABEL, OUTCOME],
        ),
        HistogramMetricFamily(
            "purgatory_expiry_lateness_seconds",
            "Seconds expired operations expired after their deadline (the tick's rounding "
            "and the timer pass's delay).",
            labels=[LABEL],
        ),
    )


def _buckets(bounds: Sequence[float], cumulative: list[int]) -> list[tuple[str, float]]:
    """Prometheus's ``le`` buckets: each bound with the count at or below it, then ``+Inf``."""
    labels = [*map(floatToGoString, bounds), "+Inf"]
    return list(zip(labels, map(float, cumulative), strict=True))


def _family(field: Field) -> GaugeMetricFamily | CounterMetricFamily:
    name = f"purgatory_{field.metric}" + ("_seconds" if field.unit == "s" else "")
    if field.kind == "counter":
        return CounterMetricFamily(name, field.description, labels=[LABEL])
    return GaugeMetricFamily(name, field.description, labels=[LABEL])
