"""`purgatory.otel`: the instruments read through the OpenTelemetry SDK's in-memory reader.

The SDK collects on the thread that asks (its periodic reader has a thread of its own), so each
test collects both from the event loop's thread and from another one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import import_error
from metrics_support import scene
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, NumberDataPoint, Sum

from purgatory._metrics import FIELDS
from purgatory.otel import ATTRIBUTE, PurgatoryInstruments

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
