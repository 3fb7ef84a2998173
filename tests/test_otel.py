"""`purgatory.otel`: the instruments read through the OpenTelemetry SDK's in-memory reader.

The SDK collects on the thread that asks (its periodic reader has a thread of its own), so each
test collects both from the event loop's thread and from another one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from helpers import FlagOperation, import_error
from metrics_support import scene
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
    Sum,
)

from purgatory import DelayedOperationPurgatory, HistogramBuckets, otel
from purgatory._metrics import FIELDS
from purgatory.otel import ATTRIBUTE, OUTCOME, PurgatoryInstruments
from purgatory.testing import ManualClock

#: Every exporter test fails on an error logged beside its figures (conftest.py).
pytestmark = pytest.mark.usefixtures("no_errors_logged")

Points = dict[str, tuple[Any, str | None, dict[str, float]]]
"""instrument name -> (its data, unit, {purgatory: value})"""


def read(reader: InMemoryMetricReader) -> Points:
    data = reader.get_metrics_data()
    assert data is not None
    points: Points = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                values = {
                    str(point.attributes[ATTRIBUTE]): point.value
                    for point in metric.data.data_points
                    if isinstance(point, NumberDataPoint) and point.attributes is not None
                }
                points[metric.name] = (metric.data, metric.unit, values)
    return points


@pytest.mark.asyncio
async def test_each_purgatory_is_observed_from_the_loop_and_from_another_thread() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    s = scene()
    instruments = PurgatoryInstruments(provider.get_meter("test"), [s.produce])
    instruments.add(s.fetch)
    produce, fetch = s.produce.statistics(), s.fetch.statistics()
    try:
        for points in (read(reader), await asyncio.to_thread(read, reader)):
            assert set(points) == {f"purgatory.{field.metric}" for field in FIELDS}
            for field in FIELDS:
                data, unit, values = points[f"purgatory.{field.metric}"]
                assert unit == field.unit
                if field.kind == "gauge":
                    assert isinstance(data, Gauge)
                else:  # counters are monotonic sums; the counts add up over purgatories
                    assert isinstance(data, Sum)
                    assert data.is_monotonic == (field.kind == "counter")
                want = {"produce": getattr(produce, field.attribute)}
                if field.attribute != "next_deadline_in":  # nothing timed: no point
                    want["fetch"] = getattr(fetch, field.attribute)
                assert values == want, field.metric
            assert points["purgatory.delayed"][2] == {"produce": 1, "fetch": 0}
            assert points["purgatory.watched"][2] == {"produce": 3, "fetch": 0}
            assert points["purgatory.expired"][2] == {"produce": 1, "fetch": 0}
        await s.fetch.shutdown()  # dropped, as Kafka's shutdown removes its gauges
        assert read(reader)["purgatory.delayed"][2] == {"produce": 1}
    finally:
        provider.shutdown()


def test_without_the_opentelemetry_api_the_import_says_what_to_install() -> None:
    assert import_error("purgatory.otel", without="opentelemetry") == (
        "purgatory.otel needs the OpenTelemetry API: pip install 'asyncio-purgatory[otel]'\n"
    )


def test_histograms_are_recorded_at_each_collection() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("hist", clock=clock, tick=0.01)
    buckets = HistogramBuckets(parked=(0.1, 1.0), lateness=(0.005, 0.05))
    try:
        PurgatoryInstruments(provider.get_meter("test"), [p], histograms=buckets)
        ops = [FlagOperation(timeout, str(i)) for i, timeout in enumerate((0.5, 0.503, 5.0))]
        for op in ops:
            p.try_complete_else_watch(op, ["k"])
        clock.advance(0.05)
        clock.advance(0.45)  # 0 expires at 0.5, on time
        clock.advance(0.01)  # 1 at 0.51, 7 ms late (its deadline rounded up to the tick)
        ops[2].ready = True
        assert p.check_and_complete("k") == 1  # parked 0.51 s
        clock.advance(0.0)
        points = histogram_points(reader)
        expired = points["purgatory.parked", "expired"]
        assert (expired.count, list(expired.bucket_counts)) == (2, [0, 2, 0])
        assert expired.sum == pytest.approx(1.01)
        assert list(expired.explicit_bounds) == [0.1, 1.0]
        assert points["purgatory.parked", "completed"].sum == pytest.approx(0.51)
        late = points["purgatory.expiry_lateness", None]
        assert (late.count, list(late.bucket_counts)) == (2, [1, 1, 0])
        assert late.sum == pytest.approx(0.007)
        assert histogram_points(reader)["purgatory.parked", "expired"].count == 2  # cumulative
    finally:
        provider.shutdown()


def histogram_points(reader: InMemoryMetricReader) -> dict[tuple[str, str | None], Any]:
    data = reader.get_metrics_data()
    assert data is not None
    points = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if isinstance(metric.data, Histogram):
                    for point in metric.data.data_points:
                        assert isinstance(point, HistogramDataPoint)
                        assert point.attributes is not None
                        assert point.attributes[ATTRIBUTE] == "hist"
                        outcome = point.attributes.get(OUTCOME)
                        points[metric.name, None if outcome is None else str(outcome)] = point
    return points


def test_histograms_need_an_api_that_takes_bucket_bounds() -> None:
    class OldMeter:
        """A meter of opentelemetry-api < 1.30: no bucket advice."""

        def create_histogram(self, name: str, unit: str = "", description: str = "") -> None:
            raise AssertionError("not reached")

    with pytest.raises(TypeError, match=r"needs opentelemetry-api >= 1\.30"):
        PurgatoryInstruments(OldMeter(), histograms=HistogramBuckets())  # type: ignore[arg-type]


class SpyMeter:
    """A real meter whose histograms also note each value recorded, and on which thread."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.recorded: list[tuple[str, float, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.meter, name)

    def create_histogram(
        self,
        name: str,
        unit: str = "",
        description: str = "",
        *,
        explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
    ) -> Any:
        histogram = self.meter.create_histogram(
            name,
            unit,
            description,
            explicit_bucket_boundaries_advisory=explicit_bucket_boundaries_advisory,
        )
        recorded = self.recorded

        class Spy:
            def record(self, value: float, attributes: Any = None, context: Any = None) -> None:
                recorded.append((name, value, threading.get_ident()))
                histogram.record(value, attributes, context)

        return Spy()


