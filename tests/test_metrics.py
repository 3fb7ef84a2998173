"""What the metrics exporters share (`purgatory._metrics`): the fields exported, and `Tracked`,
the purgatories they read: held weakly, dropped once shut down, named uniquely, read from
whichever thread asks without waiting for the loop that drives them, their counters carried over
to the next purgatory of their name."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import threading
import weakref

import pytest
from helpers import FlagOperation
from metrics_support import Purgatory, Scene, scene

from purgatory import DelayedOperationPurgatory, PurgatoryStatistics
from purgatory._metrics import COUNTERS, FIELDS, Tracked
from purgatory.testing import ManualClock

#: Every exporter test fails on an error logged beside its figures (conftest.py).
pytestmark = pytest.mark.usefixtures("no_errors_logged")


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
async def test_another_thread_reads_each_purgatory_without_its_loop() -> None:
    s, tracked = tracking_both()
    assert await asyncio.to_thread(tracked.snapshot) == [
        ("produce", s.produce.statistics()),
        ("fetch", s.fetch.statistics()),
    ]


@pytest.mark.asyncio
async def test_a_blocked_loop_does_not_hold_up_a_scrape() -> None:
    """The loop that drives the purgatory is blocked (here, until the scrape is over): the
    scrape reads without it, so it answers at once; a busy loop is no different."""
    s = scene()
    tracked = Tracked(timeout=0.05)
    tracked.add(s.produce)
    read: list[object] = []
    reader = threading.Thread(target=lambda: read.append(tracked.snapshot()))
    reader.start()
    reader.join()  # blocks this loop until the reader is done
    assert read == [[("produce", s.produce.statistics())]]


@pytest.mark.asyncio
async def test_a_read_that_keeps_failing_is_made_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only if reading here keeps failing (a structure caught changing) does the scrape wait
    for the loop, at most its timeout: then a blocked loop fails it with a clear error."""
    s = scene()
    tracked = Tracked(timeout=0.05)
    tracked.add(s.produce)
    real = DelayedOperationPurgatory.statistics
    loop_thread = threading.get_ident()

    def racing(self: Purgatory) -> PurgatoryStatistics:
        if threading.get_ident() != loop_thread:
            raise RuntimeError("dictionary changed size during iteration")
        return real(self)

    monkeypatch.setattr(DelayedOperationPurgatory, "statistics", racing)
    assert await asyncio.to_thread(tracked.snapshot) == [("produce", real(s.produce))]
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


def completed_counter(tracked: Tracked, name: str) -> int:
    (value,) = [stats.completed for found, stats in tracked.snapshot() if found == name]
    return value


def complete(purgatory: Purgatory, count: int) -> None:
    for _ in range(count):
        op = FlagOperation(10)
        op.ready = True
        assert purgatory.try_complete_else_watch(op, ["k"])


@pytest.mark.parametrize("ends", ["shut down", "garbage"])
def test_counters_never_go_back_when_a_purgatory_is_replaced(ends: str) -> None:
    """A purgatory that leaves (shut down, or garbage) and a new one of its name: the exported
    counter goes on from where the old one was, including what it did after the last scrape
    (when it is still there to be read)."""
    clock = ManualClock()
    tracked = Tracked()
    first = Purgatory("p", clock=clock)
    tracked.add(first)
    complete(first, 7)
    assert completed_counter(tracked, "p") == 7
    complete(first, 3)  # not scraped yet
    if ends == "shut down":
        asyncio.run(first.shutdown())
    else:
        del first
        gc.collect()
    assert tracked.snapshot() == []
    second = Purgatory("p", clock=clock)
    tracked.add(second)
    complete(second, 2)
    carried = 10 if ends == "shut down" else 7  # a purgatory gone is known by its last reading
    assert completed_counter(tracked, "p") == carried + 2
    assert second.statistics().completed == 2
    # Gauges are the new purgatory's own.
    ((_, stats),) = tracked.snapshot()
    assert stats.delayed == second.statistics().delayed


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
    gone = s.produce.statistics()
    assert tracked.snapshot() == [
        ("fetch", s.fetch.statistics()),
        (
            "produce",  # its counters go on from the shut down one's
            dataclasses.replace(
                again.statistics(),
                **{counter: getattr(gone, counter) for counter in COUNTERS},
            ),
        ),
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
