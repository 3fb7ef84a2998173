"""Consumer groups against real clients: kafka-python, aiokafka and confluent-kafka (librdkafka).

Each client's own quick-start consumer (a group id and a subscription) reads what was produced to
a topic created on first use, commits, and a consumer started afterwards in the same group
resumes from the committed offsets; two members split the partitions, and one gets them all when
the other leaves or is killed. The sessions and the initial rebalance delay are short, so every
test ends in seconds; each is bounded by `run`'s timeout and the clients' own timeouts.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from kafka import KafkaConsumer, KafkaProducer
from minibroker_support import run, wait_until

from examples.minibroker.cluster import REPO_ROOT, Cluster, ClusterConfig
from examples.minibroker.protocol import (
    SERVED,
    FindCoordinatorRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)

PARTITIONS = 4
SESSION_MS = 2000  # short sessions: a killed member is noticed in about 2 s
HEARTBEAT_MS = 300
CONFIG = ClusterConfig(topics={}, num_partitions=PARTITIONS, replica_lag_time_max_ms=30_000)

Record = tuple[int, int, bytes]  # partition, offset, value
GROUP_APIS = [
    request.API_KEY
    for request in (
        FindCoordinatorRequest,
        JoinGroupRequest,
        SyncGroupRequest,
        LeaveGroupRequest,
        OffsetCommitRequest,
        OffsetFetchRequest,
    )
]


# -- each client's quick start --------------------------------------------------------------------


def kafka_python_produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=10000)
    try:
        for i, value in enumerate(values):
            producer.send(topic, value, partition=i % PARTITIONS)
        producer.flush(timeout=15)
    finally:
        producer.close(timeout=5)


def member(bootstrap: str, group: str) -> dict[str, Any]:
    """A quick-start group member that commits by hand: its settings, by the names aiokafka
    and kafka-python share."""
    return {
        "bootstrap_servers": bootstrap,
        "group_id": group,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "session_timeout_ms": SESSION_MS,
        "heartbeat_interval_ms": HEARTBEAT_MS,
        "fetch_max_wait_ms": 200,
    }


def kafka_python_consume(bootstrap: str, group: str, topic: str, count: int) -> list[Record]:
    """kafka-python's quick start: subscribe in a group, poll, commit, close."""
    consumer = KafkaConsumer(topic, **member(bootstrap, group))
    seen: list[Record] = []
    try:
        deadline = time.monotonic() + 20
        while len(seen) < count and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                seen += [(tp.partition, r.offset, r.value) for r in records]
        consumer.commit()
    finally:
        consumer.close()
    return seen


async def aiokafka_produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i, value in enumerate(values):
            await producer.send(topic, value, partition=i % PARTITIONS)
        await producer.flush()
    finally:
        await producer.stop()


async def aiokafka_consume(bootstrap: str, group: str, topic: str, count: int) -> list[Record]:
    """aiokafka's quick start: a consumer with a group id, getmany, commit, stop."""
    consumer = AIOKafkaConsumer(topic, **member(bootstrap, group))
    await consumer.start()
    seen: list[Record] = []
    try:
        deadline = time.monotonic() + 20
        while len(seen) < count and time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                seen += [(tp.partition, r.offset, r.value) for r in records]
        await consumer.commit()
    finally:
        await consumer.stop()
    return seen


def confluent_produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = ConfluentProducer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % PARTITIONS)
    assert producer.flush(15) == 0


def confluent_consume(bootstrap: str, group: str, topic: str, count: int) -> list[Record]:
    """confluent-kafka's quick start: Consumer with group.id, subscribe, poll, commit, close."""
    consumer = ConfluentConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "fetch.wait.max.ms": 200,
        }
    )
    seen: list[Record] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 20
        while len(seen) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            partition, offset, value = message.partition(), message.offset(), message.value()
            assert partition is not None
            assert offset is not None
            assert value is not None
            seen.append((partition, offset, value))
        if seen:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return seen


Produce = Callable[[str, str, list[bytes]], Any]
Consume = Callable[[str, str, str, int], Any]

CLIENTS: dict[str, tuple[Produce, Consume]] = {
    "kafka-python": (kafka_python_produce, kafka_python_consume),
    "aiokafka": (aiokafka_produce, aiokafka_consume),
    "confluent-kafka": (confluent_produce, confluent_consume),
}


async def call(function: Callable[..., Any], *args: Any) -> Any:
    """Await an async client function; run a blocking one in a thread."""
    if asyncio.iscoroutinefunction(function):
        return await function(*args)
    return await asyncio.to_thread(function, *args)