def test_values_past_the_cap_are_recorded_at_once_and_counted_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(otel, "HELD_VALUES", 4)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = SpyMeter(provider.get_meter("test"))
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("hist", clock=clock, tick=0.01)
    buckets = HistogramBuckets(parked=(0.1, 1.0), lateness=(0.005, 0.05))
    try:
        instruments = PurgatoryInstruments(meter, [p], histograms=buckets)  # type: ignore[arg-type]
        recorder = instruments._recorders["hist"]
        for timeout in (0.5, 0.5, 1.0):
            p.try_complete_else_watch(FlagOperation(timeout), ["k"])
        clock.advance(0.5)  # two expire: 2 times parked + 2 lateness, the cap: all held
        assert (recorder.held, meter.recorded) == (4, [])
        clock.advance(0.5)  # one more: 6 would be held, so all 6 are recorded now, here
        assert recorder.held == 0
        names = sorted(name for name, _, _ in meter.recorded)
        assert names == 3 * ["purgatory.expiry_lateness"] + 3 * ["purgatory.parked"]
        assert {thread for _, _, thread in meter.recorded} == {threading.get_ident()}
        points = histogram_points(reader)  # a collection adds nothing twice
        assert points["purgatory.parked", "expired"].count == 3
        assert points["purgatory.parked", "expired"].sum == pytest.approx(2.0)
        assert points["purgatory.expiry_lateness", None].count == 3
        assert len(meter.recorded) == 6
    finally:
        provider.shutdown()
