"""Bad input gets the protocol's error code or a closed connection; never a crash or a hang.

A real leader process (its two followers configured but not started, so that acks=all waits)
and a raw client that sends exactly the bad request meant. After each test the leader must still
be running and still answer a fresh connection.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Awaitable, Callable

import pytest
from kafka.protocol.consumer import FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import EndTxnRequest, EndTxnResponse, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder
from minibroker_support import (
    FETCH_VERSION,
    RawClient,
    batch,
    fetch,
    fetch_request,
    produce,
    produce_errors,
    produce_request,
    run,
)

from examples.minibroker.cluster import Cluster, ClusterConfig
from examples.minibroker.protocol import SERVED, Errors

TOPIC = "demo"
MAX_REQUEST = 64 * 1024
MAX_MESSAGE = 16 * 1024


def with_leader(body: Callable[[Cluster, RawClient], Awaitable[None]]) -> None:
    """Run `body` against a fresh leader; then check the leader is alive and answers."""

    async def main() -> None:
        config = ClusterConfig(
            min_insync_replicas=1,
            max_request_bytes=MAX_REQUEST,
            max_message_bytes=MAX_MESSAGE,
            # The followers are never started and must stay in the ISR for the whole test.
            replica_lag_time_max_ms=600_000,
            auto_create_topics=False,
        )
        async with Cluster(config, start_followers=False, log=log) as cluster:
            client = await RawClient.connect(cluster.port)
            try:
                await body(cluster, client)
            finally:
                await client.close()
            assert cluster.leader is not None
            assert cluster.leader.returncode is None
            fresh = await RawClient.connect(cluster.port)
            versions = await fresh.call(ApiVersionsRequest(), ApiVersionsResponse, 0)
            assert versions.error_code == Errors.NONE
            await fresh.close()

    with tempfile.TemporaryFile() as log:
        run(main, timeout=30)
        log.seek(0)
        assert b"Traceback" not in log.read()  # refused, not crashed


def list_offsets_request(topic: str) -> ListOffsetsRequest:
    partition = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=0, timestamp=-1
    )
    return ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[partition])],
    )


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.parametrize(
    "data",
    [
        frame(b"\x00"),  # too short for a header
        frame(b"\xff" * 40),  # garbage header fields
        frame(struct.pack(">hhi", 0, 9, 1) + b"\x00\x01x" + b"\x13" * 30),  # produce, bad body
        struct.pack(">i", MAX_REQUEST + 1) + b"\x00" * 16,  # over the frame size limit
        struct.pack(">i", -5),  # negative size
        struct.pack(">i", 0),  # empty frame
    ],
    ids=["short", "garbage-header", "garbage-body", "oversize", "negative-size", "empty"],
)
def test_unreadable_frames_close_the_connection(data: bytes) -> None:
    async def body(cluster: Cluster, client: RawClient) -> None:
        client.send_bytes(data)
        assert await client.is_closed_by_peer()

    with_leader(body)


def test_a_truncated_frame_then_a_disconnect_leaves_the_leader_serving() -> None:
    async def body(cluster: Cluster, client: RawClient) -> None:
        client.send_bytes(struct.pack(">i", 100) + b"\x00" * 10)
        await client.writer.drain()

    with_leader(body)


def test_unserved_apis_and_versions_get_unsupported_version() -> None:
    async def body(cluster: Cluster, client: RawClient) -> None:
        # An API the broker does not serve, with an error field: UNSUPPORTED_VERSION.
        end_txn = EndTxnRequest(
            transactional_id="tx", producer_id=1, producer_epoch=0, committed=True
        )
        response = await client.call(end_txn, EndTxnResponse, 3)
        assert response.error_code == Errors.UNSUPPORTED_VERSION
        # A served API at a version above the served range: the same.
        high = SERVED[1][1] + 1
        response = await client.call(fetch_request({(TOPIC, 0): 0}), FetchResponse, high)
        assert response.error_code == Errors.UNSUPPORTED_VERSION
        # Produce, Fetch and ListOffsets outside the served ranges: the error on each partition.
        low, high = SERVED[0]
        for version in (low - 1, high + 1):
            request = produce_request(TOPIC, 0, batch(b"x"), acks=1)
            response = await client.call(request, ProduceResponse, version)
            assert produce_errors(response) == [Errors.UNSUPPORTED_VERSION]
        response = await client.call(fetch_request({(TOPIC, 0): 0}), FetchResponse, 3)
        assert response.responses[0].partitions[0].error_code == Errors.UNSUPPORTED_VERSION
        offsets = await client.call(list_offsets_request(TOPIC), ListOffsetsResponse, 0)
        assert offsets.topics[0].partitions[0].error_code == Errors.UNSUPPORTED_VERSION
        # ApiVersions above ours: the v0 answer with the error and our ranges (KIP-511).
        client.send(ApiVersionsRequest(), ApiVersionsResponse, 4)
        await client.writer.drain()
        response = await client.receive()
        assert response.error_code == Errors.UNSUPPORTED_VERSION
        assert {k.api_key: (k.min_version, k.max_version) for k in response.api_keys} == SERVED
        # An acks=0 produce at a version not served: it expects no answer, so a closed connection.
        client.send(produce_request(TOPIC, 0, batch(b"x"), acks=0), ProduceResponse, 2)
        assert await client.is_closed_by_peer()

    with_leader(body)


def test_an_api_key_nobody_knows_closes_the_connection() -> None:
    async def body(cluster: Cluster, client: RawClient) -> None:
        # No response format exists for it, so no answer could be matched: closed, as Kafka.
        client.send_bytes(frame(struct.pack(">hhih", 999, 0, 77, -1)))
        assert await client.is_closed_by_peer()

    with_leader(body)


def test_unknown_topics_get_unknown_topic_or_partition() -> None:
    async def body(cluster: Cluster, client: RawClient) -> None:
        unknown = Errors.UNKNOWN_TOPIC_OR_PARTITION
        metadata = await client.call(
            MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="nope")]),
            MetadataResponse,
            9,
        )
        assert [t.error_code for t in metadata.topics] == [unknown]
        assert produce_errors(await produce(client, "nope", 0, batch(b"x"))) == [unknown]
        assert produce_errors(await produce(client, TOPIC, 99, batch(b"x"))) == [unknown]
        response = await fetch(client, {("nope", 0): 0}, max_wait_ms=5000)
        assert [p.error_code for t in response.responses for p in t.partitions] == [unknown]
        offsets = await client.call(list_offsets_request("nope"), ListOffsetsResponse, 5)
        assert [p.error_code for t in offsets.topics for p in t.partitions] == [unknown]

    with_leader(body)


def test_offsets_out_of_range_get_offset_out_of_range_at_once() -> None:
    async def body(cluster: Cluster, client: RawClient) -> None:
        await produce(client, TOPIC, 0, batch(b"a", b"b"), acks=1)
        for offset in (3, 1000, -5):  # the log end is 2
            response = await fetch(client, {(TOPIC, 0): offset}, max_wait_ms=20000)
            (data,) = response.responses[0].partitions
            assert data.error_code == Errors.OFFSET_OUT_OF_RANGE
        # At the log end exactly: not an error, an (empty) long poll.
        response = await fetch(client, {(TOPIC, 0): 2}, max_wait_ms=50)
        (data,) = response.responses[0].partitions
        assert data.error_code == Errors.NONE
        assert not data.records

    with_leader(body)


def test_corrupt_record_batches_are_refused_and_nothing_is_appended() -> None:
    async def body(cluster: Cluster, client: RawClient) -> None:
        good = bytearray(batch(b"some value"))
        bad_crc = bytearray(good)
        bad_crc[-3] ^= 0xFF  # a byte of the record, covered by the CRC
        truncated = bytes(good[:-4])
        too_big = batch(b"x" * (MAX_MESSAGE + 10))
        for records, code in (
            (bytes(bad_crc), Errors.CORRUPT_MESSAGE),
            (truncated, Errors.CORRUPT_MESSAGE),
            (b"", Errors.CORRUPT_MESSAGE),
            (b"\x00" * 7, Errors.CORRUPT_MESSAGE),
        ):
            assert produce_errors(await produce(client, TOPIC, 0, records)) == [code]
        assert produce_errors(await produce(client, TOPIC, 0, too_big)) == [
            Errors.MESSAGE_TOO_LARGE
        ]
        # A batch of the old format (magic 1) is refused too.
        legacy = MemoryRecordsBuilder(magic=1, compression_type=0, batch_size=1 << 16)
        legacy.append(timestamp=None, key=None, value=b"old")
        legacy.close()
        response = await produce(client, TOPIC, 0, bytes(legacy.buffer()))
        assert produce_errors(response) == [Errors.UNSUPPORTED_FOR_MESSAGE_FORMAT]
        stats = await cluster.stats()
        assert stats["partitions"]["demo-0"]["log_end_offset"] == 0

    with_leader(body)


def test_negative_timeouts_and_bad_acks() -> None:
    async def body(cluster: Cluster, client: RawClient) -> None:
        # The followers never fetch, so acks=all cannot complete: a negative timeout expires at
        # once (Kafka: a delay below zero), a negative max wait answers at once.
        assert (await cluster.stats())["partitions"]["demo-0"]["isr"] == [0, 1, 2]
        response = await produce(client, TOPIC, 0, batch(b"x"), timeout_ms=-1)
        assert produce_errors(response) == [Errors.REQUEST_TIMED_OUT]
        response = await fetch(client, {(TOPIC, 1): 0}, max_wait_ms=-1)
        (data,) = response.responses[0].partitions
        assert data.error_code == Errors.NONE
        assert not data.records
        response = await produce(client, TOPIC, 0, batch(b"x"), acks=2)
        assert produce_errors(response) == [Errors.INVALID_REQUIRED_ACKS]
        # acks=0 has no answer: an error (here an unknown topic) closes the connection.
        client.send(produce_request("nope", 0, batch(b"x"), acks=0), None, 9)
        assert await client.is_closed_by_peer()

    with_leader(body)


def test_pipelined_requests_are_answered_once_each_in_request_order() -> None:
    async def body(cluster: Cluster, client: RawClient) -> None:
        # A long poll first, then quick requests behind it on the same connection: the quick
        # answers wait for the poll's, as Kafka orders answers per connection.
        client.send(fetch_request({(TOPIC, 2): 0}, max_wait_ms=300), FetchResponse, FETCH_VERSION)
        client.send(ApiVersionsRequest(), ApiVersionsResponse, 3)
        client.send(MetadataRequest(topics=None), MetadataResponse, 12)
        await client.writer.drain()
        fetched = await client.receive()  # receive() checks the correlation ids, in order
        versions = await client.receive()
        metadata = await client.receive()
        assert fetched.responses[0].partitions[0].error_code == Errors.NONE
        assert versions.error_code == Errors.NONE
        assert [t.name for t in metadata.topics] == [TOPIC]
        stats = await cluster.stats()
        counters = stats["counters"]
        assert counters["requests from client"] == counters["responses to client"] == 3

    with_leader(body)
