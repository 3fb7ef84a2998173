"""A bounded load on one leader: hundreds of acks=all producers and long-poll consumers.

Real processes (a leader and two followers), 400 producer connections and 120 long-polling
consumer connections, all at once. Every request must be answered exactly once, in order, on its
connection; every record acknowledged must be read; and once the load is over, the produce and
fetch purgatories must be empty (``watched()`` and ``num_delayed()`` at 0) while the follower
purgatory holds only the followers' own live fetches.
"""

from __future__ import annotations

import asyncio
import random

from kafka.record.memory_records import MemoryRecords
from minibroker_support import (
    RawClient,
    batch,
    fetch,
    produce,
    produce_errors,
    produce_offsets,
    run,
)

from examples.minibroker.cluster import Cluster, ClusterConfig
from examples.minibroker.protocol import Errors

TOPIC = "load"
PARTITIONS = 8
PRODUCERS = 400
REQUESTS_PER_PRODUCER = 4
CONSUMERS = 120


def test_hundreds_of_acks_all_producers_and_long_polls_all_answered_once_gauges_back_to_zero() -> (
    None
):
    async def main() -> None:
        config = ClusterConfig(
            topics={TOPIC: PARTITIONS}, min_insync_replicas=2, replica_lag_time_max_ms=30_000
        )
        async with Cluster(config) as cluster:
            rng = random.Random(10)
            acked: dict[tuple[int, int], bytes] = {}
            total = PRODUCERS * REQUESTS_PER_PRODUCER
            answered = 0

            async def producer(index: int, partitions: list[int]) -> None:
                nonlocal answered
                client = await RawClient.connect(cluster.port)
                try:
                    for number, partition in enumerate(partitions):
                        value = f"{index}-{number}".encode()
                        response = await produce(
                            client, TOPIC, partition, batch(value), timeout_ms=30000
                        )
                        assert produce_errors(response) == [Errors.NONE]
                        acked[(partition, produce_offsets(response)[0])] = value
                        answered += 1
                    assert not client.in_flight
                finally:
                    await client.close()

            async def consumer(partition: int, seen: dict[tuple[int, int], bytes]) -> None:
                client = await RawClient.connect(cluster.port)
                try:
                    offset = 0
                    # Long polls until the producers are done and this partition is read out.
                    while answered < total or any(p == partition and o >= offset for p, o in acked):
                        response = await fetch(
                            client, {(TOPIC, partition): offset}, max_wait_ms=500
                        )
                        (data,) = response.responses[0].partitions
                        assert data.error_code == Errors.NONE
                        for record_batch in MemoryRecords(bytes(data.records)):
                            for record in record_batch:
                                if record.offset >= offset:
                                    seen[(partition, record.offset)] = record.value
                                    offset = record.offset + 1
                    assert not client.in_flight
                finally:
                    await client.close()

            seen: dict[tuple[int, int], bytes] = {}
            plans = [
                [rng.randrange(PARTITIONS) for _ in range(REQUESTS_PER_PRODUCER)]
                for _ in range(PRODUCERS)
            ]
            await asyncio.gather(
                *(consumer(i % PARTITIONS, seen) for i in range(CONSUMERS)),
                *(producer(i, plan) for i, plan in enumerate(plans)),
            )
            assert answered == total
            assert len(acked) == total
            assert all(seen[key] == value for key, value in acked.items())

            stats = await cluster.stats()
            counters = stats["counters"]
            # Every request read was answered exactly once (the raw clients checked the order).
            assert counters["requests from client"] == counters["responses to client"]
            assert counters["produce partition error 0"] == total
            gauges = stats["purgatories"]
            for name in ("produce", "fetch"):
                assert gauges[name]["watched"] == 0, gauges
                assert gauges[name]["delayed"] == 0, gauges
            # The followers keep polling: at most one parked fetch each, on every partition.
            assert gauges["follower-fetch"]["delayed"] <= 2
            assert gauges["follower-fetch"]["watched"] <= 2 * PARTITIONS
            assert gauges["produce"]["completed"] > 0
            assert stats["peaks"]["produce.delayed"] > 0
            assert stats["peaks"]["fetch.delayed"] > 0

    run(main, timeout=120)
