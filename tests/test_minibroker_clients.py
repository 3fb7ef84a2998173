"""The mini broker against real, unmodified Kafka clients: aiokafka and kafka-python.

Each test starts real processes (a leader and two followers) on free loopback ports, and drives
them with the clients users would use. Every test is bounded (`run`'s timeout, the clients' own
timeouts, subprocess waits).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.protocol.consumer import FetchResponse
from minibroker_support import (
    FETCH_VERSION,
    RawClient,
    batch,
    fetch_request,
    produce,
    produce_errors,
    run,
)
from prometheus_client.parser import text_string_to_metric_families

from examples.minibroker.cluster import REPO_ROOT, Cluster, ClusterConfig
from examples.minibroker.protocol import Errors

TOPIC = "demo"
PARTITIONS = 4
# Kafka's default lag time: on a loaded machine a follower may be slow, and these tests are not
# about the ISR shrinking (test_minibroker_faults is).
STEADY = ClusterConfig(replica_lag_time_max_ms=30_000)


async def aiokafka_produce(bootstrap: str, acks: Any, count: int) -> dict[tuple[int, int], bytes]:
    """Send `count` records; return (partition, offset) -> value for the acknowledged ones."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=acks, request_timeout_ms=10000)
    await producer.start()
    try:
        values = [f"aiokafka-{acks}-{i}".encode() for i in range(count)]
        futures = [
            await producer.send(TOPIC, v, partition=i % PARTITIONS) for i, v in enumerate(values)
        ]
        results = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    if acks == 0:
        return {}
    return {(m.partition, m.offset): v for m, v in zip(results, values, strict=True)}


def reader(bootstrap: str, fetch_max_wait_ms: int = 200) -> dict[str, Any]:
    """A consumer outside any group that reads from the start (it is assigned its partitions):
    its settings, by the names aiokafka and kafka-python share."""
    return {
        "bootstrap_servers": bootstrap,
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": fetch_max_wait_ms,
    }


async def aiokafka_read_all(bootstrap: str, expected: int) -> dict[tuple[int, int], bytes]:
    """Read every partition from the start until `expected` records came (or 15 s)."""
    consumer = AIOKafkaConsumer(**reader(bootstrap))
    await consumer.start()
    seen: dict[tuple[int, int], bytes] = {}
    try:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 15
        while len(seen) < expected and time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                for record in records:
                    seen[(tp.partition, record.offset)] = record.value
    finally:
        await consumer.stop()
    return seen


def test_aiokafka_produces_with_acks_0_1_all_and_reads_back_what_was_acknowledged() -> None:
    async def main() -> None:
        async with Cluster(STEADY) as cluster:
            acked: dict[tuple[int, int], bytes] = {}
            sent = 0
            for acks in (0, 1, "all"):
                acked |= await aiokafka_produce(cluster.bootstrap, acks, 40)
                sent += 40
            assert len(acked) == 80
            seen = await aiokafka_read_all(cluster.bootstrap, sent)
            assert len(seen) == sent  # acks=0 records arrive too (nothing was lost on the way)
            for key, value in acked.items():
                assert seen[key] == value
            stats = await cluster.stats()
            assert stats["counters"]["produce partition error 0"] >= 1
            assert stats["purgatories"]["produce"]["completed"] >= 1  # acks=all parked

    run(main)


