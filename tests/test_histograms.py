"""The exporters' histograms (`purgatory._histograms`): bucket bounds, the pairing of each end
with its watch in the event sink's batches, and what a tapped purgatory hands over."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from helpers import FlagOperation

from purgatory import DelayedOperationPurgatory, JsonLinesEventLog
from purgatory._histograms import DEFAULT_PARKED, ByName, HistogramBuckets, Histograms, Series, Tap
from purgatory.testing import ManualClock

#: Every exporter test fails on an error logged beside its figures (conftest.py).
pytestmark = pytest.mark.usefixtures("no_errors_logged")


def test_buckets_are_strictly_increasing_finite_numbers() -> None:
    assert HistogramBuckets().parked == DEFAULT_PARKED
    assert HistogramBuckets(parked=[1, 2]).parked == (1.0, 2.0)
    for bad in ([], [1, 1], [2, 1], [1, math.inf], [math.nan]):
        with pytest.raises(ValueError, match="parked must"):
            HistogramBuckets(parked=bad)
    with pytest.raises(TypeError, match="lateness must be numbers"):
        HistogramBuckets(lateness=["1"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"histograms must be a purgatory\.HistogramBuckets"):
        ByName((1, 2))  # type: ignore[arg-type]


def test_a_bound_is_inclusive_and_the_last_bucket_is_inf() -> None:
    series = Series((0.1, 1.0))
    series.add([0.05, 0.1, 0.5, 1.0, 3.0])
    assert series.counts == [2, 2, 1]
    counts, total = series.cumulative()
    assert counts == [2, 4, 5]
    assert total == pytest.approx(4.65)


class Collected:
    """A tap's target: each batch's values."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def __call__(self, values: Any) -> None:
        self.batches.append(values)


def test_a_tap_pairs_each_end_with_its_watch_and_leaves_out_what_it_cannot() -> None:
    got = Collected()
    tap = Tap([got])
    a, b, c, d, unseen = (FlagOperation(t) for t in (1.0, 2.0, 3.0, 4.0, 5.0))
    tap([a, ("k",), None, 10.0, b, ("k",), None, 10.5], [])
    tap(
        [c, ("k",), None, 11.0, d, ("k",), None, 11.0],
        [a, "completed", 10.25, b, "expired", 12.5, unseen, "completed", 12.0, c, "refused", 11],
    )
    tap([], [d, "cancelled", 14.0])
    first, second = got.batches
    assert dict(first.runs) == {"completed": [0.25], "expired": [2.0]}
    assert first.lateness == [0.0]  # expired at exactly 10.5 + 2
    assert (second.runs, second.lateness) == ([("cancelled", [3.0])], [])
    tap([], [a, "completed", 20.0])  # an end seen twice (never happens) is not counted twice
    assert len(got.batches) == 2


def tapped(
    clock: ManualClock, **options: Any
) -> tuple[DelayedOperationPurgatory[FlagOperation], Histograms]:
    p = DelayedOperationPurgatory[FlagOperation]("tapped", clock=clock, **options)
    by_name = ByName(HistogramBuckets(parked=(0.1, 1.0), lateness=(0.001, 0.01)))
    by_name.tap(p)
    histograms = by_name.get("tapped")
    assert histograms is not None
    return p, histograms


def test_a_tapped_purgatory_hands_over_its_outcomes_in_batches() -> None:
    clock = ManualClock()
    p, histograms = tapped(clock)
    ops = [FlagOperation(0.5, str(i)) for i in range(4)]
    for op in ops:
        p.try_complete_else_watch(op, ["k"])
    clock.advance(0.05)
    ops[0].ready = True
    p.check_and_complete("k")
    clock.advance(0.45)  # the other three expire at 0.5
    assert p.cancel_for_key("k") == []
    asyncio.run(p.shutdown())  # the last batch is taken
    parked, lateness = histograms.snapshot()
    assert parked["completed"][0] == [1, 1, 1]
    assert parked["completed"][1] == pytest.approx(0.05)
    assert parked["expired"][0] == [0, 3, 3]
    assert parked["expired"][1] == pytest.approx(1.5)
    assert parked["cancelled"] == ([0, 0, 0], 0.0)
    assert lateness[0] == [3, 3, 3]
    assert lateness[1] == pytest.approx(0.0, abs=1e-9)


def test_a_tap_goes_beside_an_event_log_which_records_as_before(tmp_path: Any) -> None:
    clock = ManualClock()
    log = JsonLinesEventLog(tmp_path, buffer_lines=2)
    p, histograms = tapped(clock, event_log=log)
    ops = [FlagOperation(0.5, str(i)) for i in range(5)]
    for op in ops:
        p.try_complete_else_watch(op, ["k"])
    clock.advance(1.0)
    asyncio.run(p.shutdown())
    log.close()
    lines = [line for path in tmp_path.glob("*.jsonl") for line in path.read_text().splitlines()]
    assert len(lines) == 5
    assert histograms.snapshot()[0]["expired"][0][-1] == 5


def test_two_exporters_tap_one_purgatory_each_with_its_buckets() -> None:
    clock = ManualClock()
    p, first = tapped(clock)
    second = ByName(HistogramBuckets(parked=(0.3,)))
    second.tap(p)
    p.try_complete_else_watch(FlagOperation(0.5), ["k"])
    clock.advance(0.5)
    asyncio.run(p.shutdown())
    assert first.snapshot()[0]["expired"][0] == [0, 1, 1]
    histograms = second.get("tapped")
    assert histograms is not None
    assert histograms.snapshot()[0]["expired"][0] == [0, 1]
