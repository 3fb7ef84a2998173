"""The group coordinator on a `ManualClock`: Kafka's DelayedJoin, InitialDelayedJoin and
DelayedHeartbeat to the millisecond, and the protocol's answers (generations, errors, offsets).

The coordinator's two purgatories run on a manual clock, so every deadline is checked exactly: a
rebalance never completes before its delay or timeout, and a session never expires before
``session.timeout.ms`` after the member's last sign of life.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from examples.minibroker.coordinator import GroupCoordinator, GroupSettings
from examples.minibroker.group import JoinResult, SyncResult
from examples.minibroker.protocol import Errors
from examples.minibroker.stats import BrokerStats
from purgatory.testing import ManualClock, check_invariants

PROTOCOLS = [("range", b"range-metadata"), ("roundrobin", b"rr-metadata")]
DELAY_MS = 100


class Setup:
    def __init__(self, **settings: Any) -> None:
        self.clock = ManualClock()
        self.stats = BrokerStats()
        self.coordinator = GroupCoordinator(
            GroupSettings(initial_rebalance_delay_ms=DELAY_MS, **settings),
            self.stats,
            lambda key: key[0] == "t",
            clock=self.clock,
        )

    async def join(
        self,
        member_id: str = "",
        *,
        group: str = "g",
        session_ms: int = 1000,
        rebalance_ms: int = 1000,
        protocols: list[tuple[str, bytes]] = PROTOCOLS,
        version: int = 3,
    ) -> asyncio.Task[JoinResult]:
        task = asyncio.create_task(
            self.coordinator.join_group(
                group,
                member_id,
                client_id="client",
                session_timeout_ms=session_ms,
                rebalance_timeout_ms=rebalance_ms,
                protocol_type="consumer",
                protocols=protocols,
                require_known_member_id=version >= 4,
            )
        )
        await settle()
        return task

    async def sync(
        self, result: JoinResult, assignments: dict[str, bytes] | None = None
    ) -> asyncio.Task[SyncResult]:
        task = asyncio.create_task(
            self.coordinator.sync_group(
                "g",
                result.generation_id,
                result.member_id,
                protocol_type="consumer",
                protocol_name=result.protocol_name,
                assignments=list((assignments or {}).items()),
            )
        )
        await settle()
        return task

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await settle()
        check_invariants(self.coordinator.rebalance_purgatory)
        check_invariants(self.coordinator.heartbeat_purgatory)

    async def join_two(self) -> tuple[JoinResult, JoinResult]:
        """Two members join group ``g`` and its first rebalance ends: their answers, leader's
        first (the second joined during the first delay, so the group waits two)."""
        first, second = await self.join(), await self.join()
        await self.advance(DELAY_MS / 1000)
        await self.advance(DELAY_MS / 1000)
        return first.result(), second.result()

    def state(self, group: str = "g") -> str:
        return self.coordinator.groups[group].state.value

    async def stable(self, count: int, **join: Any) -> list[JoinResult]:
        """`count` members join at once, the leader assigns; returns their join results."""
        tasks = [await self.join(**join) for _ in range(count)]
        await self.advance(DELAY_MS / 1000)
        if count > 1:  # the others joined during the first delay: one more
            await self.advance(DELAY_MS / 1000)
        results = [task.result() for task in tasks]
        followers = [await self.sync(r) for r in results if r.member_id != r.leader_id]
        (leader,) = [r for r in results if r.member_id == r.leader_id]
        await self.sync(leader, {r.member_id: r.member_id.encode() for r in results})
        for task in followers:
            assert task.result().error_code == Errors.NONE
        assert self.state() == "Stable"
        return results


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_new_group_waits_the_initial_delay_and_again_for_each_new_member() -> None:
    s = Setup()
    first = await s.join()
    await s.advance(0.099)
    second = await s.join()  # joins during the delay: the delay starts again
    await s.advance(0.001)
    assert not first.done()
    assert s.state() == "PreparingRebalance"
    await s.advance(0.099)
    assert not first.done()
    await s.advance(0.001)
    a, b = first.result(), second.result()
    assert a.error_code == b.error_code == Errors.NONE
    assert a.generation_id == b.generation_id == 1
    assert a.leader_id == b.leader_id == a.member_id  # the first member leads
    assert [m for m, _ in a.members] == [a.member_id, b.member_id]  # the leader sees all
    assert a.members[0][1] == b"range-metadata"
    assert b.members == ()
    assert a.protocol_name == "range"  # both members prefer it
    assert s.state() == "CompletingRebalance"
    assert s.coordinator.rebalance_purgatory.statistics().expired == 2


@pytest.mark.asyncio
async def test_the_initial_delay_never_outlasts_the_rebalance_timeout() -> None:
    s = Setup()
    tasks = [await s.join(rebalance_ms=250)]
    # A new member in every delay; the clock stops at each delay's end (0.1, 0.2).
    for at in (0.05, 0.1, 0.15, 0.2, 0.22, 0.24):
        await s.advance(at - s.clock.now())
        if at not in (0.1, 0.2):
            tasks.append(await s.join(rebalance_ms=250))
        assert not tasks[0].done()
    await s.advance(0.249 - s.clock.now())
    assert not tasks[0].done()
    await s.advance(0.001)
    assert {task.result().generation_id for task in tasks} == {1}
    assert len(tasks[0].result().members) == 5


@pytest.mark.asyncio
async def test_a_rebalance_completes_as_soon_as_every_known_member_rejoined() -> None:
    s = Setup()
    a, b = await s.stable(2)
    changed = [("range", b"new-subscription")]
    b_again = await s.join(b.member_id, protocols=changed)  # a new subscription: rebalance
    assert s.state() == "PreparingRebalance"
    assert not b_again.done()
    a_again = await s.join(a.member_id)  # the last one: no clock needed
    assert a_again.result().generation_id == b_again.result().generation_id == 2
    assert dict(a_again.result().members)[b.member_id] == b"new-subscription"
    stats = s.coordinator.rebalance_purgatory.statistics()
    assert (stats.expired, stats.completed) == (2, 1)  # the two initial delays; this one


@pytest.mark.asyncio
async def test_a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_timeout() -> None:
    s = Setup()
    a, b = await s.stable(2, session_ms=5000, rebalance_ms=1000)
    started = s.clock.now()
    c = await s.join(session_ms=5000, rebalance_ms=1000)
    a_again = await s.join(a.member_id, session_ms=5000, rebalance_ms=1000)
    await s.advance(started + 0.999 - s.clock.now())
    assert not c.done()  # b is still waited for
    await s.advance(0.001)
    assert c.result().generation_id == a_again.result().generation_id == 2
    assert {m for m, _ in a_again.result().members} == {a.member_id, c.result().member_id}
    assert s.coordinator.heartbeat("g", b.member_id, b.generation_id) == Errors.UNKNOWN_MEMBER_ID


@pytest.mark.asyncio
async def test_a_silent_member_expires_at_its_session_timeout_and_the_group_rebalances() -> None:
    s = Setup()
    a, b = await s.stable(2, session_ms=1000, rebalance_ms=3000)
    synced = s.clock.now()
    await s.advance(0.5)
    assert s.coordinator.heartbeat("g", a.member_id, a.generation_id) == Errors.NONE
    await s.advance(synced + 0.999 - s.clock.now())
    assert s.state() == "Stable"
    await s.advance(0.001)  # b's session ends: removed, the group rebalances
    assert s.state() == "PreparingRebalance"
    assert b.member_id not in s.coordinator.groups["g"].members
    assert s.stats.counters["group members expired"] == 1
    # a learns it from its heartbeat, which also renews its session, and rejoins.
    assert s.coordinator.heartbeat("g", a.member_id, 1) == Errors.REBALANCE_IN_PROGRESS
    a_again = await s.join(a.member_id, session_ms=1000, rebalance_ms=3000)
    result = a_again.result()
    assert (result.generation_id, result.leader_id) == (2, a.member_id)
    await s.advance(0.999)  # a's new session runs from its join: not expired yet
    assert a.member_id in s.coordinator.groups["g"].members


@pytest.mark.asyncio
async def test_a_member_leaving_rebalances_at_once_and_an_empty_group_keeps_its_offsets() -> None:
    s = Setup()
    a, b = await s.stable(2)
    codes = s.coordinator.commit_offsets("g", a.generation_id, a.member_id, [(("t", 0), 42, "m")])
    assert codes == {("t", 0): Errors.NONE}
    assert s.coordinator.leave_group("g", [b.member_id, "nobody"]) == [
        Errors.NONE,
        Errors.UNKNOWN_MEMBER_ID,
    ]
    assert s.state() == "PreparingRebalance"
    assert s.stats.counters["group members left"] == 1
    assert s.coordinator.leave_group("g", [a.member_id]) == [Errors.NONE]
    await settle()
    assert s.state() == "Empty"  # the join in progress completed with nobody left
    assert s.coordinator.fetch_offsets("g", [("t", 0), ("t", 1)]) == {
        ("t", 0): (42, "m"),
        ("t", 1): (-1, ""),
    }
    assert s.coordinator.fetch_offsets("g", None) == {("t", 0): (42, "m")}


@pytest.mark.asyncio
async def test_sync_group_hands_the_leaders_assignment_to_each_member() -> None:
    s = Setup()
    a, b = await s.join_two()
    waiting = await s.sync(b)
    assert not waiting.done()  # until the leader's assignment arrives
    stale = await s.sync(JoinResult(0, a.member_id, generation_id=0))
    assert stale.result().error_code == Errors.ILLEGAL_GENERATION
    unknown = await s.sync(JoinResult(0, "nobody", generation_id=1))
    assert unknown.result().error_code == Errors.UNKNOWN_MEMBER_ID
    leader = await s.sync(a, {a.member_id: b"A", b.member_id: b"B"})
    assert leader.result() == SyncResult(Errors.NONE, b"A", "consumer", "range")
    assert waiting.result().assignment == b"B"
    assert s.state() == "Stable"
    again = await s.sync(b)  # in Stable: the current assignment
    assert again.result().assignment == b"B"


@pytest.mark.asyncio
async def test_a_rebalance_voids_the_assignment_under_way() -> None:
    s = Setup()
    a, b = await s.join_two()
    waiting = await s.sync(b)
    await s.join()  # a third member arrives before the leader assigned
    assert waiting.result().error_code == Errors.REBALANCE_IN_PROGRESS
    late = await s.sync(a)
    assert late.result().error_code == Errors.REBALANCE_IN_PROGRESS


@pytest.mark.asyncio
async def test_join_group_refusals() -> None:
    s = Setup(min_session_timeout_ms=500)
    refused = await s.join(session_ms=499)
    assert refused.result().error_code == Errors.INVALID_SESSION_TIMEOUT
    refused = await s.join(group="")
    assert refused.result().error_code == Errors.INVALID_GROUP_ID
    refused = await s.join("stranger")
    assert refused.result().error_code == Errors.UNKNOWN_MEMBER_ID
    await s.join()
    refused = await s.join(protocols=[("sticky", b"")])  # nothing in common with the group
    assert refused.result().error_code == Errors.INCONSISTENT_GROUP_PROTOCOL


@pytest.mark.asyncio
async def test_a_v4_join_hands_out_a_member_id_that_expires_unless_used() -> None:
    s = Setup()
    first = await s.join(version=4, session_ms=1000)
    pending = first.result()
    assert pending.error_code == Errors.MEMBER_ID_REQUIRED
    assert pending.member_id.startswith("client-")
    joined = await s.join(pending.member_id, version=4)
    await s.advance(DELAY_MS / 1000)
    assert joined.result().member_id == pending.member_id
    assert joined.result().generation_id == 1
    # An id handed out and never used is forgotten after the session timeout.
    unused = (await s.join(version=4, session_ms=1000)).result().member_id
    assert unused in s.coordinator.groups["g"].pending_members
    await s.advance(1.0)
    assert unused not in s.coordinator.groups["g"].pending_members


@pytest.mark.asyncio
async def test_offset_commits_are_checked_against_the_generation() -> None:
    s = Setup()
    commit = s.coordinator.commit_offsets
    # A group that only stores offsets (generation -1, no member): allowed while it is empty.
    assert commit("solo", -1, "", [(("t", 0), 5, None)]) == {("t", 0): Errors.NONE}
    assert commit("solo", -1, "", [(("x", 0), 5, None)]) == {
        ("x", 0): Errors.UNKNOWN_TOPIC_OR_PARTITION
    }
    assert commit("nobody", 3, "m", [(("t", 0), 5, None)]) == {("t", 0): Errors.ILLEGAL_GENERATION}
    (a,) = await s.stable(1)
    assert commit("g", a.generation_id + 1, a.member_id, [(("t", 1), 7, None)]) == {
        ("t", 1): Errors.ILLEGAL_GENERATION
    }
    assert commit("g", a.generation_id, "stranger", [(("t", 1), 7, None)]) == {
        ("t", 1): Errors.UNKNOWN_MEMBER_ID
    }
    assert commit("g", -1, "", [(("t", 1), 7, None)]) == {("t", 1): Errors.UNKNOWN_MEMBER_ID}
    assert commit("g", a.generation_id, a.member_id, [(("t", 1), 7, None)]) == {
        ("t", 1): Errors.NONE
    }


@pytest.mark.asyncio
async def test_a_rejoin_with_nothing_new_gets_the_current_generation() -> None:
    s = Setup()
    a, b = await s.join_two()
    retried = await s.join(a.member_id)  # in CompletingRebalance: the same answer again
    assert retried.result() == a
    await s.sync(b)
    await s.sync(a, {a.member_id: b"A", b.member_id: b"B"})
    follower = await s.join(b.member_id)  # a follower in Stable, nothing new: no rebalance
    assert follower.result() == b
    assert s.state() == "Stable"
    leader = await s.join(a.member_id)  # the leader's rejoin in Stable: a rebalance
    assert s.state() == "PreparingRebalance"
    assert not leader.done()
    b_again = await s.join(b.member_id)
    assert leader.result().generation_id == b_again.result().generation_id == 2


@pytest.mark.asyncio
async def test_a_stale_generation_gets_illegal_generation_even_during_a_rebalance() -> None:
    """Kafka checks the member, then the generation, then the state (handleHeartbeat,
    doCommitOffsets): a member of an older generation must rejoin from scratch, which
    ``REBALANCE_IN_PROGRESS`` would not tell it."""
    s = Setup()
    a, b = await s.stable(2)
    heartbeat, commit = s.coordinator.heartbeat, s.coordinator.commit_offsets
    stale = a.generation_id - 1
    assert heartbeat("g", a.member_id, stale) == Errors.ILLEGAL_GENERATION
    rejoin = await s.join(b.member_id, protocols=[("range", b"changed")])  # a rebalance
    assert s.state() == "PreparingRebalance"
    assert heartbeat("g", a.member_id, stale) == Errors.ILLEGAL_GENERATION
    assert heartbeat("g", a.member_id, a.generation_id) == Errors.REBALANCE_IN_PROGRESS
    assert heartbeat("g", "stranger", stale) == Errors.UNKNOWN_MEMBER_ID
    offsets = [(("t", 0), 1, None)]
    assert commit("g", stale, a.member_id, offsets) == {("t", 0): Errors.ILLEGAL_GENERATION}
    # Kafka lets the current generation commit while it prepares to rebalance.
    assert commit("g", a.generation_id, a.member_id, offsets) == {("t", 0): Errors.NONE}
    rejoined = await s.join(a.member_id)
    await s.advance(0)
    assert s.state() == "CompletingRebalance"
    current = rejoined.result().generation_id
    assert rejoin.result().generation_id == current == a.generation_id + 1
    # Waiting for the assignment: the current generation is told to wait, an old one is stale.
    assert commit("g", current, a.member_id, offsets) == {("t", 0): Errors.REBALANCE_IN_PROGRESS}
    assert commit("g", a.generation_id, a.member_id, offsets) == {
        ("t", 0): Errors.ILLEGAL_GENERATION
    }
    assert heartbeat("g", a.member_id, a.generation_id) == Errors.ILLEGAL_GENERATION
    assert heartbeat("g", a.member_id, current) == Errors.NONE


@pytest.mark.asyncio
async def test_describe_and_list_show_members_and_their_assignment_once_stable() -> None:
    s = Setup()
    coordinator = s.coordinator
    assert coordinator.describe_group("g").state == "Dead"  # Kafka's answer for no group
    first, second = await s.join(), await s.join()
    await s.advance(DELAY_MS / 1000)
    assert coordinator.describe_group("g").state == "PreparingRebalance"
    await s.advance(DELAY_MS / 1000)
    a, b = first.result(), second.result()
    waiting = coordinator.describe_group("g")  # CompletingRebalance: no protocol, no data
    assert (waiting.state, waiting.protocol_type, waiting.protocol) == (
        "CompletingRebalance",
        "consumer",
        "",
    )
    assert [(m.member_id, m.metadata, m.assignment) for m in waiting.members] == [
        (a.member_id, b"", b""),
        (b.member_id, b"", b""),
    ]
    await s.sync(b)
    await s.sync(a, {a.member_id: b"A", b.member_id: b"B"})
    stable = coordinator.describe_group("g")
    assert (stable.state, stable.protocol) == ("Stable", "range")
    assert [(m.member_id, m.client_id, m.metadata, m.assignment) for m in stable.members] == [
        (a.member_id, "client", b"range-metadata", b"A"),
        (b.member_id, "client", b"range-metadata", b"B"),
    ]
    coordinator.commit_offsets("solo", -1, "", [(("t", 0), 5, None)])  # offsets only
    assert coordinator.list_groups() == [("g", "consumer", "Stable"), ("solo", "", "Empty")]
    assert coordinator.list_groups(["empty"]) == [("solo", "", "Empty")]
    assert coordinator.leave_group("g", [a.member_id, b.member_id]) == [Errors.NONE] * 2
    # The last member gone, the group stays a consumer group, Empty (as Kafka keeps it).
    assert coordinator.list_groups(["Empty", "Stable"]) == [
        ("g", "consumer", "Empty"),
        ("solo", "", "Empty"),
    ]
    assert coordinator.describe_group("g").members == ()
