"""A consumer group's state on its coordinator: Kafka's GroupMetadata and MemberMetadata.

The group moves through Kafka's five states::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup--> Stable --join / leave / expiry--> PreparingRebalance
    PreparingRebalance --nobody left--> Empty

This module holds the state and answers questions about it (who has rejoined, which protocol
every member supports, which member leads); the coordinator (`coordinator.GroupCoordinator`)
makes every transition. A member waiting for its JoinGroup or SyncGroup answer holds a future
the coordinator resolves (Kafka's ``awaitingJoinCallback`` / ``awaitingSyncCallback``).
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from dataclasses import dataclass, field

from .replication import TopicPartition

__all__ = (
    "Group",
    "GroupState",
    "GroupSummary",
    "JoinResult",
    "Member",
    "MemberSummary",
    "SyncResult",
)


class GroupState(enum.Enum):
    """Kafka's group states (``GroupState``), named as Kafka's logs name them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True, slots=True)
class JoinResult:
    """A JoinGroup answer (the leader alone gets the members and their subscriptions)."""

    error_code: int
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    """A SyncGroup answer: the member's assignment (opaque bytes, the leader's encoding)."""

    error_code: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class MemberSummary:
    """One member as DescribeGroups shows it (Kafka ``MemberSummary``)."""

    member_id: str
    client_id: str
    client_host: str
    metadata: bytes
    """Its subscription in the group's protocol; empty unless the group is Stable."""
    assignment: bytes
    """What the leader assigned it; empty unless the group is Stable."""


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """A group as DescribeGroups shows it (Kafka ``GroupSummary``)."""

    state: str
    protocol_type: str
    protocol: str
    """The protocol chosen for the generation; empty unless the group is Stable."""
    members: tuple[MemberSummary, ...]


@dataclass(eq=False)
class Member:
    """One member of a group (Kafka ``MemberMetadata``)."""

    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    """(name, metadata) in the member's order of preference."""
    assignment: bytes = b""
    join_waiter: asyncio.Future[JoinResult] | None = None
    sync_waiter: asyncio.Future[SyncResult] | None = None
    is_new: bool = True
    """Joined in this rebalance: its session may expire while it waits (Kafka ``isNew``)."""
    heartbeat_satisfied: bool = False
    is_leaving: bool = False

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_waiter is not None

    def has_satisfied_heartbeat(self) -> bool:
        """Kafka ``hasSatisfiedHeartbeat``: a member waiting for a rebalance needs no heartbeat."""
        if self.is_new:
            return self.heartbeat_satisfied
        if self.awaiting_join or self.awaiting_sync:
            return True
        return self.heartbeat_satisfied

    def metadata(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise KeyError(protocol)

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def summary(self, protocol: str | None) -> MemberSummary:
        """Kafka ``summary`` / ``summaryNoMetadata``: the metadata and assignment only with
        the generation's `protocol` (a Stable group's)."""
        if protocol is None:
            return MemberSummary(self.member_id, self.client_id, self.client_host, b"", b"")
        return MemberSummary(
            self.member_id,
            self.client_id,
            self.client_host,
            self.metadata(protocol),
            self.assignment,
        )


@dataclass(eq=False)
class Group:
    """One consumer group (Kafka ``GroupMetadata``): members, generation, committed offsets."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending_members: set[str] = field(default_factory=set)
    """Member ids handed out by a JoinGroup (v4+) whose second JoinGroup has not come yet."""
    new_member_added: bool = False
    """A member joined during the initial delay (Kafka ``newMemberAdded``)."""
    offsets: dict[TopicPartition, tuple[int, str | None]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.members

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        self.pending_members.discard(member.member_id)
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> None:
        # The protocol type stays when the last member goes, as Kafka's does: an empty group
        # of consumers is still listed as one (ListGroups, DescribeGroups).
        self.members.pop(member_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)

    def summary(self) -> GroupSummary:
        """Kafka ``GroupMetadata.summary``: members with their metadata and assignment once
        the group is Stable, without them in a rebalance or when Empty."""
        stable = self.state is GroupState.STABLE
        protocol = self.protocol_name if stable else None
        return GroupSummary(
            self.state.value,
            self.protocol_type or "",
            protocol or "",
            tuple(member.summary(protocol) for member in self.members.values()),
        )

    def has_all_members_joined(self) -> bool:
        """Every known member has rejoined and no member id waits for its second join."""
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def rebalance_timeout_ms(self) -> int:
        """The longest rebalance timeout of the members (Kafka ``rebalanceTimeoutMs``)."""
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Could a member with these protocols join (Kafka ``supportsProtocols``)?"""
        names = {name for name, _ in protocols}
        if not self.members:
            return bool(protocol_type) and bool(names)
        return protocol_type == self.protocol_type and bool(names & self.candidate_protocols())

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Each member votes for its preferred candidate; the most votes win (Kafka's rule)."""
        candidates = self.candidate_protocols()
        votes: Counter[str] = Counter()
        for member in self.members.values():
            votes[next(name for name, _ in member.protocols if name in candidates)] += 1
        return votes.most_common(1)[0][0]
