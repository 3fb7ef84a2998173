"""A follower: a separate process that replicates the leader's partitions by fetching, as Kafka's.

Kafka's ``ReplicaFetcherThread`` loop, in small: one Fetch request for all partitions, carrying
this broker's replica id and, per partition, the follower's log end offset as the fetch offset;
append what comes back; repeat. The leader learns the follower's progress from those offsets (and
parks the fetch in its follower-fetch purgatory when there is nothing new). The follower keeps its
log in memory: after a restart it starts empty and catches up from offset 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import math
import signal
from typing import Any

from kafka.protocol.schemas.fields.codecs import Int32

from .control import read_commands
from .log import PartitionLog
from .protocol import Errors, FetchRequest, FetchResponse, MetadataRequest, MetadataResponse

__all__ = ("run_follower",)

log = logging.getLogger("minibroker.follower")

_FETCH_VERSION = 12
_METADATA_VERSION = 9
_METADATA_REFRESH_S = 0.2


class _Connection:
    """One request at a time to the leader, over kafka-python's message classes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._correlation = 0

    async def call(self, request: Any, response_cls: Any, version: int, client_id: str) -> Any:
        self._correlation += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self._correlation, client_id=client_id)
        self.writer.write(bytes(request.encode(header=True, framed=True)))
        await self.writer.drain()
        size = Int32.decode(io.BytesIO(await self.reader.readexactly(4)))
        frame = await self.reader.readexactly(size)
        response = response_cls[version].decode(frame, header=True)
        if response.header.correlation_id != self._correlation:
            raise ConnectionError("correlation id mismatch")
        return response

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def _replicate(
    broker_id: int,
    host: str,
    port: int,
    logs: dict[tuple[str, int], PartitionLog],
    max_wait_ms: int,
) -> None:
    """Connect, then fetch forever (until the connection breaks).

    The partitions are learnt from the leader's Metadata, asked again every 0.2 s: topics are
    created on first use, and a new one is replicated from its first record.
    """
    client_id = f"minibroker-follower-{broker_id}"
    loop = asyncio.get_running_loop()
    conn = _Connection(*await asyncio.open_connection(host, port))
    try:
        refreshed = -math.inf
        while True:
            if loop.time() - refreshed >= _METADATA_REFRESH_S:
                # Topics appear on first use: learn the new partitions (Kafka's controller
                # would tell the replicas; asking the leader now and then does it here).
                refreshed = loop.time()
                metadata = await conn.call(
                    MetadataRequest(topics=None, allow_auto_topic_creation=False),
                    MetadataResponse,
                    _METADATA_VERSION,
                    client_id,
                )
                for topic in metadata.topics:
                    for partition in topic.partitions:
                        logs.setdefault((topic.name, partition.partition_index), PartitionLog())
            by_topic: dict[str, list[Any]] = {}
            for (topic_name, index), partition_log in sorted(logs.items()):
                by_topic.setdefault(topic_name, []).append(
                    FetchRequest.FetchTopic.FetchPartition(
                        partition=index,
                        current_leader_epoch=-1,
                        fetch_offset=partition_log.log_end_offset,
                        log_start_offset=0,
                        partition_max_bytes=1024 * 1024,
                    )
                )
            request = FetchRequest(
                replica_id=broker_id,
                max_wait_ms=max_wait_ms,
                min_bytes=1,
                max_bytes=8 * 1024 * 1024,
                isolation_level=0,
                session_id=0,
                session_epoch=-1,
                topics=[
                    FetchRequest.FetchTopic(topic=name, partitions=partitions)
                    for name, partitions in by_topic.items()
                ],
                forgotten_topics_data=[],
                rack_id="",
            )
            response = await conn.call(request, FetchResponse, _FETCH_VERSION, client_id)
            refused = False
            for topic in response.responses:
                for data in topic.partitions:
                    key = (topic.topic, data.partition_index)
                    partition_log = logs[key]
                    if data.error_code == Errors.OFFSET_OUT_OF_RANGE:
                        # Ahead of the leader (it restarted empty): start over, as a new replica.
                        logs[key] = PartitionLog()
                    elif data.error_code == Errors.NONE and data.records:
                        partition_log.append_replicated(bytes(data.records))
                    refused = refused or data.error_code != Errors.NONE
            if refused:
                await asyncio.sleep(0.1)  # an error is answered at once: do not spin on it
            elif not logs:  # no topic yet: the empty fetch only said hello; wait for one
                await asyncio.sleep(_METADATA_REFRESH_S)
    finally:
        await conn.close()


async def run_follower(
    broker_id: int,
    host: str,
    port: int,
    *,
    max_wait_ms: int = 200,
    control_stdin: bool = False,
) -> None:
    """Replicate from the leader at `host`:`port` until SIGINT/SIGTERM; reconnect on failure.

    With `control_stdin`, also stop when stdin ends (the parent is gone; see `control`).
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if control_stdin:
        control = asyncio.create_task(read_commands(lambda line: None, stop))
    logs: dict[tuple[str, int], PartitionLog] = {}
    while not stop.is_set():
        task = asyncio.create_task(_replicate(broker_id, host, port, logs, max_wait_ms))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not task.done():
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except (OSError, asyncio.IncompleteReadError) as exc:
            log.info("follower %d: connection to the leader lost (%r); retrying", broker_id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    if control_stdin:
        control.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await control
