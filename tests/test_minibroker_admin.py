"""The admin calls of a Kafka user, with each client's own admin API: CreateTopics (and Kafka's
topic-name rules), DescribeGroups and ListGroups.

One leader with no followers serves every test (no replication is involved): kafka-python's
``KafkaAdminClient``, aiokafka's ``AIOKafkaAdminClient`` and confluent-kafka's ``AdminClient``
describe and list a group that a real consumer holds, Stable with its member's subscription and
assignment, then Empty once it left; topic names Kafka refuses are refused with
``INVALID_TOPIC_EXCEPTION`` and create nothing, by CreateTopics and by creation on first use.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AIONewTopic
from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic as ConfluentNewTopic
from kafka import KafkaAdminClient
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from minibroker_support import RawClient, run, wait_until

from examples.minibroker.cluster import Cluster, ClusterConfig
from examples.minibroker.protocol import Errors
from examples.minibroker.topics import MAX_NAME_LENGTH

ALONE = ClusterConfig(followers=0, min_insync_replicas=1, topics={}, num_partitions=2)
GROUP = "described"
TOPIC = "admin"
#: Names Kafka refuses: each would be a directory, a path or a metric name it cannot make.
BAD_NAMES = [".", "..", "../x", "bad name", "t" * (MAX_NAME_LENGTH + 1), "caf\u00e9", ""]


def kafka_python_view(bootstrap: str) -> dict[str, Any]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        described = admin.describe_groups([GROUP, "nobody"])
        return {
            "described": described,
            "listed": admin.list_groups(),
            "stable": admin.list_groups(states_filter=["Stable"]),
            "empty": admin.list_groups(states_filter=["Empty"]),
        }
    finally:
        admin.close()


async def aiokafka_view(bootstrap: str) -> dict[str, Any]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([GROUP])
        return {"listed": await admin.list_consumer_groups(), "described": response.groups}
    finally:
        await admin.close()


def confluent_view(bootstrap: str) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_groups(request_timeout=10).result()
    (future,) = admin.describe_consumer_groups([GROUP], request_timeout=10).values()
    return {"listed": listed, "described": future.result()}


def test_each_clients_admin_api_describes_and_lists_a_group_stable_then_empty() -> None:
    async def main() -> None:
        async with Cluster(ALONE) as cluster:
            bootstrap = cluster.bootstrap
            consumer = AIOKafkaConsumer(
                TOPIC,
                bootstrap_servers=bootstrap,
                group_id=GROUP,
                client_id="reader",
                session_timeout_ms=10_000,
                heartbeat_interval_ms=300,
            )
            await consumer.start()
            try:

                async def assigned() -> bool:
                    await consumer.getmany(timeout_ms=100)
                    return len(consumer.assignment()) == 2

                await wait_until(assigned, timeout=30)
                member_id = consumer._coordinator.member_id
                stable = await asyncio.to_thread(kafka_python_view, bootstrap)
                aio = await aiokafka_view(bootstrap)
                confluent = await asyncio.to_thread(confluent_view, bootstrap)
            finally:
                await consumer.stop()  # LeaveGroup: the group is Empty at once
            empty = await asyncio.to_thread(kafka_python_view, bootstrap)
            check_stable(stable, member_id)
            check_aiokafka(aio, member_id)
            check_confluent(confluent, member_id)
            check_empty(empty)

    run(main, timeout=90)


def check_stable(view: dict[str, Any], member_id: str) -> None:
    """kafka-python: the member with its decoded subscription and assignment."""
    group = view["described"][GROUP]
    assert group["error"] is None
    assert (group["group_state"], group["protocol_type"]) == ("Stable", "consumer")
    assert group["protocol_data"] == "roundrobin"  # aiokafka's default assignor
    (member,) = group["members"]
    assert member["member_id"] == member_id
    assert (member["client_id"], member["client_host"]) == ("reader", "/127.0.0.1")
    assert member["member_metadata"]["topics"] == [TOPIC]
    (assigned,) = member["member_assignment"]["assigned_partitions"]
    assert (assigned["topic"], sorted(assigned["partitions"])) == (TOPIC, [0, 1])
    nobody = view["described"]["nobody"]  # Kafka describes an unknown group as Dead
    assert (nobody["error"], nobody["group_state"], nobody["members"]) == (None, "Dead", [])
    listed = {"group_id": GROUP, "protocol_type": "consumer", "group_state": "Stable"}
    assert [{k: g[k] for k in listed} for g in view["listed"]] == [listed]
    assert [g["group_type"] for g in view["listed"]] == ["classic"]
    assert [g["group_id"] for g in view["stable"]] == [GROUP]
    assert view["empty"] == []


def check_aiokafka(view: dict[str, Any], member_id: str) -> None:
    """aiokafka: the raw answer, a tuple per group (error, id, state, type, protocol, members)."""
    assert view["listed"] == [(GROUP, "consumer")]
    (group,) = view["described"]
    assert group[:5] == (Errors.NONE, GROUP, "Stable", "consumer", "roundrobin")
    ((member, client_id, client_host, _, _),) = group[5]
    assert (member, client_id, client_host) == (member_id, "reader", "/127.0.0.1")


def check_confluent(view: dict[str, Any], member_id: str) -> None:
    assert view["listed"].errors == []
    (listing,) = view["listed"].valid
    assert (listing.group_id, listing.state) == (GROUP, ConsumerGroupState.STABLE)
    assert not listing.is_simple_consumer_group
    described = view["described"]
    assert (described.group_id, described.state) == (GROUP, ConsumerGroupState.STABLE)
    assert described.partition_assignor == "roundrobin"
    (member,) = described.members
    assert (member.member_id, member.client_id, member.host) == (
        member_id,
        "reader",
        "/127.0.0.1",
    )
    assigned = sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions)
    assert assigned == [(TOPIC, 0), (TOPIC, 1)]


def check_empty(view: dict[str, Any]) -> None:
    """Once the member left: Empty, no members, still a consumer group (as Kafka keeps it)."""
    group = view["described"][GROUP]
    assert (group["group_state"], group["protocol_type"], group["members"]) == (
        "Empty",
        "consumer",
        [],
    )
    assert [(g["group_id"], g["group_state"]) for g in view["listed"]] == [(GROUP, "Empty")]
    assert view["stable"] == []
    assert [g["group_id"] for g in view["empty"]] == [GROUP]


# -- topic names -----------------------------------------------------------------------------


def kafka_python_create(bootstrap: str, topics: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """Create `topics` (name: partitions, replication factor); each one's error and message."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        response = admin.create_topics(
            {
                name: {"num_partitions": partitions, "replication_factor": replicas}
                for name, (partitions, replicas) in topics.items()
            },
            raise_errors=False,
        )
        return {t["name"]: (t["error_code"], t["error_message"]) for t in response["topics"]}
    finally:
        admin.close()


