"""The leader: a Kafka-protocol server on asyncio streams, every wait parked in a purgatory.

One connection carries many requests in flight: each frame gets its own handler task as soon as
it is read, and a writer sends the answers in request order (Kafka's rule per connection). A
handler that waits (an ``acks=all`` produce, a long-poll fetch, a follower's fetch) awaits its
`DelayedProduce` / `DelayedFetch` in one of three purgatories; the log and the replication state
trigger them (`purgatories.trigger`) on every append and every high-watermark move. Nothing
polls, except Kafka's own periodic ISR-shrink check.

Bad input: a frame over ``max_request_bytes``, a negative size, an unreadable header or body
closes the connection (Kafka's ``InvalidReceiveException`` path); an API or version the broker
does not serve gets the protocol's ``UNSUPPORTED_VERSION`` answer where the API's response has an
error field, else the connection is closed; everything about topics, offsets, acks and records is
answered with the partition's error code.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import math
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.schemas.fields.codecs import Int32

from purgatory import DelayedOperationPurgatory, PurgatoryError

from .control import read_commands
from .log import BatchError, parse_batches
from .protocol import (
    SERVED,
    BadFrame,
    Errors,
    FetchRequest,
    FetchResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataRequest,
    MetadataResponse,
    ProduceRequest,
    ProduceResponse,
    Request,
    api_versions_response,
    decode_request,
    encode_response,
    error_response,
)
from .purgatories import (
    DelayedFetch,
    DelayedProduce,
    FetchPartition,
    ProducePartition,
    trigger,
    watch,
)
from .replication import Partition, TopicPartition

__all__ = ("BrokerConfig", "Leader")

log = logging.getLogger("minibroker.leader")

_API_VERSIONS_KEY = 18
_MAX_IN_FLIGHT = 64  # requests read ahead of their answers on one connection


@dataclass(frozen=True)
class BrokerConfig:
    """The leader's settings, named after Kafka's where Kafka has one."""

    port: int = 0
    host: str = "127.0.0.1"
    broker_id: int = 0
    follower_ids: tuple[int, ...] = (1, 2)
    topics: dict[str, int] = field(default_factory=lambda: {"demo": 4})
    min_insync_replicas: int = 2
    replica_lag_time_max_ms: int = 1000
    max_request_bytes: int = 8 * 1024 * 1024
    """``socket.request.max.bytes``: a bigger frame closes the connection."""
    max_message_bytes: int = 1024 * 1024
    """``max.message.bytes``: a bigger record batch gets ``MESSAGE_TOO_LARGE``."""


class _CloseConnection(Exception):
    """Raised by a handler for a request that has no answer: the connection is closed."""


class Leader:
    """The partition leader: serves clients and followers, owns the three purgatories."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.produce_purgatory = DelayedOperationPurgatory[DelayedProduce]("produce")
        self.fetch_purgatory = DelayedOperationPurgatory[DelayedFetch]("fetch")
        self.follower_purgatory = DelayedOperationPurgatory[DelayedFetch]("follower-fetch")
        self.partitions: dict[TopicPartition, Partition] = {}
        self.port = config.port
        self.isr_changes: list[str] = []
        self.followers_seen: set[int] = set()
        self.counters: Counter[str] = Counter()
        self.peaks: dict[str, int] = {}
        self._next_producer_id = 1000
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._isr_task: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the partitions, start the ISR check, listen; `port` is then the bound port."""
        loop = asyncio.get_running_loop()
        for topic, count in self.config.topics.items():
            for index in range(count):
                key = (topic, index)
                self.partitions[key] = Partition(
                    key=key,
                    leader_id=self.config.broker_id,
                    follower_ids=self.config.follower_ids,
                    min_insync=self.config.min_insync_replicas,
                    lag_max=self.config.replica_lag_time_max_ms / 1000,
                    on_append=self._appended,
                    on_high_watermark=self._high_watermark_moved,
                    on_isr_change=self._isr_changed,
                    now=loop.time(),
                )
        self._isr_task = asyncio.create_task(self._shrink_isr_periodically())
        self._server = await asyncio.start_server(
            self._serve_connection, self.config.host, self.config.port
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening, drop the connections, cancel what waits: a clean stop."""
        if self._server is not None:
            self._server.close()
        tasks: list[asyncio.Task[None]] = list(self._connections)
        if self._isr_task is not None:
            self._isr_task.cancel()
            tasks.append(self._isr_task)
        # Closing a connection's socket ends its reader, which cancels what that connection
        # still waits for; its task then ends normally (cancelling it would be logged).
        for writer in self._connections.values():
            writer.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        for purgatory in self._purgatories():
            await purgatory.shutdown()
        if self._server is not None:
            await self._server.wait_closed()

    def _purgatories(self) -> tuple[DelayedOperationPurgatory[Any], ...]:
        return (self.produce_purgatory, self.fetch_purgatory, self.follower_purgatory)

    # -- what the replication state tells us -----------------------------------------------------

    def _appended(self, partition: Partition) -> None:
        # Followers wait for the log end to pass their fetch offset.
        trigger(self.follower_purgatory, partition.key, partition.log_end_offset)

    def _high_watermark_moved(self, partition: Partition) -> None:
        # acks=all produces and consumer fetches wait for the high watermark.
        trigger(self.produce_purgatory, partition.key, partition.high_watermark)
        trigger(self.fetch_purgatory, partition.key, partition.high_watermark)

    def _isr_changed(self, partition: Partition, what: str) -> None:
        self.isr_changes.append(what)
        log.info("%s; ISR now %s", what, partition.isr_list())

    async def _shrink_isr_periodically(self) -> None:
        """Kafka's ``isr-expiration`` task: every half ``replica.lag.time.max.ms``."""
        interval = self.config.replica_lag_time_max_ms / 2000
        while True:
            await asyncio.sleep(interval)
            now = asyncio.get_running_loop().time()
            for partition in self.partitions.values():
                partition.shrink_isr(now)

    # -- statistics ------------------------------------------------------------------------------

    def _sample_peaks(self) -> None:
        peaks = self.peaks
        for purgatory in self._purgatories():
            for gauge, value in (
                ("watched", purgatory.watched()),
                ("delayed", purgatory.num_delayed()),
            ):
                name = f"{purgatory.name}.{gauge}"
                if value > peaks.get(name, 0):
                    peaks[name] = value

    def statistics(self, *, purge: bool = True) -> dict[str, Any]:
        """Gauges, counters and peaks, as one JSON-able dict (the ``stats`` admin command).

        With `purge`, finished entries are purged first (``purge()``), so that ``watched()``
        counts only what really still waits, not what Kafka's lazy purge has yet to remove.
        """
        self._sample_peaks()
        purgatories: dict[str, Any] = {}
        for purgatory in self._purgatories():
            if purge:
                purgatory.purge()
            stats = purgatory.statistics()
            purgatories[purgatory.name] = {
                "watched": purgatory.watched(),
                "delayed": purgatory.num_delayed(),
                "completed": stats.completed,
                "expired": stats.expired,
                "cancelled": stats.cancelled,
            }
        return {
            "purgatories": purgatories,
            "peaks": dict(self.peaks),
            "counters": dict(self.counters),
            "isr_changes": list(self.isr_changes),
            "followers_seen": sorted(self.followers_seen),
            "partitions": {
                f"{topic}-{index}": {
                    "log_end_offset": p.log_end_offset,
                    "high_watermark": p.high_watermark,
                    "isr": p.isr_list(),
                }
                for (topic, index), p in sorted(self.partitions.items())
            },
        }

    # -- connections -----------------------------------------------------------------------------

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        answers: asyncio.Queue[tuple[asyncio.Task[bytes | None], str]]
        answers = asyncio.Queue(_MAX_IN_FLIGHT)
        sender = asyncio.create_task(self._send_in_order(answers, writer))
        try:
            while not sender.done():
                try:
                    size = Int32.decode(io.BytesIO(await reader.readexactly(4)))
                    if not 0 < size <= self.config.max_request_bytes:
                        self.counters["closed: frame size"] += 1
                        log.warning("closing a connection: frame size %d", size)
                        break
                    frame = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                try:
                    request = decode_request(frame)
                except BadFrame as exc:
                    self.counters["closed: bad frame"] += 1
                    log.warning("closing a connection: %s", exc)
                    break
                # Counted apart, so that "every client request answered once" can be checked
                # while the followers' own fetches are still in flight.
                replica = getattr(request.body, "replica_id", -1) if request.api_key == 1 else -1
                origin = "follower" if isinstance(replica, int) and replica >= 0 else "client"
                self.counters[f"requests from {origin}"] += 1
                self._sample_peaks()
                await answers.put((asyncio.create_task(self._answer(request)), origin))
        finally:
            # Whatever is still waiting is cancelled, and with it its purgatory operation.
            while not answers.empty():
                answers.get_nowait()[0].cancel()
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self._connections.pop(task, None)

    async def _send_in_order(
        self,
        answers: asyncio.Queue[tuple[asyncio.Task[bytes | None], str]],
        writer: asyncio.StreamWriter,
    ) -> None:
        """Write each answer once it is ready, in request order; stop at a closing answer."""
        try:
            while True:
                pending, origin = await answers.get()
                try:
                    data = await pending
                except _CloseConnection:
                    break
                if data is not None:
                    writer.write(data)
                    await writer.drain()
                    self.counters[f"responses to {origin}"] += 1
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _answer(self, request: Request) -> bytes | None:
        """The framed answer to `request`, ``None`` for acks=0; raises `_CloseConnection`."""
        try:
            return await self._dispatch(request)
        except (_CloseConnection, asyncio.CancelledError):
            raise
        except PurgatoryError as exc:  # shutting down
            raise _CloseConnection from exc
        except Exception as exc:  # a bug of ours: say so, and close this connection only
            log.exception("handler failed for api %d v%d", request.api_key, request.api_version)
            raise _CloseConnection from exc

    async def _dispatch(self, request: Request) -> bytes | None:
        key, version = request.api_key, request.api_version
        if key == _API_VERSIONS_KEY:
            if request.body is None or version > SERVED[key][1]:
                self.counters["unsupported"] += 1
                return encode_response(
                    request, api_versions_response(0, Errors.UNSUPPORTED_VERSION), version=0
                )
            return encode_response(request, api_versions_response(version))
        served = SERVED.get(key)
        if served is None or not served[0] <= version <= served[1]:
            self.counters["unsupported"] += 1
            answer = error_response(request, Errors.UNSUPPORTED_VERSION)
            if answer is None:
                log.warning("closing a connection: api %d v%d has no answer", key, version)
                raise _CloseConnection
            return encode_response(request, answer)
        body = request.body
        response: Any
        if key == ProduceRequest.API_KEY:
            response = await self._produce(body)
            if response is None:
                return None
        elif key == FetchRequest.API_KEY:
            response = await self._fetch(body)
        elif key == MetadataRequest.API_KEY:
            response = self._metadata(body, version)
        elif key == ListOffsetsRequest.API_KEY:
            response = self._list_offsets(body)
        elif key == InitProducerIdRequest.API_KEY:
            response = self._init_producer_id(body)
        else:  # pragma: no cover - SERVED and this dispatch list the same APIs
            raise _CloseConnection
        return encode_response(request, response)

    # -- Metadata, ListOffsets, InitProducerId -------------------------------------------------

    def _metadata(self, body: Any, version: int) -> Any:
        wanted: list[str]
        if body.topics is None or (version == 0 and not body.topics):
            wanted = sorted(self.config.topics)
        else:
            wanted = [topic.name for topic in body.topics]
        topics = []
        for name in wanted:
            count = self.config.topics.get(name)
            if count is None:
                topics.append(
                    MetadataResponse.MetadataResponseTopic(
                        error_code=Errors.UNKNOWN_TOPIC_OR_PARTITION, name=name, partitions=[]
                    )
                )
                continue
            partitions = []
            for index in range(count):
                partition = self.partitions[(name, index)]
                partitions.append(
                    MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
                        error_code=Errors.NONE,
                        partition_index=index,
                        leader_id=self.config.broker_id,
                        leader_epoch=-1,
                        replica_nodes=[self.config.broker_id, *self.config.follower_ids],
                        isr_nodes=partition.isr_list(),
                        offline_replicas=[],
                    )
                )
            topics.append(
                MetadataResponse.MetadataResponseTopic(
                    error_code=Errors.NONE, name=name, is_internal=False, partitions=partitions
                )
            )
        # Only the leader takes clients: followers are replication processes with no listener.
        broker = MetadataResponse.MetadataResponseBroker(
            node_id=self.config.broker_id, host=self.config.host, port=self.port, rack=None
        )
        return MetadataResponse(
            throttle_time_ms=0,
            brokers=[broker],
            cluster_id="minibroker",
            controller_id=self.config.broker_id,
            topics=topics,
        )

    def _list_offsets(self, body: Any) -> Any:
        topics = []
        for topic in body.topics:
            answers = []
            for asked in topic.partitions:
                partition = self.partitions.get((topic.name, asked.partition_index))
                error, offset, timestamp = Errors.NONE, -1, -1
                if partition is None:
                    error = Errors.UNKNOWN_TOPIC_OR_PARTITION
                elif asked.timestamp == -1:  # latest: what a consumer may read up to
                    offset = partition.high_watermark
                elif asked.timestamp == -2:  # earliest
                    offset = 0
                elif asked.timestamp < 0:
                    error = Errors.UNSUPPORTED_VERSION  # -3 and later specs need newer versions
                else:
                    found = partition.log.offset_for_timestamp(asked.timestamp)
                    if found is not None and found < partition.high_watermark:
                        offset, timestamp = found, asked.timestamp
                answers.append(
                    ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                        partition_index=asked.partition_index,
                        error_code=error,
                        timestamp=timestamp,
                        offset=offset,
                        leader_epoch=-1,
                    )
                )
            topics.append(
                ListOffsetsResponse.ListOffsetsTopicResponse(name=topic.name, partitions=answers)
            )
        return ListOffsetsResponse(throttle_time_ms=0, topics=topics)

    def _init_producer_id(self, body: Any) -> Any:
        """Idempotent producers (kafka-python's and Java's default) need a producer id."""
        if body.transactional_id:
            return InitProducerIdResponse(
                error_code=Errors.UNSUPPORTED_VERSION, producer_id=-1, producer_epoch=-1
            )
        self._next_producer_id += 1
        return InitProducerIdResponse(
            throttle_time_ms=0,
            error_code=Errors.NONE,
            producer_id=self._next_producer_id,
            producer_epoch=0,
        )

    # -- Produce -------------------------------------------------------------------------------

    async def _produce(self, body: Any) -> Any | None:
        acks = body.acks
        statuses: dict[TopicPartition, ProducePartition] = {}
        for topic in body.topic_data:
            for data in topic.partition_data:
                key = (topic.name, data.index)
                statuses[key] = self._append(key, data.records, acks)
        self.counters[f"produce acks={acks}"] += 1
        if acks == 0:
            # No answer at all, as Kafka; an error can only be told by closing the connection.
            if any(status.error_code != Errors.NONE for status in statuses.values()):
                raise _CloseConnection
            return None
        waiting = {
            key: status.required_offset
            for key, status in statuses.items()
            if status.partition is not None and not status.done
        }
        if waiting:
            timeout = max(0, body.timeout_ms) / 1000  # a negative timeout expires at once
            statuses = await watch(
                self.produce_purgatory, DelayedProduce(timeout, statuses), waiting
            )
        for status in statuses.values():
            self.counters[f"produce partition error {status.error_code}"] += 1
        by_topic: dict[str, list[Any]] = {}
        for (topic_name, index), status in statuses.items():
            by_topic.setdefault(topic_name, []).append(
                ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                    index=index,
                    error_code=status.error_code,
                    base_offset=status.base_offset,
                    log_append_time_ms=-1,
                    log_start_offset=0,
                )
            )
        return ProduceResponse(
            throttle_time_ms=0,
            responses=[
                ProduceResponse.TopicProduceResponse(name=name, partition_responses=answers)
                for name, answers in by_topic.items()
            ],
        )

    def _append(self, key: TopicPartition, records: Any, acks: int) -> ProducePartition:
        """Check and append one partition's batches (Kafka ``appendRecordsToLeader``)."""
        if acks not in (-1, 0, 1):
            return ProducePartition(None, error_code=Errors.INVALID_REQUIRED_ACKS)
        partition = self.partitions.get(key)
        if partition is None:
            return ProducePartition(None, error_code=Errors.UNKNOWN_TOPIC_OR_PARTITION)
        try:
            batches = parse_batches(records, self.config.max_message_bytes)
        except BatchError as exc:
            return ProducePartition(None, error_code=exc.code)
        if acks == -1 and len(partition.isr) < partition.min_insync:
            # Refused before the append: too few replicas to promise anything.
            return ProducePartition(None, error_code=Errors.NOT_ENOUGH_REPLICAS)
        first, last = partition.append(batches)
        return ProducePartition(
            partition, base_offset=first, required_offset=last + 1, done=acks != -1
        )

    # -- Fetch ---------------------------------------------------------------------------------

    async def _fetch(self, body: Any) -> Any:
        replica = body.replica_id
        follower = replica >= 0
        now = asyncio.get_running_loop().time()
        fetches: list[FetchPartition] = []
        for topic in body.topics:
            for asked in topic.partitions:
                key = (topic.topic, asked.partition)
                partition = self.partitions.get(key)
                fetch = FetchPartition(
                    key, partition, asked.fetch_offset, asked.partition_max_bytes
                )
                fetches.append(fetch)
                if partition is None:
                    fetch.error_code = Errors.UNKNOWN_TOPIC_OR_PARTITION
                elif follower and replica not in partition.followers:
                    fetch.error_code = Errors.REPLICA_NOT_AVAILABLE
                elif not 0 <= asked.fetch_offset <= partition.log_end_offset:
                    fetch.error_code = Errors.OFFSET_OUT_OF_RANGE
                elif follower:
                    partition.follower_fetch(replica, asked.fetch_offset, now)
                    self.followers_seen.add(replica)
        limit = _log_end if follower else _high_watermark
        purgatory = self.follower_purgatory if follower else self.fetch_purgatory
        op = DelayedFetch(max(0, body.max_wait_ms) / 1000, fetches, body.min_bytes, limit)
        kind = "follower" if follower else "consumer"
        self.counters[f"fetch {kind}"] += 1
        immediate = (
            body.max_wait_ms <= 0
            or not fetches
            or any(fetch.error_code != Errors.NONE for fetch in fetches)
            or op.readable_bytes() >= body.min_bytes
        )
        if not immediate:
            thresholds = {fetch.key: fetch.offset + 1 for fetch in fetches}
            await watch(purgatory, op, thresholds)
            self.counters[f"fetch {kind} parked {'expired' if op.is_expired else 'data'}"] += 1
        return self._fetch_response(fetches, limit, body.max_bytes)

    def _fetch_response(
        self, fetches: list[FetchPartition], limit: Callable[[Partition], int], max_bytes: int
    ) -> Any:
        by_topic: dict[str, list[Any]] = {}
        budget = max_bytes
        for fetch in fetches:
            partition = fetch.partition
            records = b""
            high_watermark = -1
            if partition is not None:
                high_watermark = partition.high_watermark
                if fetch.error_code == Errors.NONE:
                    records = partition.log.read(
                        fetch.offset,
                        limit(partition),
                        min(fetch.max_bytes, budget),
                        at_least_one=budget == max_bytes,
                    )
                    budget = max(0, budget - len(records))
            by_topic.setdefault(fetch.key[0], []).append(
                FetchResponse.FetchableTopicResponse.PartitionData(
                    partition_index=fetch.key[1],
                    error_code=fetch.error_code,
                    high_watermark=high_watermark,
                    last_stable_offset=high_watermark,
                    log_start_offset=0,
                    aborted_transactions=None,
                    preferred_read_replica=-1,
                    records=records,
                )
            )
        return FetchResponse(
            throttle_time_ms=0,
            error_code=Errors.NONE,
            session_id=0,
            responses=[
                FetchResponse.FetchableTopicResponse(topic=name, partitions=partitions)
                for name, partitions in by_topic.items()
            ],
        )


def _log_end(partition: Partition) -> int:
    return partition.log_end_offset


def _high_watermark(partition: Partition) -> int:
    return partition.high_watermark


async def run_leader(config: BrokerConfig, *, control_stdin: bool = False) -> None:
    """Run a leader until SIGINT/SIGTERM; print ``bootstrap HOST:PORT`` once it listens.

    With `control_stdin`, read commands from stdin (``stats`` prints one line ``stats {json}``,
    ``stop`` stops) and stop when stdin ends (see `control`).
    """
    leader = Leader(config)
    await leader.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"bootstrap {config.host}:{leader.port}", flush=True)

    def command(line: str) -> None:
        if line == "stats":
            stats = leader.statistics()
            print("stats " + json.dumps(stats, default=_finite), flush=True)
        elif line == "stop":
            stop.set()

    control = asyncio.create_task(read_commands(command, stop)) if control_stdin else None
    await stop.wait()
    if control is not None:
        control.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await control
    await leader.stop()


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON-able: {value!r}")