def kafka_python_round_trip(bootstrap: str) -> tuple[dict[Any, bytes], dict[Any, bytes], int]:
    acked: dict[tuple[int, int], bytes] = {}
    sent = 0
    for acks in (0, 1, "all"):
        # kafka-python's default producer is idempotent (InitProducerId) when acks=all.
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks=acks, request_timeout_ms=10000)
        try:
            futures = []
            for i in range(30):
                value = f"kafka-python-{acks}-{i}".encode()
                futures.append((producer.send(TOPIC, value, partition=i % PARTITIONS), value))
            producer.flush(timeout=15)
            for future, value in futures:
                metadata = future.get(timeout=15)
                if acks != 0:
                    acked[(metadata.partition, metadata.offset)] = value
            sent += len(futures)
        finally:
            producer.close(timeout=5)
    consumer = KafkaConsumer(**reader(bootstrap))
    seen: dict[tuple[int, int], bytes] = {}
    timestamps: dict[tuple[int, int], int] = {}
    try:
        partitions = [KafkaTopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        deadline = time.monotonic() + 15
        while len(seen) < sent and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                for record in records:
                    seen[(tp.partition, record.offset)] = record.value
                    timestamps[(tp.partition, record.offset)] = record.timestamp
        ends = consumer.end_offsets(partitions)
        assert sum(ends.values()) == sent  # ListOffsets latest = the high watermark
        assert set(consumer.beginning_offsets(partitions).values()) == {0}
        # ListOffsets by timestamp: the first record at or after it, with that record's own
        # timestamp (not the one asked); none after the last record.
        last = max(t for (p, _), t in timestamps.items() if p == 0)
        by_time = consumer.offsets_for_times({partitions[0]: 0, partitions[1]: 2**62})
        assert tuple(by_time[partitions[0]])[:2] == (0, timestamps[(0, 0)])
        assert by_time[partitions[1]] is None
        (found,) = consumer.offsets_for_times({partitions[0]: last}).values()
        assert found.timestamp == last
        assert timestamps[(0, found.offset)] == last
        assert all(t < last for (p, o), t in timestamps.items() if p == 0 and o < found.offset)
    finally:
        consumer.close()
    return acked, seen, sent


def test_kafka_python_produces_with_acks_0_1_all_and_reads_back_what_was_acknowledged() -> None:
    async def main() -> None:
        async with Cluster(STEADY) as cluster:
            acked, seen, sent = await asyncio.to_thread(kafka_python_round_trip, cluster.bootstrap)
            assert len(acked) == 60
            assert len(seen) == sent == 90
            for key, value in acked.items():
                assert seen[key] == value
            stats = await cluster.stats()
            assert stats["counters"].get("produce acks=0", 0) >= 1

    run(main, timeout=90)


def test_a_long_poll_returns_early_when_data_arrives_and_at_max_wait_when_none() -> None:
    async def main() -> None:
        async with Cluster(STEADY) as cluster:
            # A real consumer parked with a 20 s max wait gets a record produced meanwhile.
            consumer = AIOKafkaConsumer(**reader(cluster.bootstrap, fetch_max_wait_ms=20000))
            await consumer.start()
            try:
                consumer.assign([TopicPartition(TOPIC, 0)])
                polling = asyncio.create_task(consumer.getone())
                await asyncio.sleep(0.5)
                assert not polling.done()
                started = time.monotonic()
                client = await RawClient.connect(cluster.port)
                await produce(client, TOPIC, 0, batch(b"wake up"))
                record = await asyncio.wait_for(polling, 10)  # far less than the 20 s wait
                assert record.value == b"wake up"
                assert time.monotonic() - started < 10
                await client.close()
            finally:
                await consumer.stop()
            # With no data, a fetch is answered at max_wait_ms, never before.
            client = await RawClient.connect(cluster.port)
            started = time.monotonic()
            response = await client.call(
                fetch_request({(TOPIC, 1): 0}, max_wait_ms=300), FetchResponse, FETCH_VERSION
            )
            assert time.monotonic() - started >= 0.3
            (partition,) = response.responses[0].partitions
            assert partition.error_code == 0
            assert not partition.records
            stats = await cluster.stats()
            assert stats["counters"]["fetch consumer parked expired"] >= 1
            assert stats["counters"]["fetch consumer parked data"] >= 1
            await client.close()

    run(main)


PURGATORIES = {"produce", "fetch", "follower-fetch", "rebalance", "heartbeat"}


def scrape(url: str) -> dict[tuple[str, str], float]:
    """GET `url` and parse it with prometheus_client's own parser: (sample, purgatory) -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    return {
        (sample.name, sample.labels["purgatory"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serve_prints_where_it_serves_serves_metrics_and_stops_cleanly(
    signum: int, tmp_path: Path
) -> None:
    stderr = tmp_path / "stderr"
    command = [sys.executable, "-m", "examples.minibroker", "serve", "--port", "0"]
    with (
        stderr.open("wb") as errors,
        subprocess.Popen(
            [*command, "--metrics-port", "0"],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=errors,
            stdin=subprocess.DEVNULL,
        ) as process,
    ):
        try:
            assert process.stdout is not None
            line = process.stdout.readline().decode()
            assert re.fullmatch(r"bootstrap 127\.0\.0\.1:(\d+)\n", line), line
            bootstrap = line.split()[1]
            line = process.stdout.readline().decode()
            assert re.fullmatch(r"metrics http://127\.0\.0\.1:(\d+)/metrics\n", line), line
            before = scrape(line.split()[1])
            acked = run(lambda: aiokafka_produce(bootstrap, "all", 8), timeout=30)
            assert len(acked) == 8
            after = scrape(line.split()[1])  # a real scrape of the leader's purgatories
            assert {name for _, name in after} == PURGATORIES
            assert before[("purgatory_completed_total", "produce")] == 0
            assert after[("purgatory_completed_total", "produce")] >= 1  # acks=all parked
            assert after[("purgatory_delayed", "produce")] == 0
            os.kill(process.pid, signum)
            assert process.wait(timeout=15) == 0
            assert process.stdout.read() == b""  # exactly two lines
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    # The followers stop before the leader: none of them reports a lost leader ("connection to
    # the leader lost"); a clean run and stop log nothing at all.
    assert stderr.read_text() == ""


@pytest.mark.parametrize("taken", ["broker", "metrics"])
def test_serve_on_a_taken_port_says_so_in_one_line_and_exits_non_zero(taken: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = ["--port", str(port)] if taken == "broker" else ["--port", "0"]
        ports += ["--metrics-port", str(port) if taken == "metrics" else "0"]
        done = subprocess.run(
            [sys.executable, "-m", "examples.minibroker", "serve", *ports],
            cwd=REPO_ROOT,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
    what = "listen" if taken == "broker" else "serve metrics"
    assert done.returncode == 1
    assert done.stdout == b""
    assert done.stderr.decode().splitlines() == [
        f"minibroker: cannot {what} on 127.0.0.1:{port}: address already in use"
    ]


def test_serve_without_metrics_prints_one_line() -> None:
    alone = ["--followers", "0", "--min-insync-replicas", "1"]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.minibroker",
            "serve",
            "--port",
            "0",
            *alone,
            "--no-metrics",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith(b"bootstrap 127.0.0.1:")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert process.stdout.read() == b""
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


def test_followers_that_never_fetch_hold_acks_all_until_they_leave_the_isr() -> None:
    async def main() -> None:
        config = ClusterConfig(min_insync_replicas=1, replica_lag_time_max_ms=1500)
        async with Cluster(config, start_followers=False) as cluster:
            client = await RawClient.connect(cluster.port)
            assert (await cluster.stats())["partitions"]["demo-0"]["isr"] == [0, 1, 2]
            response = await produce(client, TOPIC, 0, batch(b"x"), timeout_ms=20000)
            # With the silent followers in the ISR the high watermark cannot move, so this
            # acknowledgement came after both left it (replica.lag.time.max.ms).
            assert produce_errors(response) == [Errors.NONE]
            stats = await cluster.stats()
            assert stats["partitions"]["demo-0"]["isr"] == [0]
            assert stats["partitions"]["demo-0"]["high_watermark"] == 1
            await client.close()

    run(main)


def test_leader_and_followers_stop_cleanly_when_their_parent_goes() -> None:
    async def main() -> None:
        async with Cluster(STEADY) as cluster:
            # The end of stdin is what a dead parent leaves them: each stops, exit status 0.
            processes = [cluster.leader, *cluster.followers.values()]
            for process in processes:
                assert process is not None
                assert process.stdin is not None
                process.stdin.close()
            for process in processes:
                assert process is not None
                assert await asyncio.wait_for(process.wait(), 15) == 0

    run(main)
