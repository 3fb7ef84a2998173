"""The group APIs on the wire, at every version the broker advertises, and topic creation.

A raw client (kafka-python's message classes, as the broker's) walks one member through the whole
classic protocol at each JoinGroup version: FindCoordinator, JoinGroup (v4+: the second join
with the handed-out member id), SyncGroup, Heartbeat, OffsetCommit, OffsetFetch, LeaveGroup;
every version of each API is encoded and decoded once. Then the topics: created on first use by a
Metadata request, or refused with ``UNKNOWN_TOPIC_OR_PARTITION`` and a broker log line.
"""

from __future__ import annotations

import tempfile
from typing import Any

from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from minibroker_support import RawClient, batch, produce, produce_errors, run

from examples.minibroker.apis import _HANDLERS
from examples.minibroker.cluster import Cluster, ClusterConfig
from examples.minibroker.protocol import SERVED, Errors

TOPIC = "demo"
CONFIG = ClusterConfig(min_insync_replicas=1, replica_lag_time_max_ms=600_000)


def test_every_served_api_has_a_handler() -> None:
    assert set(_HANDLERS) | {18} == set(SERVED)  # ApiVersions is answered before dispatch


async def find_coordinator(client: RawClient, port: int) -> None:
    low, high = SERVED[FindCoordinatorRequest.API_KEY]
    for version in range(low, high + 1):
        request = FindCoordinatorRequest(key="g", key_type=0, coordinator_keys=["g", "h"])
        response = await client.call(request, FindCoordinatorResponse, version)
        if version < 4:
            assert (response.error_code, response.node_id, response.port) == (0, 0, port)
        else:
            assert [(c.key, c.error_code, c.port) for c in response.coordinators] == [
                ("g", 0, port),
                ("h", 0, port),
            ]
    # Transactions have no coordinator here: refused with the one error every client takes as
    # final, and a message; an unknown coordinator type is an invalid request.
    response = await client.call(
        FindCoordinatorRequest(key="tx", key_type=1), FindCoordinatorResponse, 3
    )
    assert response.error_code == Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert response.error_message == "transactions are not supported by this broker (minibroker)"
    response = await client.call(
        FindCoordinatorRequest(key_type=1, coordinator_keys=["tx", "ty"]),
        FindCoordinatorResponse,
        4,
    )
    assert [(c.key, c.error_code, c.node_id) for c in response.coordinators] == [
        ("tx", Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1),
        ("ty", Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1),
    ]
    response = await client.call(
        FindCoordinatorRequest(key="g", key_type=7), FindCoordinatorResponse, 3
    )
    assert response.error_code == Errors.INVALID_REQUEST


async def join(client: RawClient, group: str, version: int) -> Any:
    def request(member_id: str) -> Any:
        return JoinGroupRequest(
            group_id=group,
            session_timeout_ms=10_000,
            rebalance_timeout_ms=10_000,
            member_id=member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")],
        )

    response = await client.call(request(""), JoinGroupResponse, version)
    if version >= 4:  # KIP-394: the id first, then the join with it
        assert response.error_code == Errors.MEMBER_ID_REQUIRED
        response = await client.call(request(response.member_id), JoinGroupResponse, version)
    assert response.error_code == Errors.NONE
    assert response.generation_id == 1
    assert response.leader == response.member_id
    assert [(m.member_id, m.metadata) for m in response.members] == [(response.member_id, b"m")]
    assert response.protocol_name == "range"
    return response


async def walk_the_protocol(client: RawClient, version: int) -> None:
    group = f"group-v{version}"
    joined = await join(client, group, version)
    member, generation = joined.member_id, joined.generation_id
    sync = SyncGroupRequest(
        group_id=group,
        generation_id=generation,
        member_id=member,
        group_instance_id=None,
        protocol_type="consumer",
        protocol_name="range",
        assignments=[
            SyncGroupRequest.SyncGroupRequestAssignment(member_id=member, assignment=b"a")
        ],
    )
    synced = await client.call(sync, SyncGroupResponse, min(version, 5))
    assert (synced.error_code, synced.assignment) == (Errors.NONE, b"a")
    beat = HeartbeatRequest(group_id=group, generation_id=generation, member_id=member)
    assert (await client.call(beat, HeartbeatResponse, min(version, 4))).error_code == 0
    stale = HeartbeatRequest(group_id=group, generation_id=generation + 1, member_id=member)
    response = await client.call(stale, HeartbeatResponse, min(version, 4))
    assert response.error_code == Errors.ILLEGAL_GENERATION
    low, high = SERVED[OffsetCommitRequest.API_KEY]
    commit_version = low + version % (high - low + 1)
    commit = OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member,
        group_instance_id=None,
        retention_time_ms=-1,
        topics=[
            OffsetCommitRequest.OffsetCommitRequestTopic(
                name=TOPIC,
                partitions=[
                    OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                        partition_index=1,
                        committed_offset=version + 10,
                        committed_leader_epoch=-1,
                        committed_metadata="meta",
                    )
                ],
            )
        ],
    )
    committed = await client.call(commit, OffsetCommitResponse, commit_version)
    assert [p.error_code for t in committed.topics for p in t.partitions] == [Errors.NONE]
    low, high = SERVED[OffsetFetchRequest.API_KEY]
    for fetch_version in range(low, high + 1):
        assert await fetch_offsets(client, group, fetch_version) == [
            (1, version + 10, "meta"),
            (2, -1, ""),
        ]
    if version < 3:
        leave = LeaveGroupRequest(group_id=group, member_id=member)
        left = await client.call(leave, LeaveGroupResponse, version)
        assert left.error_code == Errors.NONE
    else:
        leave = LeaveGroupRequest(
            group_id=group,
            members=[LeaveGroupRequest.MemberIdentity(member_id=member, group_instance_id=None)],
        )
        left = await client.call(leave, LeaveGroupResponse, min(version, 5))
        assert [m.error_code for m in left.members] == [Errors.NONE]
    beat = HeartbeatRequest(group_id=group, generation_id=generation, member_id=member)
    response = await client.call(beat, HeartbeatResponse, 0)
    assert response.error_code == Errors.UNKNOWN_MEMBER_ID  # it left