# -- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_group_consumer_reads_commits_and_a_restarted_one_resumes(client: str) -> None:
    produce, consume = CLIENTS[client]
    topic, group = f"quickstart-{client}", f"group-{client}"

    async def main() -> None:
        async with Cluster(CONFIG) as cluster:
            first = [f"{client}-first-{i}".encode() for i in range(20)]
            await call(produce, cluster.bootstrap, topic, first)  # the topic is created
            seen = await call(consume, cluster.bootstrap, group, topic, len(first))
            assert sorted(value for _, _, value in seen) == sorted(first)
            stats = await cluster.stats()
            assert stats["groups"][group]["state"] == "Empty"  # the consumer left
            # The restarted consumer starts at the committed offsets: only the new records.
            second = [f"{client}-second-{i}".encode() for i in range(12)]
            await call(produce, cluster.bootstrap, topic, second)
            seen = await call(consume, cluster.bootstrap, group, topic, len(second))
            assert sorted(value for _, _, value in seen) == sorted(second)
            assert all(offset >= 5 for _, offset, _ in seen)  # 20 records over 4 partitions
            stats = await cluster.stats()
            # The client negotiated group APIs the broker serves (ApiVersions), at least
            # JoinGroup v4, which hands out member ids (KIP-394).
            used = [name.split() for name in stats["counters"] if name.startswith("api ")]
            versions: dict[int, list[int]] = {}
            for _, key, version in used:
                versions.setdefault(int(key), []).append(int(version[1:]))
            assert set(GROUP_APIS) <= set(versions)
            for key, chosen in versions.items():
                low, high = SERVED[key]
                assert all(low <= v <= high for v in chosen)
            assert min(versions[JoinGroupRequest.API_KEY]) >= 4
            gauges = stats["purgatories"]
            assert gauges["rebalance"]["completed"] + gauges["rebalance"]["expired"] >= 2
            assert gauges["heartbeat"]["completed"] >= 2
            assert stats["counters"]["offset commits"] >= 2

    run(main, timeout=90)


class Member:
    """A group member in a process of its own (``python -m examples.minibroker member``)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.assigned: set[int] | None = None
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, client: str, bootstrap: str, group: str, topic: str) -> Member:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "examples.minibroker", "member", "--client", client),
            *("--bootstrap", bootstrap, "--group", group, "--topic", topic),
            *("--session-timeout-ms", str(SESSION_MS)),
            *("--heartbeat-interval-ms", str(HEARTBEAT_MS)),
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            word, _, rest = line.decode().strip().partition(" ")
            if word == "assigned":
                self.assigned = {int(p) for p in rest.split(",") if p}

    async def stop(self, signum: int) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signum)
        await asyncio.wait_for(self.process.wait(), 30)
        await self._reader


@pytest.mark.parametrize("how", ["leaves", "is killed"])
@pytest.mark.parametrize("client", list(CLIENTS))
def test_two_members_split_the_partitions_and_one_takes_all_when_the_other_goes(
    client: str, how: str
) -> None:
    topic, group = "shared", "pair"

    async def main() -> None:
        async with Cluster(CONFIG) as cluster:
            await aiokafka_produce(cluster.bootstrap, topic, [b"x"] * 8)
            stays = await Member.start(client, cluster.bootstrap, group, topic)
            goes = await Member.start(client, cluster.bootstrap, group, topic)
            try:

                async def split() -> bool:
                    mine, theirs = stays.assigned or set(), goes.assigned or set()
                    return len(mine) == len(theirs) == PARTITIONS // 2 and not mine & theirs

                await wait_until(split, timeout=30)
                # SIGINT: the client closes and sends LeaveGroup; SIGKILL: nothing, the
                # coordinator learns it when the member's session expires.
                await goes.stop(signal.SIGINT if how == "leaves" else signal.SIGKILL)

                async def all_mine() -> bool:
                    return stays.assigned == set(range(PARTITIONS))

                await wait_until(all_mine, timeout=30)
                stats = await cluster.stats()
                assert len(stats["groups"][group]["members"]) == 1
                counters = stats["counters"]
                if how == "leaves":
                    assert counters["group members left"] == 1
                    assert "group members expired" not in counters
                else:
                    assert counters["group members expired"] == 1
                    assert "group members left" not in counters
                    assert stats["purgatories"]["heartbeat"]["expired"] >= 1
            finally:
                await goes.stop(signal.SIGKILL)
                await stays.stop(signal.SIGKILL)

    run(main, timeout=90)
