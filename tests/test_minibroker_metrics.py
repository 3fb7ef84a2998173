"""A running leader's purgatories, read through OpenTelemetry while real clients use it.

The leader runs in the test's process (the ``serve`` tests scrape a leader process's ``/metrics``
over HTTP): a long-polling consumer parks in the fetch purgatory, and OpenTelemetry's in-memory
reader, collecting from another thread as the SDK's periodic reader does, sees it parked; an
``acks=all`` produce then wakes it, and the counters show both completions.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from minibroker_support import run, wait_until
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

from examples.minibroker.server import BrokerConfig, Leader
from purgatory.otel import ATTRIBUTE, PurgatoryInstruments

CONFIG = BrokerConfig(follower_ids=(), min_insync_replicas=1, topics={"t": 1})


def observe(reader: InMemoryMetricReader, instrument: str) -> dict[str, Any]:
    """The value of `instrument` per purgatory, collected now."""
    data = reader.get_metrics_data()
    assert data is not None
    return {
        str(point.attributes[ATTRIBUTE]): point.value
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == instrument
        for point in metric.data.data_points
        if isinstance(point, NumberDataPoint) and point.attributes is not None
    }


def test_an_otel_reading_of_a_running_leader_shows_a_parked_fetch_then_its_completion() -> None:
    async def main() -> None:
        leader = Leader(CONFIG)
        await leader.start()
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])
        PurgatoryInstruments(provider.get_meter("minibroker"), leader.stats.purgatories)
        bootstrap = f"127.0.0.1:{leader.port}"
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=20_000
        )
        await consumer.start()
        consumer.assign([TopicPartition("t", 0)])
        waiting = asyncio.create_task(consumer.getone())
        try:

            async def parked() -> bool:
                delayed = await asyncio.to_thread(observe, reader, "purgatory.delayed")
                return bool(delayed["fetch"] == 1)

            await wait_until(parked)
            delayed = await asyncio.to_thread(observe, reader, "purgatory.delayed")
            assert set(delayed) == {"produce", "fetch", "follower-fetch", "rebalance", "heartbeat"}
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
            await producer.start()
            try:
                await producer.send_and_wait("t", b"wake up", partition=0)
            finally:
                await producer.stop()
            assert (await asyncio.wait_for(waiting, 10)).value == b"wake up"
            completed = await asyncio.to_thread(observe, reader, "purgatory.completed")
            assert completed["produce"] >= 1  # the acks=all produce
            assert completed["fetch"] >= 1  # the long poll, woken by the data
        finally:
            if not waiting.done():
                waiting.cancel()
            await consumer.stop()
            provider.shutdown()
            await leader.stop()

    run(main, timeout=60)
