"""Helpers for the mini broker's tests: a bounded runner, a raw protocol client, record batches.

The raw client speaks Kafka's protocol through kafka-python's message classes (as the broker
does), so a test can send exactly the request it means, bad ones included, and see the exact
error code; the real clients (aiokafka, kafka-python's producer and consumer) are used elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.schemas.fields.codecs import Int32
from kafka.record.memory_records import MemoryRecordsBuilder

from examples.minibroker.cluster import Cluster

T = TypeVar("T")

PRODUCE_VERSION = 9
FETCH_VERSION = 11


def run(main: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60) -> T:
    """Run an async test body on a fresh loop, bounded by `timeout` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(main(), timeout)

    return asyncio.run(bounded())


def batch(*values: bytes, timestamp: int | None = None) -> bytes:
    """One record batch v2 holding `values` (built by kafka-python's record builder)."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for value in values:
        builder.append(timestamp=timestamp, key=None, value=value)
    builder.close()
    return bytes(builder.buffer())


class RawClient:
    """One connection; requests written in order, responses read in order and matched by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._next_id = 0
        self.in_flight: list[tuple[int, Any, int]] = []

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, request: Any, response_cls: Any, version: int) -> int:
        """Write `request` at `version`; its answer is read by `receive`. Returns its id."""
        self._next_id += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self._next_id, client_id="raw-test")
        self.writer.write(bytes(request.encode(header=True, framed=True)))
        if request.expect_response():
            self.in_flight.append((self._next_id, response_cls, version))
        return self._next_id

    def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)

    async def receive(self) -> Any:
        """The next answer; it must be for the oldest request still in flight."""
        correlation_id, response_cls, version = self.in_flight.pop(0)
        size = Int32.decode(io.BytesIO(await self.reader.readexactly(4)))
        frame = await self.reader.readexactly(size)
        response = response_cls[version].decode(frame, header=True)
        assert response.header.correlation_id == correlation_id
        return response

    async def call(self, request: Any, response_cls: Any, version: int) -> Any:
        self.send(request, response_cls, version)
        await self.writer.drain()
        return await self.receive()

    async def is_closed_by_peer(self, timeout: float = 10) -> bool:
        """``True`` if the broker closes the connection (EOF) within `timeout` seconds."""
        try:
            data = await asyncio.wait_for(self.reader.read(1), timeout)
        except ConnectionError:
            return True
        return data == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def produce_request(
    topic: str, partition: int, records: bytes | None, *, acks: int = -1, timeout_ms: int = 10000
) -> Any:
    return ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout_ms=timeout_ms,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(
                        index=partition, records=records
                    )
                ],
            )
        ],
    )


def fetch_request(
    offsets: dict[tuple[str, int], int],
    *,
    max_wait_ms: int = 500,
    min_bytes: int = 1,
    replica_id: int = -1,
) -> Any:
    topics: dict[str, list[Any]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(
            FetchRequest.FetchTopic.FetchPartition(
                partition=partition,
                current_leader_epoch=-1,
                fetch_offset=offset,
                log_start_offset=-1,
                partition_max_bytes=1 << 20,
            )
        )
    return FetchRequest(
        replica_id=replica_id,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=1 << 24,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()],
        forgotten_topics_data=[],
        rack_id="",
    )


def produce_errors(response: Any) -> list[int]:
    return [p.error_code for t in response.responses for p in t.partition_responses]


def produce_offsets(response: Any) -> list[int]:
    return [p.base_offset for t in response.responses for p in t.partition_responses]


async def produce(client: RawClient, *args: Any, **kwargs: Any) -> Any:
    return await client.call(produce_request(*args, **kwargs), ProduceResponse, PRODUCE_VERSION)


async def fetch(client: RawClient, *args: Any, **kwargs: Any) -> Any:
    return await client.call(fetch_request(*args, **kwargs), FetchResponse, FETCH_VERSION)


async def wait_until(
    check: Callable[[], Awaitable[bool]], timeout: float = 15, interval: float = 0.05
) -> None:
    """Poll an async condition until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(interval)


async def isr_sizes(cluster: Cluster) -> list[int]:
    stats = await cluster.stats()
    return [len(p["isr"]) for p in stats["partitions"].values()]
