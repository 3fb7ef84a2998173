"""Protocol glue: Kafka's wire format through kafka-python's schema classes, no codec of ours.

kafka-python 3 generates a message class per Kafka API from Kafka's own JSON schemas, for every
version, requests and responses alike. A broker needs the other direction from a client's:
decode requests, encode responses. This module picks the class for a frame's API key, says which
versions the broker serves (what ApiVersions advertises), and builds the protocol's own error
answer for what it does not serve. No bytes of a request are read by hand: even the frame size
and the header's API key and version come from kafka-python's ``Int32`` and ``RequestHeader``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import kafka.errors as kerrors
import kafka.protocol.admin
import kafka.protocol.consumer
import kafka.protocol.metadata
import kafka.protocol.producer  # noqa: F401 - imported so every API's classes exist
from kafka.protocol.admin import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.api_header import RequestHeader, ResponseClassRegistry
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)

__all__ = (
    "SERVED",
    "ApiVersionsRequest",
    "BadFrame",
    "CreateTopicsRequest",
    "CreateTopicsResponse",
    "DescribeGroupsRequest",
    "DescribeGroupsResponse",
    "Errors",
    "FetchRequest",
    "FetchResponse",
    "FindCoordinatorRequest",
    "FindCoordinatorResponse",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "JoinGroupRequest",
    "JoinGroupResponse",
    "LeaveGroupRequest",
    "LeaveGroupResponse",
    "ListGroupsRequest",
    "ListGroupsResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "MetadataRequest",
    "MetadataResponse",
    "OffsetCommitRequest",
    "OffsetCommitResponse",
    "OffsetFetchRequest",
    "OffsetFetchResponse",
    "ProduceRequest",
    "ProduceResponse",
    "Request",
    "SyncGroupRequest",
    "SyncGroupResponse",
    "api_versions_response",
    "decode_request",
    "encode_response",
    "error_response",
)


class Errors:
    """Kafka error codes the broker answers with (Kafka's numbers, from kafka-python's table)."""

    NONE: int = kerrors.NoError.errno
    OFFSET_OUT_OF_RANGE: int = kerrors.OffsetOutOfRangeError.errno
    CORRUPT_MESSAGE: int = kerrors.CorruptRecordError.errno
    UNKNOWN_TOPIC_OR_PARTITION: int = kerrors.UnknownTopicOrPartitionError.errno
    INVALID_TOPIC_EXCEPTION: int = kerrors.InvalidTopicError.errno
    REQUEST_TIMED_OUT: int = kerrors.RequestTimedOutError.errno
    REPLICA_NOT_AVAILABLE: int = kerrors.ReplicaNotAvailableError.errno
    MESSAGE_TOO_LARGE: int = kerrors.MessageSizeTooLargeError.errno
    NOT_ENOUGH_REPLICAS: int = kerrors.NotEnoughReplicasError.errno
    NOT_ENOUGH_REPLICAS_AFTER_APPEND: int = kerrors.NotEnoughReplicasAfterAppendError.errno
    INVALID_REQUIRED_ACKS: int = kerrors.InvalidRequiredAcksError.errno
    UNSUPPORTED_VERSION: int = kerrors.UnsupportedVersionError.errno
    INVALID_REQUEST: int = kerrors.InvalidRequestError.errno
    UNSUPPORTED_FOR_MESSAGE_FORMAT: int = kerrors.UnsupportedForMessageFormatError.errno
    COORDINATOR_NOT_AVAILABLE: int = kerrors.CoordinatorNotAvailableError.errno
    ILLEGAL_GENERATION: int = kerrors.IllegalGenerationError.errno
    INCONSISTENT_GROUP_PROTOCOL: int = kerrors.InconsistentGroupProtocolError.errno
    INVALID_GROUP_ID: int = kerrors.InvalidGroupIdError.errno
    UNKNOWN_MEMBER_ID: int = kerrors.UnknownMemberIdError.errno
    INVALID_SESSION_TIMEOUT: int = kerrors.InvalidSessionTimeoutError.errno
    REBALANCE_IN_PROGRESS: int = kerrors.RebalanceInProgressError.errno
    MEMBER_ID_REQUIRED: int = kerrors.MemberIdRequiredError.errno
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED: int = (
        kerrors.TransactionalIdAuthorizationFailedError.errno
    )
    TOPIC_ALREADY_EXISTS: int = kerrors.TopicAlreadyExistsError.errno
    INVALID_PARTITIONS: int = kerrors.InvalidPartitionsError.errno
    INVALID_REPLICATION_FACTOR: int = kerrors.InvalidReplicationFactorError.errno


#: API key -> (min, max) version this broker serves: what ApiVersions advertises. The ranges stop
#: where a version would need something the broker does not have: Produce v12+ and Fetch v13+
#: address topics by id, Metadata v13 and ListOffsets v7+ add features left out. The minimums
#: are Kafka 4's (Produce v3 and Fetch v4 are the first with record batches v2).
#:
#: The group APIs are the classic protocol, from the oldest version kafka-python's schemas
#: read (aiokafka 0.14 speaks FindCoordinator v0-1, JoinGroup v0-5, SyncGroup v0-3, Heartbeat
#: and LeaveGroup v0-1, OffsetCommit and OffsetFetch v0-3) up to the newest kafka-python 3 asks
#: for (JoinGroup 7, SyncGroup 5, OffsetCommit and OffsetFetch 8); librdkafka takes the newest
#: both sides know. JoinGroup v8+ and LeaveGroup's reasons add nothing a member needs, OffsetCommit
#: v9+ and OffsetFetch v9+ belong to the new (KIP-848) protocol or address topics by id,
#: FindCoordinator v5+ to transactions and share groups. DescribeGroups v6 answers an unknown
#: group with an error instead of the state ``Dead``; the broker keeps the older answer.
#: CreateTopics v7 returns topic ids, which this broker has none of but the zero id.
SERVED: dict[int, tuple[int, int]] = {
    ProduceRequest.API_KEY: (3, 11),
    FetchRequest.API_KEY: (4, 12),
    ListOffsetsRequest.API_KEY: (1, 6),
    MetadataRequest.API_KEY: (0, 12),
    ApiVersionsRequest.API_KEY: (0, 3),
    InitProducerIdRequest.API_KEY: (0, 4),
    FindCoordinatorRequest.API_KEY: (0, 4),
    JoinGroupRequest.API_KEY: (0, 7),
    SyncGroupRequest.API_KEY: (0, 5),
    HeartbeatRequest.API_KEY: (0, 4),
    LeaveGroupRequest.API_KEY: (0, 5),
    OffsetCommitRequest.API_KEY: (2, 8),
    OffsetFetchRequest.API_KEY: (1, 8),
    DescribeGroupsRequest.API_KEY: (0, 5),
    ListGroupsRequest.API_KEY: (0, 5),
    CreateTopicsRequest.API_KEY: (0, 7),
}


def _subclasses(cls: Any) -> list[Any]:
    found: list[Any] = []
    sub: Any
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


#: Every request class kafka-python knows (its primary, unversioned class), by API key: the
#: broker can decode any of them, so an API it does not serve still gets a proper error answer.
_REQUEST_CLASSES: dict[int, Any] = {
    cls.API_KEY: cls
    for cls in _subclasses(ApiMessage)
    if getattr(cls, "_class_version", 0) is None and cls.type == "request"
}


class BadFrame(Exception):
    """A frame that cannot be answered: Kafka closes such a connection, and so does the broker."""


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request: its header fields and the kafka-python message (``body``)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    """The decoded request, or ``None`` when the API or version is one kafka-python cannot read."""
    client_host: str = ""
    """The peer's address as Kafka shows a group member's (``/127.0.0.1``)."""


def decode_request(frame: bytes, client_host: str = "") -> Request:
    """Decode one request frame (without its 4-byte size prefix), read on a connection from
    `client_host`.

    A frame kafka-python can read gives a `Request` with ``body`` set; a readable header with an
    API key or version it has no schema for gives ``body=None`` (the server answers it when it
    can, closes the connection when it cannot).

    Raises:
        BadFrame: Not even a request header could be read, or the body does not parse.
    """
    try:
        header = RequestHeader.decode(io.BytesIO(frame), flexible=False)
        api_key = int(header.request_api_key)
        api_version = int(header.request_api_version)
        correlation_id = int(header.correlation_id)
        client_id = header.client_id
    except Exception as exc:  # any decoding failure: a bad frame
        raise BadFrame(f"unreadable request header: {exc!r}") from exc
    cls = _REQUEST_CLASSES.get(api_key)
    if cls is None or not 0 <= api_version <= cls.max_version:
        return Request(api_key, api_version, correlation_id, client_id, None, client_host)
    try:
        body = cls[api_version].decode(frame, header=True)
    except Exception as exc:  # any decoding failure: a bad frame
        raise BadFrame(f"unreadable {cls.__name__} v{api_version}: {exc!r}") from exc
    return Request(api_key, api_version, correlation_id, client_id, body, client_host)


def encode_response(request: Request, response: Any, version: int | None = None) -> bytes:
    """The framed bytes of `response`, the answer to `request`.

    Same correlation id; same version unless `version` says otherwise (ApiVersions' error answer
    is always v0).
    """
    response.API_VERSION = request.api_version if version is None else version
    response.with_header(correlation_id=request.correlation_id)
    return bytes(response.encode(header=True, framed=True))


def api_versions_response(version: int, error_code: int = Errors.NONE) -> Any:
    """ApiVersions' answer: what `SERVED` lists.

    A request at a version above ours gets the v0 answer with ``UNSUPPORTED_VERSION`` and our
    ranges (KIP-511), so the client can retry with a version we know.
    """
    keys = [
        ApiVersionsResponse.ApiVersion(api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(SERVED.items())
    ]
    return ApiVersionsResponse[version](error_code=error_code, api_keys=keys, throttle_time_ms=0)


def error_response(request: Request, error_code: int) -> Any | None:
    """The protocol's answer to a request the broker does not serve, or ``None`` if none exists.

    Produce, Fetch and ListOffsets at a version outside `SERVED` get their own response with
    `error_code` on every partition asked for. Another API kafka-python knows gets its response
    with `error_code` in the top-level error field. An API whose response has no such field, one
    kafka-python cannot decode at all, and an ``acks=0`` produce (it expects no answer) have no
    answer a client could match: ``None`` (close the connection, as Kafka does).
    """
    body = request.body
    if body is None:
        return None
    per_partition = _PER_PARTITION_ERRORS.get(request.api_key)
    if per_partition is not None:
        return per_partition(body, error_code)
    response_cls = ResponseClassRegistry.get_response_class(request.body.header)
    if response_cls is None:
        return None
    fields = {field["name"] for field in response_cls.json["fields"]}
    if "ErrorCode" not in fields:
        return None
    return response_cls(error_code=error_code)


def _produce_errors(body: Any, code: int) -> Any | None:
    if body.acks == 0:
        return None
    return ProduceResponse(
        responses=[
            ProduceResponse.TopicProduceResponse(
                name=topic.name,
                topic_id=topic.topic_id,
                partition_responses=[
                    ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                        index=data.index, error_code=code, base_offset=-1
                    )
                    for data in topic.partition_data
                ],
            )
            for topic in body.topic_data
        ]
    )


def _fetch_errors(body: Any, code: int) -> Any:
    return FetchResponse(
        error_code=code,
        responses=[
            FetchResponse.FetchableTopicResponse(
                topic=topic.topic,
                topic_id=topic.topic_id,
                partitions=[
                    FetchResponse.FetchableTopicResponse.PartitionData(
                        partition_index=asked.partition,
                        error_code=code,
                        high_watermark=-1,
                        last_stable_offset=-1,
                        records=b"",
                    )
                    for asked in topic.partitions
                ],
            )
            for topic in body.topics
        ],
    )


def _list_offsets_errors(body: Any, code: int) -> Any:
    return ListOffsetsResponse(
        topics=[
            ListOffsetsResponse.ListOffsetsTopicResponse(
                name=topic.name,
                partitions=[
                    ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                        partition_index=asked.partition_index,
                        error_code=code,
                        timestamp=-1,
                        offset=-1,
                    )
                    for asked in topic.partitions
                ],
            )
            for topic in body.topics
        ]
    )


_PER_PARTITION_ERRORS: dict[int, Any] = {
    ProduceRequest.API_KEY: _produce_errors,
    FetchRequest.API_KEY: _fetch_errors,
    ListOffsetsRequest.API_KEY: _list_offsets_errors,
}
