"""The purge rule (`purgatory._purge_rule`): Kafka's count of completions, and the time bound that
cleans the watcher lists of a quiet server within a second. On event loops in virtual time: the
reaper's passes and sleeps are exact, and take no wall time."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import weakref
from pathlib import Path
from typing import Any

import pytest
from helpers import FlagOperation

from purgatory import DelayedOperationPurgatory, JsonLinesEventLog
from purgatory._purge_rule import LINGER
from purgatory.testing import ManualClock, check_invariants

pytestmark = pytest.mark.virtualclock

TICK = 0.001


def lines_of(directory: Path) -> list[dict[str, Any]]:
    texts = [path.read_text() for path in directory.glob("*.jsonl")]
    return [json.loads(line) for text in texts for line in text.splitlines()]


def gauges(p: DelayedOperationPurgatory[Any]) -> tuple[int, int, int]:
    stats = p.statistics()
    return stats.delayed, stats.watched, stats.keys


async def settle() -> None:
    """Let the tasks just started park their operations (a few loop iterations)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def cancel(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` (as clients that go away) and wait for them, keeping no reference."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.asyncio
async def test_a_quiet_server_forgets_clients_that_left_within_the_bound() -> None:
    """50 long-polls parked on one key, whose clients go away (their watches cancelled): with no
    more traffic, Kafka's rule (1,000 completions) never purges; the time bound does, and the
    operations are freed."""
    async with DelayedOperationPurgatory[FlagOperation]("quiet") as p:
        ops = [FlagOperation(30.0, str(i)) for i in range(50)]
        tasks = [asyncio.create_task(p.watch(op, ["topic-0"])) for op in ops]
        await settle()
        assert gauges(p) == (50, 50, 1)
        await cancel(tasks)
        refs = [weakref.ref(op) for op in ops]
        del ops, tasks
        assert gauges(p) == (0, 50, 1)  # parked no more, still listed: what looked like a leak
        await asyncio.sleep(LINGER / 2)
        assert gauges(p) == (0, 50, 1)  # (a bound, not an eager purge)
        await asyncio.sleep(LINGER / 2 + 2 * TICK)
        assert gauges(p) == (0, 0, 0)
        gc.collect()
        assert [ref() for ref in refs] == [None] * 50
        check_invariants(p)


@pytest.mark.asyncio
async def test_what_a_drain_answered_leaves_the_lists_within_the_bound() -> None:
    async with DelayedOperationPurgatory[FlagOperation]("drained") as p:
        ops = [FlagOperation(30.0, str(i)) for i in range(10)]
        waiting = [asyncio.create_task(p.watch(op, [i % 3])) for i, op in enumerate(ops)]
        await settle()
        assert p.drain() == 10
        await asyncio.gather(*waiting)
        assert gauges(p) == (0, 10, 3)
        await asyncio.sleep(LINGER + 2 * TICK)
        assert gauges(p) == (0, 0, 0)
        check_invariants(p)


@pytest.mark.asyncio
async def test_an_idle_loop_is_woken_once_for_the_purge_and_never_after() -> None:
    async with DelayedOperationPurgatory[FlagOperation]("idle") as p:
        parked = FlagOperation(3600.0, "parked")  # a deadline far away: no pass for it
        p.try_complete_else_watch(parked, ["a", "b"])
        done = FlagOperation(3600.0, "done")
        p.try_complete_else_watch(done, ["a", "b"])
        await asyncio.sleep(60)
        passes = p.statistics().timer_passes  # nothing finished: no wake-up at all
        done.ready = True
        assert p.check_and_complete("a") == 1  # `done` stays on b's list
        assert gauges(p) == (1, 3, 2)
        await asyncio.sleep(600)
        assert gauges(p) == (1, 2, 2)
        assert p.statistics().timer_passes == passes + 1
        assert p.statistics().purges == 1


@pytest.mark.asyncio
async def test_under_traffic_no_finished_entry_stays_longer_than_the_bound() -> None:
    """Operations on two keys, each completed through one of them every 50 ms for 5 s (far
    from Kafka's 1,000): at every moment, what the lists hold beyond the live operations
    finished less than the bound ago."""
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[FlagOperation]("traffic") as p:
        finished_at: dict[int, float] = {}
        live = 0
        for i in range(100):
            op = FlagOperation(30.0, str(i))
            p.try_complete_else_watch(op, [("a", i % 7), ("b", i % 5)])
            live += 1
            await asyncio.sleep(0.05)
            if i % 2:  # every other one completes through its first key
                op.ready = True
                assert p.check_and_complete(("a", i % 7)) == 1
                finished_at[id(op)] = loop.time()
                live -= 1
            oldest = min(
                (finished_at[id(op)] for _, ops in p._lists for op in ops if op.is_completed),
                default=loop.time(),
            )
            assert loop.time() - oldest <= LINGER + 2 * TICK
        check_invariants(p)


def test_a_driven_clock_runs_kafkas_rule_only() -> None:
    """A ManualClock's passes stay Kafka's: what a test or a trace replay counts on."""
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("manual", clock=clock)
    op = FlagOperation(30.0)
    p.try_complete_else_watch(op, ["a", "b"])
    op.ready = True
    assert p.check_and_complete("a") == 1
    clock.advance_to(10.0)
    assert gauges(p) == (0, 1, 1)
    assert p.statistics().timer_passes == 0
    assert p.purge() == 1


@pytest.mark.asyncio
async def test_the_event_logs_batch_is_taken_within_the_bound(tmp_path: Path) -> None:
    """Ends waiting in the purgatory's event sink (its batch not full) hold their operations
    too: the time bound's pass takes them, whether the operation ended in a trigger, at its
    first try, or by a drain."""
    log = JsonLinesEventLog(tmp_path, buffer_lines=1000)
    async with DelayedOperationPurgatory[FlagOperation]("logged", event_log=log) as p:
        parked = FlagOperation(30.0, "parked")
        p.try_complete_else_watch(parked, ["a"])
        parked.ready = True
        assert p.check_and_complete("a") == 1
        at_once = FlagOperation(30.0, "at once")
        at_once.ready = True
        assert p.try_complete_else_watch(at_once, ["b"])
        assert p._sink is not None
        assert p._sink.ends  # waiting for a batch that will not fill
        await asyncio.sleep(LINGER + 2 * TICK)
        assert p._sink.ends == []
        assert log.open_operations == 0
    log.close()
    assert len(lines_of(tmp_path)) == 2
