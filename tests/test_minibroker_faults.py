"""Faults on real follower processes: SIGSTOP/SIGCONT and SIGKILL + restart.

What Kafka documents, checked on the wire (a raw client sees the exact error codes) and with a
real client (aiokafka): with a follower frozen, acks=all waits until the follower leaves the ISR;
with the ISR below ``min.insync.replicas``, a waiting produce is answered
``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` and a new one refused with ``NOT_ENOUGH_REPLICAS``; a short
``timeout_ms`` gives ``REQUEST_TIMED_OUT``; after recovery every acknowledged record is read back
at its offset.
"""

from __future__ import annotations

import asyncio

from minibroker_support import (
    RawClient,
    batch,
    fetch,
    isr_sizes,
    produce,
    produce_errors,
    produce_offsets,
    run,
    wait_until,
)

from examples.minibroker.cluster import Cluster, ClusterConfig
from examples.minibroker.protocol import Errors

TOPIC = "demo"
CONFIG = ClusterConfig(min_insync_replicas=2, replica_lag_time_max_ms=1000)


async def read_back(client: RawClient, acked: dict[tuple[int, int], bytes]) -> None:
    """Every acknowledged (partition, offset) holds its value, as a consumer reads it."""
    from kafka.record.memory_records import MemoryRecords

    for (partition, offset), value in acked.items():
        response = await fetch(client, {(TOPIC, partition): offset}, max_wait_ms=0)
        (data,) = response.responses[0].partitions
        assert data.error_code == Errors.NONE
        found = {
            record.offset: record.value
            for batch_ in MemoryRecords(bytes(data.records))
            for record in batch_
        }
        assert found[offset] == value


def test_frozen_followers_shrink_the_isr_and_acks_all_answers_as_kafka_documents() -> None:
    async def main() -> None:
        async with Cluster(CONFIG) as cluster:
            client = await RawClient.connect(cluster.port)
            acked: dict[tuple[int, int], bytes] = {}
            response = await produce(client, TOPIC, 0, batch(b"before"))
            assert produce_errors(response) == [Errors.NONE]
            acked[(0, produce_offsets(response)[0])] = b"before"

            # One follower frozen: the ack waits for it to leave the ISR, then succeeds.
            cluster.pause(2)
            response = await produce(client, TOPIC, 0, batch(b"one frozen"), timeout_ms=20000)
            assert produce_errors(response) == [Errors.NONE]
            acked[(0, produce_offsets(response)[0])] = b"one frozen"
            assert (await cluster.stats())["partitions"]["demo-0"]["isr"] == [0, 1]

            # A timeout shorter than the lag time: REQUEST_TIMED_OUT (the record stays appended).
            cluster.pause(1)
            response = await produce(client, TOPIC, 1, batch(b"short"), timeout_ms=100)
            assert produce_errors(response) == [Errors.REQUEST_TIMED_OUT]

            # Both frozen: the waiting produce sees the ISR fall below min.insync.replicas.
            response = await produce(client, TOPIC, 0, batch(b"after append"), timeout_ms=20000)
            assert produce_errors(response) == [Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND]
            # ... and the next one is refused at once, nothing appended.
            end_before = (await cluster.stats())["partitions"]["demo-0"]["log_end_offset"]
            response = await produce(client, TOPIC, 0, batch(b"refused"), timeout_ms=20000)
            assert produce_errors(response) == [Errors.NOT_ENOUGH_REPLICAS]
            stats = await cluster.stats()
            assert stats["partitions"]["demo-0"]["log_end_offset"] == end_before
            assert stats["partitions"]["demo-0"]["isr"] == [0]

            # Resume: both followers catch up and rejoin; acks=all works again.
            cluster.resume(1, 2)

            async def isr_full() -> bool:
                return await isr_sizes(cluster) == [3, 3, 3, 3]

            await wait_until(isr_full)
            response = await produce(client, TOPIC, 0, batch(b"after"), timeout_ms=20000)
            assert produce_errors(response) == [Errors.NONE]
            acked[(0, produce_offsets(response)[0])] = b"after"
            await read_back(client, acked)
            changes = (await cluster.stats())["isr_changes"]
            assert sum("left" in c for c in changes) >= 2
            assert sum("rejoined" in c for c in changes) >= 2
            await client.close()

    run(main)


def test_a_killed_follower_restarts_empty_catches_up_and_nothing_acknowledged_is_lost() -> None:
    async def main() -> None:
        from aiokafka import AIOKafkaProducer

        async with Cluster(CONFIG) as cluster:
            producer = AIOKafkaProducer(
                bootstrap_servers=cluster.bootstrap, acks="all", request_timeout_ms=15000
            )
            await producer.start()
            acked: dict[tuple[int, int], bytes] = {}

            async def send(tag: str, count: int) -> None:
                values = [f"{tag}-{i}".encode() for i in range(count)]
                futures = [
                    await producer.send(TOPIC, v, partition=i % 4) for i, v in enumerate(values)
                ]
                for value, meta in zip(values, await asyncio.gather(*futures), strict=True):
                    acked[(meta.partition, meta.offset)] = value

            try:
                await send("before", 40)
                await cluster.kill(2)
                await send("killed", 40)  # acknowledged once follower 2 left the ISR
                assert (await cluster.stats())["partitions"]["demo-0"]["isr"] == [0, 1]
                await cluster.start_follower(2)  # an empty log: it fetches from offset 0

                async def rejoined() -> bool:
                    return await isr_sizes(cluster) == [3, 3, 3, 3]

                await wait_until(rejoined)
                # Now the other one dies: the restarted follower is what keeps acks=all going.
                await cluster.kill(1)
                await send("after", 40)
                stats = await cluster.stats()
                assert all(p["isr"] == [0, 2] for p in stats["partitions"].values())
            finally:
                await producer.stop()
            assert len(acked) == 120
            client = await RawClient.connect(cluster.port)
            await read_back(client, acked)
            await client.close()

    run(main)