def confluent_create(bootstrap: str, name: str) -> Any:
    """Create topic `name`; None, or the KafkaError confluent-kafka raised."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.create_topics([ConfluentNewTopic(name, 1)], request_timeout=10).values()
    try:
        return future.result()
    except KafkaException as exc:
        return exc.args[0]


def metadata_request(*names: str) -> Any:
    return MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=name) for name in names],
        allow_auto_topic_creation=True,
    )


def test_topic_names_kafka_refuses_get_invalid_topic_exception_and_create_nothing() -> None:
    async def main(log: Any) -> None:
        async with Cluster(ALONE, log=log) as cluster:
            bootstrap = cluster.bootstrap
            # Creation on first use (a Metadata request that allows it): refused, per name.
            client = await RawClient.connect(cluster.port)
            try:
                response = await client.call(
                    metadata_request(*BAD_NAMES, "good.one"), MetadataResponse, 9
                )
            finally:
                await client.close()
            assert [(t.name, t.error_code) for t in response.topics] == [
                *[(name, Errors.INVALID_TOPIC_EXCEPTION) for name in BAD_NAMES],
                ("good.one", Errors.NONE),
            ]
            # CreateTopics (kafka-python's admin): the same names, the same answer, Kafka's
            # message; a name colliding with an existing one ('.' and '_' are one in metric
            # names) too; an existing topic and bad counts get their own errors.
            created = await asyncio.to_thread(
                kafka_python_create,
                bootstrap,
                {name: (1, 1) for name in BAD_NAMES if name}
                | {
                    "good_one": (1, 1),
                    "good.one": (1, 1),
                    "zero": (0, 1),
                    "wide": (1, 5),
                    "fine": (3, 1),
                },
            )
            for name in BAD_NAMES[:-1]:
                assert created[name][0] == Errors.INVALID_TOPIC_EXCEPTION, name
            assert created["."][1] == 'Topic name cannot be "." or ".."'
            assert "contains a character other than ASCII alphanumerics" in created["bad name"][1]
            assert "can't be longer than 249 characters" in created["t" * 250][1]
            assert created["good_one"] == (
                Errors.INVALID_TOPIC_EXCEPTION,
                "Topic 'good_one' collides with existing topic: good.one",
            )
            assert created["good.one"][0] == Errors.TOPIC_ALREADY_EXISTS
            assert created["zero"][0] == Errors.INVALID_PARTITIONS
            assert created["wide"][0] == Errors.INVALID_REPLICATION_FACTOR
            assert created["fine"] == (Errors.NONE, None)
            # confluent-kafka's admin raises it; aiokafka's returns the raw answer.
            error = await asyncio.to_thread(confluent_create, bootstrap, "../etc")
            assert error.code() == Errors.INVALID_TOPIC_EXCEPTION
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                answer = await admin.create_topics([AIONewTopic("no/slash", 1, 1)])
            finally:
                await admin.close()
            assert [error[:2] for error in answer.topic_errors] == [
                ("no/slash", Errors.INVALID_TOPIC_EXCEPTION)
            ]
            stats = await cluster.stats()
            assert sorted(stats["partitions"]) == [
                "fine-0",
                "fine-1",
                "fine-2",
                "good.one-0",
                "good.one-1",
            ]

    with tempfile.TemporaryFile() as log:
        run(lambda: main(log), timeout=90)
        log.seek(0)
        lines = log.read().decode().splitlines()
    invalid = [line for line in lines if "INVALID_TOPIC_EXCEPTION" in line]
    # One warning per name, however often it was asked for (metadata and CreateTopics).
    assert len(invalid) == len(BAD_NAMES) + 3, lines  # + good_one, ../etc, no/slash
    assert all(" leader WARNING minibroker.apis: " in line for line in invalid)