async def fetch_offsets(client: RawClient, group: str, version: int) -> list[tuple[Any, ...]]:
    if version < 8:
        request = OffsetFetchRequest(
            group_id=group,
            topics=[
                OffsetFetchRequest.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=[1, 2])
            ],
        )
        response = await client.call(request, OffsetFetchResponse, version)
        topics = response.topics
    else:
        asked = OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics(
            name=TOPIC, partition_indexes=[1, 2]
        )
        request = OffsetFetchRequest(
            groups=[OffsetFetchRequest.OffsetFetchRequestGroup(group_id=group, topics=[asked])]
        )
        response = await client.call(request, OffsetFetchResponse, version)
        (answer,) = response.groups
        assert answer.group_id == group
        topics = answer.topics
    return [
        (p.partition_index, p.committed_offset, p.metadata)
        for topic in topics
        for p in topic.partitions
        if not p.error_code
    ]


def test_one_member_walks_the_classic_protocol_at_every_served_version() -> None:
    async def main() -> None:
        async with Cluster(CONFIG, start_followers=False) as cluster:
            client = await RawClient.connect(cluster.port)
            try:
                await find_coordinator(client, cluster.port)
                low, high = SERVED[JoinGroupRequest.API_KEY]
                for version in range(low, high + 1):
                    await walk_the_protocol(client, version)
                stats = await cluster.stats()
                assert stats["purgatories"]["rebalance"]["expired"] >= high + 1  # initial delays
                assert all(g["state"] == "Empty" for g in stats["groups"].values())
                assert stats["purgatories"]["heartbeat"]["delayed"] == 0
            finally:
                await client.close()

    run(main, timeout=60)


def metadata_request(*topics: str, allow: bool = True) -> Any:
    return MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=name) for name in topics],
        allow_auto_topic_creation=allow,
    )


def test_a_topic_is_created_on_first_use_with_the_default_partition_count() -> None:
    async def main() -> None:
        config = ClusterConfig(topics={}, num_partitions=3, replica_lag_time_max_ms=30_000)
        async with Cluster(config) as cluster:
            assert (await cluster.stats())["partitions"] == {}  # no topic at all to start
            client = await RawClient.connect(cluster.port)
            try:
                # A client that says no (Metadata v4+) does not create it.
                response = await client.call(
                    metadata_request("fresh", allow=False), MetadataResponse, 9
                )
                assert [t.error_code for t in response.topics] == [
                    Errors.UNKNOWN_TOPIC_OR_PARTITION
                ]
                response = await client.call(metadata_request("fresh"), MetadataResponse, 9)
                (topic,) = response.topics
                assert (topic.error_code, len(topic.partitions)) == (Errors.NONE, 3)
                # The followers learn it and replicate it: acks=all completes.
                response = await produce(client, "fresh", 2, batch(b"x"), timeout_ms=20_000)
                assert produce_errors(response) == [Errors.NONE]
                stats = await cluster.stats()
                assert stats["partitions"]["fresh-2"]["high_watermark"] == 1
                assert stats["partitions"]["fresh-2"]["isr"] == [0, 1, 2]
            finally:
                await client.close()

    run(main)


def test_without_auto_creation_an_unknown_topic_is_refused_and_logged() -> None:
    async def main(log: Any) -> None:
        config = ClusterConfig(auto_create_topics=False, min_insync_replicas=1)
        async with Cluster(config, start_followers=False, log=log) as cluster:
            client = await RawClient.connect(cluster.port)
            try:
                for _ in range(2):
                    response = await client.call(metadata_request("absent"), MetadataResponse, 9)
                    assert [t.error_code for t in response.topics] == [
                        Errors.UNKNOWN_TOPIC_OR_PARTITION
                    ]
                response = await produce(client, "nothing", 0, batch(b"x"))
                assert produce_errors(response) == [Errors.UNKNOWN_TOPIC_OR_PARTITION]
            finally:
                await client.close()

    with tempfile.TemporaryFile() as log:
        run(lambda: main(log))
        log.seek(0)
        lines = log.read().decode().splitlines()
    unknown = [line for line in lines if "unknown topic" in line]
    assert len(unknown) == 2, lines  # once per topic, not once per request
    assert "metadata for unknown topic 'absent': UNKNOWN_TOPIC_OR_PARTITION" in unknown[0]
    assert "auto-creation off" in unknown[0]
    assert "produce for unknown topic 'nothing'" in unknown[1]
