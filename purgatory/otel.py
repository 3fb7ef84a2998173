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

Needs the ``otel`` extra (``pip install 'asyncio-purgatory[otel]'``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

try:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "purgatory.otel needs the OpenTelemetry API: pip install 'asyncio-purgatory[otel]'"
    ) from exc

from ._metrics import DEFAULT_TIMEOUT, FIELDS, Field, Tracked
from ._purgatory import DelayedOperationPurgatory

__all__ = ("ATTRIBUTE", "PurgatoryInstruments")

ATTRIBUTE = "purgatory.name"
"""The attribute that tells purgatories apart: each one's `name
<purgatory.DelayedOperationPurgatory.name>`."""

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

    Raises:
        ValueError: As `add`, or `timeout` is not positive.
    """

    def __init__(
        self,
        meter: Meter,
        purgatories: Iterable[DelayedOperationPurgatory[Any]] = (),
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._tracked = Tracked(timeout)
        for field in FIELDS:
            name, callbacks = f"purgatory.{field.metric}", [self._observer(field)]
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

        Raises:
            TypeError: Not a `DelayedOperationPurgatory`.
            ValueError: It is shut down, already exported here, or another purgatory exported
                here has its name (their points could not be told apart).
        """
        self._tracked.add(purgatory)

    def _observer(self, field: Field) -> _Callback:
        tracked, attribute = self._tracked, field.attribute

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            snapshot = tracked.snapshot(options.timeout_millis / 1000)
            observations = []
            for name, stats in snapshot:
                value = getattr(stats, attribute)
                if math.isfinite(value):  # no deadline: no point (OTel has no infinity)
                    observations.append(Observation(value, {ATTRIBUTE: name}))
            return observations

        return observe
