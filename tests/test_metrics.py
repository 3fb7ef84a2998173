"""What the metrics exporters share (`purgatory._metrics`): the fields exported, and `Tracked`,
the purgatories they read: held weakly, dropped once shut down, named uniquely, and read on the
event loop that drives them, whichever thread asks."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import threading
import weakref

import pytest
from helpers import FlagOperation
from metrics_support import Purgatory, Scene, scene

from purgatory import PurgatoryStatistics
from purgatory._metrics import FIELDS, Tracked
from purgatory.testing import ManualClock


def test_every_statistics_field_is_exported_by_name() -> None:
    fields = {field.name for field in dataclasses.fields(PurgatoryStatistics)}
    exported = {field.attribute for field in FIELDS}
    # A field added to PurgatoryStatistics is named in purgatory/_metrics.py's FIELDS (its
    # kind, unit and help) to be exported.
    assert exported == fields
    assert len({field.metric for field in FIELDS}) == len(FIELDS)


def tracking_both() -> tuple[Scene, Tracked]:
    """The scene's two purgatories, tracked in that order."""
    s = scene()
    tracked = Tracked()
    tracked.add(s.produce)
    tracked.add(s.fetch)
    return s, tracked


def test_a_purgatory_added_with_no_loop_running_is_read_directly() -> None:
    s, tracked = tracking_both()
    assert tracked.snapshot() == [
        ("produce", s.produce.statistics()),
        ("fetch", s.fetch.statistics()),
    ]


@pytest.mark.asyncio
async def test_another_thread_reads_each_purgatory_on_its_loop() -> None:
    s, tracked = tracking_both()
    # Answered while this loop waits for the thread (a read needs the loop: see the next test).
    assert await asyncio.to_thread(tracked.snapshot) == [
        ("produce", s.produce.statistics()),
        ("fetch", s.fetch.statistics()),
    ]


@pytest.mark.asyncio
async def test_a_blocked_loop_fails_the_read_with_a_clear_error() -> None:
    tracked = Tracked(timeout=0.05)
    tracked.add(scene().produce)
    failed: list[BaseException] = []

    def read() -> None:
        try:
            tracked.snapshot()
        except TimeoutError as exc:
            failed.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join()  # blocks the loop until the reader gives up: a read on it cannot run
    (error,) = failed
    assert str(error) == (
        "the event loop of purgatory 'produce' did not answer within 0.05 s "
        "(blocked, or stopped without being closed)"
    )


def test_a_purgatory_whose_loop_is_closed_is_not_read() -> None:
    tracked = Tracked()

    async def add() -> Purgatory:
        purgatory = Purgatory("gone-with-its-loop", clock=ManualClock())
        tracked.add(purgatory)
        return purgatory

    kept = asyncio.run(add())  # the loop is closed when this returns
    assert not kept.closed
    assert tracked.snapshot() == []


@pytest.mark.asyncio
async def test_a_tracked_purgatory_is_not_kept_alive() -> None:
    tracked = Tracked()
    purgatory = Purgatory("short-lived", clock=ManualClock())
    purgatory.try_complete_else_watch(FlagOperation(5), ["k"])
    tracked.add(purgatory)
    gone = weakref.ref(purgatory)
    del purgatory
    gc.collect()
    assert gone() is None
    assert tracked.snapshot() == []


@pytest.mark.asyncio
async def test_a_shut_down_purgatory_is_dropped_and_its_name_can_be_taken_again() -> None:
    s, tracked = tracking_both()
    await s.produce.shutdown()
    assert [name for name, _ in tracked.snapshot()] == ["fetch"]
    again = Purgatory("produce", clock=s.clock)
    tracked.add(again)
    assert tracked.snapshot() == [
        ("fetch", s.fetch.statistics()),
        ("produce", again.statistics()),
    ]


@pytest.mark.asyncio
async def test_what_cannot_be_exported_is_refused() -> None:
    s = scene()
    tracked = Tracked()
    tracked.add(s.produce)
    with pytest.raises(ValueError, match="purgatory 'produce' is already exported"):
        tracked.add(s.produce)
    with pytest.raises(ValueError, match="another purgatory named 'produce' is already exported"):
        tracked.add(Purgatory("produce", clock=s.clock))
    closed = Purgatory("closed", clock=s.clock)
    await closed.shutdown()
    with pytest.raises(ValueError, match="purgatory 'closed' is shut down: nothing to export"):
        tracked.add(closed)
    with pytest.raises(TypeError, match="expected a DelayedOperationPurgatory, got 'produce'"):
        tracked.add("produce")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be > 0 seconds, got 0"):
        Tracked(timeout=0)
