"""The group coordinator: Kafka's classic consumer-group protocol, its waits in two purgatories.

Kafka's ``GroupCoordinator`` with its own delayed operations:

* `DelayedJoin` (purgatory ``rebalance``, key ``("join", group)``): a rebalance waits until
  every known member has sent its JoinGroup again, or the longest rebalance timeout of the
  members passes; then the members that did not rejoin are dropped and the next generation
  starts (`GroupCoordinator._complete_join`). Every JoinGroup, LeaveGroup and expiry re-tries it.
* `InitialDelayedJoin`: a group that was empty waits ``group.initial.rebalance.delay.ms`` more
  each time a new member arrives (within the rebalance timeout), so that consumers started
  together land in one generation instead of one rebalance each.
* `DelayedHeartbeat` (purgatory ``heartbeat``, key ``("member", group, member)``): each member's
  session. A heartbeat (or a JoinGroup, SyncGroup, OffsetCommit) completes the current one and
  watches the next, ``session.timeout.ms`` ahead; if one expires, the member is removed and the
  group rebalances. A member waiting in a rebalance needs no heartbeat (its join or sync is its
  sign of life).

Members are dynamic (``group.instance.id`` is not honoured) and committed offsets live in
memory for the leader's lifetime (Kafka writes them to ``__consumer_offsets``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from purgatory import DelayedOperation, DelayedOperationPurgatory, DrivenClock, EventLog

from .group import Group, GroupState, GroupSummary, JoinResult, Member, SyncResult
from .protocol import Errors
from .replication import TopicPartition
from .stats import BrokerStats

__all__ = (
    "DelayedHeartbeat",
    "DelayedJoin",
    "GroupCoordinator",
    "GroupSettings",
    "InitialDelayedJoin",
)

log = logging.getLogger("minibroker.coordinator")

_NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000  # Kafka's NewMemberJoinTimeoutMs


@dataclass(frozen=True)
class GroupSettings:
    """The coordinator's settings (Kafka's names, in milliseconds)."""

    initial_rebalance_delay_ms: int = 200
    """``group.initial.rebalance.delay.ms`` (Kafka's default is 3000; short for demos)."""
    min_session_timeout_ms: int = 500
    """``group.min.session.timeout.ms`` (Kafka: 6000)."""
    max_session_timeout_ms: int = 30 * 60 * 1000
    """``group.max.session.timeout.ms``."""


class DelayedJoin(DelayedOperation[None]):
    """A rebalance waiting for every known member to rejoin (Kafka ``DelayedJoin``)."""

    __slots__ = ("coordinator", "group")

    def __init__(self, coordinator: GroupCoordinator, group: Group, timeout_ms: int) -> None:
        super().__init__(timeout_ms / 1000)
        self.coordinator = coordinator
        self.group = group

    def try_complete(self) -> bool:
        if self.group.has_all_members_joined():
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.coordinator._complete_join(self.group)

    def on_expiration(self) -> None:
        pass  # the members that did not rejoin were dropped by on_complete


class InitialDelayedJoin(DelayedJoin):
    """The first rebalance of an empty group (Kafka ``InitialDelayedJoin``).

    Never completes early: it waits `delay_ms`, then, if a member joined meanwhile and time is
    left within the rebalance timeout, waits again; else the join completes as usual.
    """

    __slots__ = ("delay_ms", "initial_delay_ms", "remaining_ms")

    def __init__(
        self,
        coordinator: GroupCoordinator,
        group: Group,
        initial_delay_ms: int,
        delay_ms: int,
        remaining_ms: int,
    ) -> None:
        super().__init__(coordinator, group, delay_ms)
        self.initial_delay_ms = initial_delay_ms
        self.delay_ms = delay_ms
        self.remaining_ms = remaining_ms

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        group = self.group
        if group.new_member_added and self.remaining_ms != 0:
            group.new_member_added = False
            delay = min(self.initial_delay_ms, self.remaining_ms)
            remaining = max(self.remaining_ms - self.delay_ms, 0)
            self.coordinator._watch_join(
                InitialDelayedJoin(self.coordinator, group, self.initial_delay_ms, delay, remaining)
            )
        else:
            super().on_complete()


class DelayedHeartbeat(DelayedOperation[None]):
    """One member's session until its next sign of life (Kafka ``DelayedHeartbeat``)."""

    __slots__ = ("coordinator", "group", "is_pending", "member_id")

    def __init__(
        self,
        coordinator: GroupCoordinator,
        group: Group,
        member_id: str,
        *,
        is_pending: bool,
        timeout_ms: int,
    ) -> None:
        super().__init__(timeout_ms / 1000)
        self.coordinator = coordinator
        self.group = group
        self.member_id = member_id
        self.is_pending = is_pending

    def try_complete(self) -> bool:
        group, member_id = self.group, self.member_id
        if self.is_pending:  # a pending member id is satisfied once it joined for real
            done = member_id in group.members
        else:
            member = group.members.get(member_id)
            done = member is None or member.has_satisfied_heartbeat() or member.is_leaving
        return self.force_complete() if done else False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        self.coordinator._expire_heartbeat(self.group, self.member_id, is_pending=self.is_pending)


class GroupCoordinator:
    """Every group of this broker (it is the coordinator of all of them)."""

    def __init__(
        self,
        settings: GroupSettings,
        stats: BrokerStats,
        partition_exists: Callable[[TopicPartition], bool],
        *,
        clock: DrivenClock | None = None,
        event_log: EventLog | None = None,
    ) -> None:
        """`clock`: ``None`` for the event loop's, a `ManualClock` in the tests; `event_log`:
        where the purgatories record (``None``: nowhere)."""
        self.settings = settings
        self.groups: dict[str, Group] = {}
        self.rebalance_purgatory = DelayedOperationPurgatory[DelayedJoin](
            "rebalance", clock=clock, event_log=event_log
        )
        self.heartbeat_purgatory = DelayedOperationPurgatory[DelayedHeartbeat](
            "heartbeat", clock=clock, event_log=event_log
        )
        stats.register(self.rebalance_purgatory, self.heartbeat_purgatory)
        self._counters = stats.counters
        self._partition_exists = partition_exists

    async def stop(self) -> None:
        """Cancel every pending rebalance and session; answer whoever still waits."""
        for group in self.groups.values():
            for member in group.members.values():
                _answer_join(member, JoinResult(Errors.COORDINATOR_NOT_AVAILABLE, ""))
                _answer_sync(member, SyncResult(Errors.COORDINATOR_NOT_AVAILABLE))
        await self.rebalance_purgatory.shutdown()
        await self.heartbeat_purgatory.shutdown()

    def statistics(self) -> dict[str, dict[str, object]]:
        """Each group's state, generation and members (for the ``stats`` command)."""
        return {
            group_id: {
                "state": group.state.value,
                "generation": group.generation_id,
                "members": sorted(group.members),
                "leader": group.leader_id,
            }
            for group_id, group in sorted(self.groups.items())
        }

    # -- JoinGroup -------------------------------------------------------------------------------

    async def join_group(  # noqa: PLR0911 - one answer per refusal, in Kafka's order
        self,
        group_id: str,
        member_id: str,
        *,
        client_id: str,
        client_host: str = "",
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
    ) -> JoinResult:
        """Kafka ``handleJoinGroup``: returns when the rebalance completes (or at once on error)."""
        s = self.settings
        if not group_id:
            return JoinResult(Errors.INVALID_GROUP_ID, member_id)
        if not s.min_session_timeout_ms <= session_timeout_ms <= s.max_session_timeout_ms:
            log.info(
                "group %s: JoinGroup refused, session timeout %d ms outside [%d, %d]",
                group_id,
                session_timeout_ms,
                s.min_session_timeout_ms,
                s.max_session_timeout_ms,
            )
            return JoinResult(Errors.INVALID_SESSION_TIMEOUT, member_id)
        if rebalance_timeout_ms < 0:  # JoinGroup v0 has none: the session timeout stands in
            rebalance_timeout_ms = session_timeout_ms
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return JoinResult(Errors.UNKNOWN_MEMBER_ID, member_id)
            group = self.groups[group_id] = Group(group_id)
        if not group.supports(protocol_type, protocols):
            return JoinResult(Errors.INCONSISTENT_GROUP_PROTOCOL, member_id)
        member = Member(
            member_id or f"{client_id or 'member'}-{uuid.uuid4()}",
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            protocols,
        )
        waiter: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        if not member_id:
            if require_known_member_id:
                # KIP-394: hand out the id and wait for the member to come back with it.
                group.pending_members.add(member.member_id)
                self._schedule_heartbeat(group, member.member_id, session_timeout_ms, True)
                return JoinResult(Errors.MEMBER_ID_REQUIRED, member.member_id)
            self._add_member_and_rebalance(group, member, waiter)
        elif member_id in group.pending_members:
            self._add_member_and_rebalance(group, member, waiter)
        elif member_id not in group.members:
            return JoinResult(Errors.UNKNOWN_MEMBER_ID, member_id)
        else:
            known = group.members[member_id]
            unchanged = known.matches(protocols)
            if (group.state is GroupState.COMPLETING_REBALANCE and unchanged) or (
                group.state is GroupState.STABLE and unchanged and member_id != group.leader_id
            ):
                # Nothing new (a retried join, a follower): the current generation, so that it
                # can SyncGroup. The leader's rejoin in Stable always rebalances (Kafka's rule).
                return self._join_result(group, known)
            known.session_timeout_ms = session_timeout_ms
            known.rebalance_timeout_ms = rebalance_timeout_ms
            self._update_member_and_rebalance(group, known, protocols, waiter)
        if group.state is GroupState.PREPARING_REBALANCE:
            self.rebalance_purgatory.check_and_complete(_join_key(group))
        return await waiter

    def _add_member_and_rebalance(
        self, group: Group, member: Member, waiter: asyncio.Future[JoinResult]
    ) -> None:
        member.join_waiter = waiter
        if group.state is GroupState.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True
        group.add(member)
        # A new member's session is long while it waits: the join's own timeout bounds it.
        self._schedule_heartbeat(group, member.member_id, _NEW_MEMBER_JOIN_TIMEOUT_MS, False)
        self._counters["group members joined"] += 1
        self._maybe_prepare_rebalance(group, f"{member.member_id} joined")

    def _update_member_and_rebalance(
        self,
        group: Group,
        member: Member,
        protocols: list[tuple[str, bytes]],
        waiter: asyncio.Future[JoinResult],
    ) -> None:
        member.protocols = protocols
        # A join of this member still waiting (its client gave up on it): told to join again.
        _answer_join(member, JoinResult(Errors.REBALANCE_IN_PROGRESS, member.member_id))
        member.join_waiter = waiter
        self._maybe_prepare_rebalance(group, f"{member.member_id} rejoined")

    def _maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        """Kafka ``prepareRebalance``: start waiting for the members to rejoin."""
        if group.state is GroupState.COMPLETING_REBALANCE:
            # The assignment under way is void: whoever waits for it must rejoin.
            for member in group.members.values():
                _answer_sync(member, SyncResult(Errors.REBALANCE_IN_PROGRESS))
        op: DelayedJoin
        if group.state is GroupState.EMPTY:
            delay = self.settings.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            op = InitialDelayedJoin(self, group, delay, delay, remaining)
        else:
            op = DelayedJoin(self, group, group.rebalance_timeout_ms())
        log.info(
            "group %s: preparing to rebalance (old generation %d, %d members): %s",
            group.group_id,
            group.generation_id,
            len(group.members),
            reason,
        )
        self._counters["group rebalances"] += 1
        group.state = GroupState.PREPARING_REBALANCE
        self._watch_join(op)

    def _watch_join(self, op: DelayedJoin) -> None:
        self.rebalance_purgatory.try_complete_else_watch(op, [_join_key(op.group)])

    def _complete_join(self, group: Group) -> None:
        """Kafka ``onCompleteJoin``: drop who did not rejoin, start the next generation."""
        for member in list(group.members.values()):
            if not member.awaiting_join:
                log.info(
                    "group %s: member %s did not rejoin in time, removed",
                    group.group_id,
                    member.member_id,
                )
                member.is_leaving = True
                group.remove(member.member_id)
                _answer_sync(member, SyncResult(Errors.UNKNOWN_MEMBER_ID))
                self.heartbeat_purgatory.check_and_complete(_member_key(group, member.member_id))
        group.generation_id += 1
        if group.is_empty:
            group.state, group.protocol_name = GroupState.EMPTY, None
            log.info("group %s: generation %d is empty", group.group_id, group.generation_id)
            return
        group.protocol_name = group.select_protocol()
        group.state = GroupState.COMPLETING_REBALANCE
        log.info(
            "group %s: generation %d, protocol %s, members %s, leader %s",
            group.group_id,
            group.generation_id,
            group.protocol_name,
            sorted(group.members),
            group.leader_id,
        )
        for member in group.members.values():
            waiter, member.join_waiter = member.join_waiter, None
            member.is_new = False
            if waiter is not None and not waiter.done():
                waiter.set_result(self._join_result(group, member))
            self._schedule_heartbeat(group, member.member_id, member.session_timeout_ms, False)

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        leader = member.member_id == group.leader_id
        protocol = group.protocol_name or ""
        return JoinResult(
            Errors.NONE,
            member.member_id,
            group.generation_id,
            group.protocol_type,
            protocol,
            group.leader_id or "",
            tuple((m.member_id, m.metadata(protocol)) for m in group.members.values())
            if leader
            else (),
        )

    # -- SyncGroup -------------------------------------------------------------------------------

    async def sync_group(  # noqa: PLR0911 - one answer per refusal, in Kafka's order
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        *,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Iterable[tuple[str, bytes]],
    ) -> SyncResult:
        """Kafka ``handleSyncGroup``: the leader's assignment, handed to every member."""
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return SyncResult(Errors.UNKNOWN_MEMBER_ID)
        if generation_id != group.generation_id:
            return SyncResult(Errors.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(Errors.INCONSISTENT_GROUP_PROTOCOL)
        if group.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(Errors.REBALANCE_IN_PROGRESS)
        if group.state is GroupState.STABLE:
            self._schedule_heartbeat(group, member_id, member.session_timeout_ms, False)
            return self._sync_result(group, member)
        if group.state is not GroupState.COMPLETING_REBALANCE:
            return SyncResult(Errors.UNKNOWN_MEMBER_ID)
        waiter: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        _answer_sync(member, SyncResult(Errors.REBALANCE_IN_PROGRESS))  # a duplicate's
        member.sync_waiter = waiter
        self._schedule_heartbeat(group, member_id, member.session_timeout_ms, False)
        if member_id == group.leader_id:
            given = dict(assignments)
            for member_ in group.members.values():
                member_.assignment = given.get(member_.member_id, b"")
            group.state = GroupState.STABLE
            log.info(
                "group %s: generation %d stable, assignment from %s",
                group.group_id,
                group.generation_id,
                member_id,
            )
            for member_ in group.members.values():
                if member_.awaiting_sync:
                    _answer_sync(member_, self._sync_result(group, member_))
                    self._schedule_heartbeat(
                        group, member_.member_id, member_.session_timeout_ms, False
                    )
        return await waiter

    def _sync_result(self, group: Group, member: Member) -> SyncResult:
        return SyncResult(Errors.NONE, member.assignment, group.protocol_type, group.protocol_name)

    # -- Heartbeat, LeaveGroup, expiry ------------------------------------------------------------

    def heartbeat(self, group_id: str, member_id: str, generation_id: int) -> int:
        """Kafka ``handleHeartbeat``: the error code (``REBALANCE_IN_PROGRESS``: rejoin).

        In Kafka's order: an unknown member, then a stale generation (``ILLEGAL_GENERATION``,
        also during a rebalance: that member must rejoin from scratch), then the group's state.
        """
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return Errors.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return Errors.ILLEGAL_GENERATION
        if group.state is GroupState.EMPTY:
            return Errors.UNKNOWN_MEMBER_ID
        self._schedule_heartbeat(group, member_id, member.session_timeout_ms, False)
        if group.state is GroupState.PREPARING_REBALANCE:
            return Errors.REBALANCE_IN_PROGRESS
        return Errors.NONE

    def leave_group(self, group_id: str, member_ids: list[str]) -> list[int]:
        """Kafka ``handleLeaveGroup``: one error code per member asked for."""
        group = self.groups.get(group_id)
        codes = []
        for member_id in member_ids:
            if group is None:
                codes.append(Errors.UNKNOWN_MEMBER_ID)
            elif member_id in group.pending_members:
                group.pending_members.discard(member_id)
                self.heartbeat_purgatory.check_and_complete(_member_key(group, member_id))
                codes.append(Errors.NONE)
            elif member_id not in group.members:
                codes.append(Errors.UNKNOWN_MEMBER_ID)
            else:
                self._counters["group members left"] += 1
                self._remove_member(group, group.members[member_id], "left the group")
                codes.append(Errors.NONE)
        return codes

    def _schedule_heartbeat(
        self, group: Group, member_id: str, timeout_ms: int, is_pending: bool
    ) -> None:
        """End the member's current session and start the next one.

        Kafka ``completeAndScheduleNextHeartbeatExpiration``.
        """
        key = _member_key(group, member_id)
        member = group.members.get(member_id)
        if member is not None:
            member.heartbeat_satisfied = True
        self.heartbeat_purgatory.check_and_complete(key)
        if member is not None:
            member.heartbeat_satisfied = False
        op = DelayedHeartbeat(self, group, member_id, is_pending=is_pending, timeout_ms=timeout_ms)
        self.heartbeat_purgatory.try_complete_else_watch(op, [key])

    def _expire_heartbeat(self, group: Group, member_id: str, *, is_pending: bool) -> None:
        """Kafka ``onExpireHeartbeat``: the member's session ended without a sign of life."""
        if is_pending:
            if member_id in group.pending_members:
                log.info("group %s: pending member %s expired", group.group_id, member_id)
                group.pending_members.discard(member_id)
                if group.state is GroupState.PREPARING_REBALANCE:
                    self.rebalance_purgatory.check_and_complete(_join_key(group))
            return
        member = group.members.get(member_id)
        if member is not None and not member.has_satisfied_heartbeat():
            self._counters["group members expired"] += 1
            reason = f"failed (no heartbeat for {member.session_timeout_ms} ms)"
            self._remove_member(group, member, reason)

    def _remove_member(self, group: Group, member: Member, reason: str) -> None:
        """Kafka ``removeMemberAndUpdateGroup``: out of the group, which rebalances."""
        member.is_leaving = True
        group.remove(member.member_id)
        _answer_join(member, JoinResult(Errors.UNKNOWN_MEMBER_ID, member.member_id))
        _answer_sync(member, SyncResult(Errors.UNKNOWN_MEMBER_ID))
        self.heartbeat_purgatory.check_and_complete(_member_key(group, member.member_id))
        log.info("group %s: member %s %s, removing it", group.group_id, member.member_id, reason)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"{member.member_id} {reason}")
        elif group.state is GroupState.PREPARING_REBALANCE:
            self.rebalance_purgatory.check_and_complete(_join_key(group))

    # -- OffsetCommit, OffsetFetch ------------------------------------------------------------

    def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        offsets: Iterable[tuple[TopicPartition, int, str | None]],
    ) -> dict[TopicPartition, int]:
        """Kafka ``handleCommitOffsets``: an error code per partition."""
        offsets = list(offsets)
        group = self.groups.get(group_id)
        error = Errors.NONE
        # Kafka's order (doCommitOffsets): a member and a generation are checked before the
        # state, so a stale member gets ILLEGAL_GENERATION even in a rebalance.
        if not group_id:
            error = Errors.INVALID_GROUP_ID
        elif group is None:
            if generation_id < 0:  # a group that only stores offsets
                group = self.groups[group_id] = Group(group_id)
            else:
                error = Errors.ILLEGAL_GENERATION
        elif generation_id < 0 and group.state is GroupState.EMPTY:
            pass
        elif member_id not in group.members:
            error = Errors.UNKNOWN_MEMBER_ID
        elif generation_id != group.generation_id:
            error = Errors.ILLEGAL_GENERATION
        elif group.state is GroupState.COMPLETING_REBALANCE:
            error = Errors.REBALANCE_IN_PROGRESS
        else:  # Stable, or PreparingRebalance (the heartbeat tells the member to rejoin)
            member = group.members[member_id]
            self._schedule_heartbeat(group, member_id, member.session_timeout_ms, False)
        codes = {}
        for key, offset, metadata in offsets:
            if error != Errors.NONE:
                codes[key] = error
            elif not self._partition_exists(key):
                codes[key] = Errors.UNKNOWN_TOPIC_OR_PARTITION
            else:
                assert group is not None
                group.offsets[key] = (offset, metadata)
                codes[key] = Errors.NONE
        if error != Errors.NONE:
            log.info("group %s: offset commit refused, error %d", group_id, error)
        self._counters["offset commits"] += 1
        return codes

    # -- DescribeGroups, ListGroups -------------------------------------------------------------

    def describe_group(self, group_id: str) -> GroupSummary:
        """Kafka ``handleDescribeGroup``: an unknown group is described as ``Dead``, empty."""
        group = self.groups.get(group_id)
        if group is None:
            return GroupSummary("Dead", "", "", ())
        return group.summary()

    def list_groups(self, states: Iterable[str] = ()) -> list[tuple[str, str, str]]:
        """Kafka ``handleListGroups``: (group id, protocol type, state) of every group, or of
        those in `states` (case-insensitive; none: all)."""
        wanted = {state.lower() for state in states}
        return [
            (group_id, group.protocol_type or "", group.state.value)
            for group_id, group in sorted(self.groups.items())
            if not wanted or group.state.value.lower() in wanted
        ]

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None
    ) -> dict[TopicPartition, tuple[int, str | None]]:
        """Kafka ``handleFetchOffsets``: committed offset and metadata (-1: none committed).

        `partitions` ``None``: every partition the group committed.
        """
        group = self.groups.get(group_id)
        committed = group.offsets if group is not None else {}
        if partitions is None:
            return dict(sorted(committed.items()))
        return {key: committed.get(key, (-1, "")) for key in partitions}


def _join_key(group: Group) -> tuple[str, str]:
    return ("join", group.group_id)


def _member_key(group: Group, member_id: str) -> tuple[str, str, str]:
    return ("member", group.group_id, member_id)


def _answer_join(member: Member, result: JoinResult) -> None:
    waiter, member.join_waiter = member.join_waiter, None
    if waiter is not None and not waiter.done():
        waiter.set_result(result)


def _answer_sync(member: Member, result: SyncResult) -> None:
    waiter, member.sync_waiter = member.sync_waiter, None
    if waiter is not None and not waiter.done():
        waiter.set_result(result)
