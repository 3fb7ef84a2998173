"""Request handling: one handler per API, request in, response out (Kafka's KafkaApis).

`KafkaApis.handle` checks the version against `protocol.SERVED` and dispatches; each handler
reads the request's fields, asks the replica manager (produce, fetch, offsets) or the group
coordinator (groups, committed offsets), and builds the response from kafka-python's classes.
An API or version the broker does not serve gets the protocol's ``UNSUPPORTED_VERSION`` answer
where the API's response has an error field, else the connection is closed; everything about
topics, offsets, acks, records and groups is answered with Kafka's error codes.

Topics are created on first use, as Kafka's ``auto.create.topics.enable``: a Metadata request
naming an unknown topic creates it with the default partition count; CreateTopics creates them
on demand. A name Kafka refuses (`topics.invalid_name`) gets ``INVALID_TOPIC_EXCEPTION`` and
creates nothing. With creation off, unknown topics get ``UNKNOWN_TOPIC_OR_PARTITION``; the
broker logs the first request for each unknown or invalid name.

Transactions have no coordinator here: FindCoordinator for a transactional id, and
InitProducerId with one, are answered ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED`` with a message,
the one refusal that kafka-python, aiokafka and librdkafka all treat as final (any other error
they retry until their own timeout, 20 s to minutes), and the broker logs one warning per
transactional id.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from .coordinator import GroupCoordinator
from .network import CloseConnection
from .protocol import (
    SERVED,
    ApiVersionsRequest,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    Errors,
    FetchRequest,
    FetchResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    ProduceRequest,
    ProduceResponse,
    Request,
    SyncGroupRequest,
    SyncGroupResponse,
    api_versions_response,
    encode_response,
    error_response,
)
from .replica_manager import ReplicaManager
from .replication import TopicPartition
from .stats import BrokerStats
from .topics import collision, invalid_name

__all__ = ("KafkaApis",)

log = logging.getLogger("minibroker.apis")

_NO_TRANSACTIONS = "transactions are not supported by this broker (minibroker)"

# Authorized operations as kafka-python's bit field takes them: the bits set, or None for
# Kafka's "not computed" (-2147483648, bit 31 alone) when a client did not ask.
_GROUP_OPERATIONS = frozenset({3, 8})  # Kafka's AclOperation READ and DESCRIBE

_Handler = Callable[["KafkaApis", Request], Any]


class KafkaApis:
    """Answers each request of every connection (`network.SocketServer`'s handler)."""

    def __init__(
        self,
        *,
        broker_id: int,
        host: str,
        port: Callable[[], int],
        replicas: ReplicaManager,
        coordinator: GroupCoordinator,
        stats: BrokerStats,
        auto_create_topics: bool,
        default_partitions: int,
    ) -> None:
        self.broker_id = broker_id
        self.host = host
        self._port = port
        self.replicas = replicas
        self.coordinator = coordinator
        self.auto_create_topics = auto_create_topics
        self.default_partitions = default_partitions
        self._counters = stats.counters
        self._next_producer_id = 1000
        self._warned: set[tuple[str, str]] = set()

    async def handle(self, request: Request) -> bytes | None:
        """The framed answer to `request`, ``None`` for acks=0; raises `CloseConnection`."""
        key, version = request.api_key, request.api_version
        if key == ApiVersionsRequest.API_KEY:
            if request.body is None or version > SERVED[key][1]:
                self._counters["unsupported"] += 1
                return encode_response(
                    request, api_versions_response(0, Errors.UNSUPPORTED_VERSION), version=0
                )
            return encode_response(request, api_versions_response(version))
        served = SERVED.get(key)
        if served is None or not served[0] <= version <= served[1]:
            self._counters["unsupported"] += 1
            answer = error_response(request, Errors.UNSUPPORTED_VERSION)
            if answer is None:
                log.warning("closing a connection: api %d v%d has no answer", key, version)
                raise CloseConnection
            log.info("api %d v%d is not served: UNSUPPORTED_VERSION", key, version)
            return encode_response(request, answer)
        self._counters[f"api {key} v{version}"] += 1  # which versions the clients chose
        response = await _HANDLERS[key](self, request)
        if response is None:
            return None
        return encode_response(request, response)

    def _warn_once(self, kind: str, name: str, message: str, *args: object) -> None:
        """Log `message` for the first request about `name` only (per `kind`): a client that
        retries must not flood the log."""
        if (kind, name) not in self._warned:
            self._warned.add((kind, name))
            log.warning(message, *args)

    def _unknown_topic(self, name: str, what: str) -> int:
        """Log the first request for each unknown topic; the error code to answer."""
        creation = "on" if self.auto_create_topics else "off"
        message = "%s for unknown topic %r: UNKNOWN_TOPIC_OR_PARTITION (auto-creation %s)"
        self._warn_once("topic", name, message, what, name, creation)
        return Errors.UNKNOWN_TOPIC_OR_PARTITION

    def _invalid_topic(self, name: str, reason: str, what: str) -> int:
        """Log the first request for each invalid name; the error code to answer."""
        message = "%s for invalid topic %r: INVALID_TOPIC_EXCEPTION (%s)"
        self._warn_once("topic", name, message, what, name, reason)
        return Errors.INVALID_TOPIC_EXCEPTION

    def _refuse_transactions(self, transactional_id: str, what: str) -> int:
        """Log the first request for each transactional id; the error code to answer."""
        message = "%s for transactional id %r: TRANSACTIONAL_ID_AUTHORIZATION_FAILED (%s)"
        self._warn_once(
            "transactional id", transactional_id, message, what, transactional_id, _NO_TRANSACTIONS
        )
        return Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    def _create_on_first_use(self, name: str, *, allow: bool) -> int | None:
        """Kafka's auto-creation of unknown topic `name`: ``None`` once it exists, else the
        error to answer. A name Kafka refuses is refused whether creation is on or not."""
        reason = invalid_name(name)
        if reason is not None:
            return self._invalid_topic(name, reason, "metadata")
        if not (self.auto_create_topics and allow):
            return self._unknown_topic(name, "metadata")
        reason = collision(name, self.replicas.topics)
        if reason is not None:
            return self._invalid_topic(name, reason, "metadata")
        self.replicas.create_topic(name, self.default_partitions)
        log.info("created topic %r with %d partitions", name, self.default_partitions)
        return None

    # -- Metadata, ListOffsets, InitProducerId -------------------------------------------------

    async def _metadata(self, request: Request) -> Any:
        body, version = request.body, request.api_version
        topics_known = self.replicas.topics
        wanted: list[str]
        if body.topics is None or (version == 0 and not body.topics):
            wanted = sorted(topics_known)
        else:
            wanted = [topic.name for topic in body.topics]
        # Metadata v0-3 always allows creation; v4+ says so (the followers say no).
        allow = version < 4 or body.allow_auto_topic_creation
        topics = []
        for name in wanted:
            if name not in topics_known:
                error = self._create_on_first_use(name, allow=allow)
                if error is not None:
                    topics.append(
                        MetadataResponse.MetadataResponseTopic(
                            error_code=error, name=name, partitions=[]
                        )
                    )
                    continue
            count = topics_known[name]
            partitions = []
            for index in range(count):
                partition = self.replicas.partitions[(name, index)]
                partitions.append(
                    MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
                        error_code=Errors.NONE,
                        partition_index=index,
                        leader_id=self.broker_id,
                        leader_epoch=-1,
                        replica_nodes=[self.broker_id, *partition.follower_ids],
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
            node_id=self.broker_id, host=self.host, port=self._port(), rack=None
        )
        return MetadataResponse(
            throttle_time_ms=0,
            brokers=[broker],
            cluster_id="minibroker",
            controller_id=self.broker_id,
            topics=topics,
        )

    async def _list_offsets(self, request: Request) -> Any:
        topics = []
        for topic in request.body.topics:
            answers = []
            for asked in topic.partitions:
                partition = self.replicas.partitions.get((topic.name, asked.partition_index))
                error, offset, timestamp = Errors.NONE, -1, -1
                if partition is None:
                    error = self._unknown_topic(topic.name, "ListOffsets")
                elif asked.timestamp == -1:  # latest: what a consumer may read up to
                    offset = partition.high_watermark
                elif asked.timestamp == -2:  # earliest
                    offset = 0
                elif asked.timestamp < 0:
                    error = Errors.UNSUPPORTED_VERSION  # -3 and later specs need newer versions
                else:
                    # Kafka's answer: the first offset whose timestamp is at or after the one
                    # asked, with that record's own timestamp; -1 / -1 when there is none.
                    found = partition.log.offset_for_timestamp(asked.timestamp)
                    if found is not None and found[0] < partition.high_watermark:
                        offset, timestamp = found
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

    async def _init_producer_id(self, request: Request) -> Any:
        """Idempotent producers (kafka-python's and Java's default) need a producer id."""
        transactional_id = request.body.transactional_id
        if transactional_id:
            error = self._refuse_transactions(transactional_id, "InitProducerId")
            return InitProducerIdResponse(
                throttle_time_ms=0, error_code=error, producer_id=-1, producer_epoch=-1
            )
        self._next_producer_id += 1
        return InitProducerIdResponse(
            throttle_time_ms=0,
            error_code=Errors.NONE,
            producer_id=self._next_producer_id,
            producer_epoch=0,
        )

    # -- Produce, Fetch --------------------------------------------------------------------------

    async def _produce(self, request: Request) -> Any | None:
        body = request.body
        acks = body.acks
        entries = [
            ((topic.name, data.index), data.records)
            for topic in body.topic_data
            for data in topic.partition_data
        ]
        for (name, _), _records in entries:
            if name not in self.replicas.topics:
                self._unknown_topic(name, "produce")
        self._counters[f"produce acks={acks}"] += 1
        statuses = await self.replicas.append_records(acks, body.timeout_ms, entries)
        if acks == 0:
            # No answer at all, as Kafka; an error can only be told by closing the connection.
            if any(status.error_code != Errors.NONE for status in statuses.values()):
                raise CloseConnection
            return None
        for status in statuses.values():
            self._counters[f"produce partition error {status.error_code}"] += 1
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

    async def _fetch(self, request: Request) -> Any:
        body = request.body
        asked = [
            ((topic.topic, p.partition), p.fetch_offset, p.partition_max_bytes)
            for topic in body.topics
            for p in topic.partitions
        ]
        if body.replica_id < 0:
            for (name, _), _offset, _max in asked:
                if name not in self.replicas.topics:
                    self._unknown_topic(name, "fetch")
        fetched = await self.replicas.fetch_messages(
            body.replica_id, body.max_wait_ms, body.min_bytes, body.max_bytes, asked
        )
        by_topic: dict[str, list[Any]] = {}
        for part in fetched:
            by_topic.setdefault(part.key[0], []).append(
                FetchResponse.FetchableTopicResponse.PartitionData(
                    partition_index=part.key[1],
                    error_code=part.error_code,
                    high_watermark=part.high_watermark,
                    last_stable_offset=part.high_watermark,
                    log_start_offset=0,
                    aborted_transactions=None,
                    preferred_read_replica=-1,
                    records=part.records,
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

    # -- groups ------------------------------------------------------------------------------

    async def _find_coordinator(self, request: Request) -> Any:
        """This broker coordinates every group; transactions have no coordinator here."""
        body, version = request.body, request.api_version
        keys = body.coordinator_keys if version >= 4 else [body.key]
        key_type = body.key_type if version >= 1 else 0
        answers = [self._coordinator_for(key, key_type) for key in keys]
        if version < 4:
            ((_, node, host, port, error, message),) = answers
            return FindCoordinatorResponse(
                throttle_time_ms=0,
                error_code=error,
                error_message=message,
                node_id=node,
                host=host,
                port=port,
            )
        return FindCoordinatorResponse(
            throttle_time_ms=0,
            coordinators=[
                FindCoordinatorResponse.Coordinator(
                    key=key, node_id=node, host=host, port=port, error_code=error, error_message=msg
                )
                for key, node, host, port, error, msg in answers
            ],
        )

    def _coordinator_for(
        self, key: str, key_type: int
    ) -> tuple[str, int, str, int, int, str | None]:
        """(key, node, host, port, error, message) for one coordinator asked for."""
        if key_type == 0:  # a group: this broker
            return key, self.broker_id, self.host, self._port(), Errors.NONE, None
        if key_type == 1:  # a transactional id
            error = self._refuse_transactions(key, "FindCoordinator")
            return key, -1, "", -1, error, _NO_TRANSACTIONS
        return key, -1, "", -1, Errors.INVALID_REQUEST, f"unknown coordinator type {key_type}"

    async def _join_group(self, request: Request) -> Any:
        body, version = request.body, request.api_version
        self._counters["join group"] += 1
        result = await self.coordinator.join_group(
            body.group_id,
            body.member_id,
            client_id=request.client_id or "",
            client_host=request.client_host,
            session_timeout_ms=body.session_timeout_ms,
            rebalance_timeout_ms=body.rebalance_timeout_ms,
            protocol_type=body.protocol_type,
            protocols=[(protocol.name, bytes(protocol.metadata)) for protocol in body.protocols],
            require_known_member_id=version >= 4,
        )
        return JoinGroupResponse(
            throttle_time_ms=0,
            error_code=result.error_code,
            generation_id=result.generation_id,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name if version >= 7 else result.protocol_name or "",
            leader=result.leader_id,
            member_id=result.member_id,
            members=[
                JoinGroupResponse.JoinGroupResponseMember(
                    member_id=member_id, group_instance_id=None, metadata=metadata
                )
                for member_id, metadata in result.members
            ],
        )

    async def _sync_group(self, request: Request) -> Any:
        body, version = request.body, request.api_version
        result = await self.coordinator.sync_group(
            body.group_id,
            body.generation_id,
            body.member_id,
            protocol_type=body.protocol_type if version >= 5 else None,
            protocol_name=body.protocol_name if version >= 5 else None,
            assignments=[(a.member_id, bytes(a.assignment)) for a in body.assignments],
        )
        return SyncGroupResponse(
            throttle_time_ms=0,
            error_code=result.error_code,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            assignment=result.assignment,
        )

    async def _heartbeat(self, request: Request) -> Any:
        body = request.body
        error = self.coordinator.heartbeat(body.group_id, body.member_id, body.generation_id)
        return HeartbeatResponse(throttle_time_ms=0, error_code=error)

    async def _leave_group(self, request: Request) -> Any:
        body, version = request.body, request.api_version
        if version < 3:
            (error,) = self.coordinator.leave_group(body.group_id, [body.member_id])
            return LeaveGroupResponse(throttle_time_ms=0, error_code=error)
        ids = [member.member_id for member in body.members]
        errors = self.coordinator.leave_group(body.group_id, ids)
        return LeaveGroupResponse(
            throttle_time_ms=0,
            error_code=Errors.NONE,
            members=[
                LeaveGroupResponse.MemberResponse(
                    member_id=member.member_id,
                    group_instance_id=member.group_instance_id,
                    error_code=error,
                )
                for member, error in zip(body.members, errors, strict=True)
            ],
        )

    async def _offset_commit(self, request: Request) -> Any:
        body = request.body
        for topic in body.topics:
            if topic.name not in self.replicas.topics:
                self._unknown_topic(topic.name, "offset commit")
        codes = self.coordinator.commit_offsets(
            body.group_id,
            body.generation_id_or_member_epoch,
            body.member_id,
            [
                ((topic.name, p.partition_index), p.committed_offset, p.committed_metadata)
                for topic in body.topics
                for p in topic.partitions
            ],
        )
        by_topic: dict[str, list[Any]] = {}
        for (name, index), error in codes.items():
            by_topic.setdefault(name, []).append(
                OffsetCommitResponse.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                    partition_index=index, error_code=error
                )
            )
        return OffsetCommitResponse(
            throttle_time_ms=0,
            topics=[
                OffsetCommitResponse.OffsetCommitResponseTopic(name=name, partitions=partitions)
                for name, partitions in by_topic.items()
            ],
        )

    async def _offset_fetch(self, request: Request) -> Any:
        body, version = request.body, request.api_version
        if version < 8:
            committed = self._committed(body.group_id, body.topics)
            return OffsetFetchResponse(
                throttle_time_ms=0,
                error_code=Errors.NONE,
                topics=[
                    OffsetFetchResponse.OffsetFetchResponseTopic(
                        name=name,
                        partitions=[
                            OffsetFetchResponse.OffsetFetchResponseTopic.OffsetFetchResponsePartition(
                                partition_index=index,
                                committed_offset=offset,
                                committed_leader_epoch=-1,
                                metadata=metadata,
                                error_code=Errors.NONE,
                            )
                            for index, offset, metadata in partitions
                        ],
                    )
                    for name, partitions in committed.items()
                ],
            )
        group_cls = OffsetFetchResponse.OffsetFetchResponseGroup
        return OffsetFetchResponse(
            throttle_time_ms=0,
            groups=[
                group_cls(
                    group_id=group.group_id,
                    error_code=Errors.NONE,
                    topics=[
                        group_cls.OffsetFetchResponseTopics(
                            name=name,
                            partitions=[
                                group_cls.OffsetFetchResponseTopics.OffsetFetchResponsePartitions(
                                    partition_index=index,
                                    committed_offset=offset,
                                    committed_leader_epoch=-1,
                                    metadata=metadata,
                                    error_code=Errors.NONE,
                                )
                                for index, offset, metadata in partitions
                            ],
                        )
                        for name, partitions in self._committed(
                            group.group_id, group.topics
                        ).items()
                    ],
                )
                for group in body.groups
            ],
        )

    def _committed(
        self, group_id: str, topics: list[Any] | None
    ) -> dict[str, list[tuple[int, int, str | None]]]:
        """Committed offsets by topic: (partition, offset, metadata); `topics` None: all."""
        asked: list[TopicPartition] | None = None
        if topics is not None:
            asked = [(topic.name, index) for topic in topics for index in topic.partition_indexes]
        by_topic: dict[str, list[tuple[int, int, str | None]]] = {}
        for (name, index), (offset, metadata) in self.coordinator.fetch_offsets(
            group_id, asked
        ).items():
            by_topic.setdefault(name, []).append((index, offset, metadata))
        return by_topic

    # -- admin: CreateTopics, DescribeGroups, ListGroups ----------------------------------------

    async def _create_topics(self, request: Request) -> Any:
        """Kafka ``createTopics``: each topic checked (name, count, replicas), then created."""
        body, version = request.body, request.api_version
        validate_only = version >= 1 and body.validate_only
        named = Counter(topic.name for topic in body.topics)
        results = []
        for topic in body.topics:
            error, message = (
                (Errors.INVALID_REQUEST, "the request names this topic more than once")
                if named[topic.name] > 1
                else self._check_new_topic(topic)
            )
            partitions = (
                self.default_partitions if topic.num_partitions == -1 else topic.num_partitions
            )
            if error == Errors.NONE and not validate_only:
                self.replicas.create_topic(topic.name, partitions)
                log.info(
                    "created topic %r with %d partitions (CreateTopics)", topic.name, partitions
                )
                if topic.configs:
                    log.info(
                        "topic %r: configs %s ignored (logs live in memory, kept whole)",
                        topic.name,
                        sorted(config.name for config in topic.configs),
                    )
            ok = error == Errors.NONE
            results.append(
                CreateTopicsResponse.CreatableTopicResult(
                    name=topic.name,
                    error_code=error,
                    error_message=message,
                    num_partitions=partitions if ok else -1,
                    replication_factor=self._replication_factor() if ok else -1,
                    configs=[] if ok else None,
                )
            )
        return CreateTopicsResponse(throttle_time_ms=0, topics=results)

    def _replication_factor(self) -> int:
        return 1 + len(self.replicas.settings.follower_ids)

    def _check_new_topic(self, topic: Any) -> tuple[int, str | None]:  # noqa: PLR0911 - Kafka's order
        """The error and message CreateTopics answers for `topic` (``NONE``: it can be made)."""
        name = topic.name
        reason = invalid_name(name)
        if reason is not None:
            return self._invalid_topic(name, reason, "CreateTopics"), reason
        if name in self.replicas.topics:
            return Errors.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists."
        reason = collision(name, self.replicas.topics)
        if reason is not None:
            return self._invalid_topic(name, reason, "CreateTopics"), reason
        if topic.assignments:
            return Errors.INVALID_REQUEST, "manual replica assignments are not supported here"
        if topic.num_partitions != -1 and topic.num_partitions < 1:
            return (
                Errors.INVALID_PARTITIONS,
                "Number of partitions was set to an invalid non-positive value.",
            )
        brokers = self._replication_factor()
        if topic.replication_factor != -1 and not 1 <= topic.replication_factor <= brokers:
            return (
                Errors.INVALID_REPLICATION_FACTOR,
                f"Replication factor must be between 1 and the {brokers} brokers "
                "(every partition is replicated to all of them), or -1",
            )
        return Errors.NONE, None

    async def _describe_groups(self, request: Request) -> Any:
        body, version = request.body, request.api_version
        # With no authorizer Kafka grants every operation; here a group can be read (joined,
        # committed to) and described. Not asked for: Kafka's "not computed" marker.
        asked = version >= 3 and body.include_authorized_operations
        operations = set(_GROUP_OPERATIONS) if asked else None
        described = []
        for group_id in body.groups:
            summary = self.coordinator.describe_group(group_id)
            described.append(
                DescribeGroupsResponse.DescribedGroup(
                    error_code=Errors.NONE,
                    group_id=group_id,
                    group_state=summary.state,
                    protocol_type=summary.protocol_type,
                    protocol_data=summary.protocol,
                    members=[
                        DescribeGroupsResponse.DescribedGroup.DescribedGroupMember(
                            member_id=member.member_id,
                            group_instance_id=None,
                            client_id=member.client_id,
                            client_host=member.client_host,
                            member_metadata=member.metadata,
                            member_assignment=member.assignment,
                        )
                        for member in summary.members
                    ],
                    authorized_operations=operations,
                )
            )
        return DescribeGroupsResponse(throttle_time_ms=0, groups=described)

    async def _list_groups(self, request: Request) -> Any:
        body, version = request.body, request.api_version
        states = body.states_filter if version >= 4 else []
        types = {kind.lower() for kind in body.types_filter} if version >= 5 else set()
        listed = [] if types and "classic" not in types else self.coordinator.list_groups(states)
        return ListGroupsResponse(
            throttle_time_ms=0,
            error_code=Errors.NONE,
            groups=[
                ListGroupsResponse.ListedGroup(
                    group_id=group_id,
                    protocol_type=protocol_type,
                    group_state=state,
                    group_type="classic",  # the only protocol served (no KIP-848 groups)
                )
                for group_id, protocol_type, state in listed
            ],
        )


_HANDLERS: dict[int, _Handler] = {
    ProduceRequest.API_KEY: KafkaApis._produce,
    FetchRequest.API_KEY: KafkaApis._fetch,
    MetadataRequest.API_KEY: KafkaApis._metadata,
    ListOffsetsRequest.API_KEY: KafkaApis._list_offsets,
    InitProducerIdRequest.API_KEY: KafkaApis._init_producer_id,
    FindCoordinatorRequest.API_KEY: KafkaApis._find_coordinator,
    JoinGroupRequest.API_KEY: KafkaApis._join_group,
    SyncGroupRequest.API_KEY: KafkaApis._sync_group,
    HeartbeatRequest.API_KEY: KafkaApis._heartbeat,
    LeaveGroupRequest.API_KEY: KafkaApis._leave_group,
    OffsetCommitRequest.API_KEY: KafkaApis._offset_commit,
    OffsetFetchRequest.API_KEY: KafkaApis._offset_fetch,
    DescribeGroupsRequest.API_KEY: KafkaApis._describe_groups,
    ListGroupsRequest.API_KEY: KafkaApis._list_groups,
    CreateTopicsRequest.API_KEY: KafkaApis._create_topics,
}
"""API key -> handler: the same keys as `protocol.SERVED` (a test checks it)."""
