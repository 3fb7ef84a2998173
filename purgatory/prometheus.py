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

Needs the ``prometheus`` extra (``pip install 'asyncio-purgatory[prometheus]'``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "purgatory.prometheus needs prometheus_client: pip install 'asyncio-purgatory[prometheus]'"
    ) from exc

from ._metrics import DEFAULT_TIMEOUT, FIELDS, Field, Tracked
from ._purgatory import DelayedOperationPurgatory

__all__ = ("LABEL", "PurgatoryCollector")

LABEL = "purgatory"
"""The label that tells purgatories apart: each one's `name
<purgatory.DelayedOperationPurgatory.name>`."""


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

    Raises:
        ValueError: As `add`, or `timeout` is not positive.
    """

    def __init__(
        self,
        purgatories: Iterable[DelayedOperationPurgatory[Any]] = (),
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._tracked = Tracked(timeout)
        for purgatory in purgatories:
            self.add(purgatory)

    def add(self, purgatory: DelayedOperationPurgatory[Any]) -> None:
        """Export `purgatory` too; call it on the event loop that drives it, if any.

        Raises:
            TypeError: Not a `DelayedOperationPurgatory`.
            ValueError: It is shut down, already exported here, or another purgatory exported
                here has its name (Prometheus could not tell their samples apart).
        """
        self._tracked.add(purgatory)

    def describe(self) -> Iterable[Metric]:
        """The metric families, without samples: registering reads no purgatory."""
        return [_family(field) for field in FIELDS]

    def collect(self) -> Iterable[Metric]:
        """Every exported purgatory's figures, read now (each on its event loop)."""
        families = [_family(field) for field in FIELDS]
        for name, stats in self._tracked.snapshot():
            for family, field in zip(families, FIELDS, strict=True):
                family.add_metric([name], float(getattr(stats, field.attribute)))
        return families


def _family(field: Field) -> GaugeMetricFamily | CounterMetricFamily:
    name = f"purgatory_{field.metric}" + ("_seconds" if field.unit == "s" else "")
    if field.kind == "counter":
        return CounterMetricFamily(name, field.description, labels=[LABEL])
    return GaugeMetricFamily(name, field.description, labels=[LABEL])
