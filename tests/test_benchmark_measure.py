"""`benchmarks.measure`: the one place figures are timed and summarised."""

from __future__ import annotations

import pytest

from benchmarks.measure import PyperfSettings, figure, lateness_ms, pyperf_group, quantile, spread


def test_spread_is_nearest_rank_and_ignores_missing_values() -> None:
    found = spread([5.0, None, 1.0, 4.0, 2.0, 3.0])
    assert found == {"n": 5, "median": 3.0, "q1": 2.0, "q3": 4.0, "min": 1.0, "max": 5.0}
    assert spread([7.0]) == {"n": 1, "median": 7.0, "q1": 7.0, "q3": 7.0, "min": 7.0, "max": 7.0}
    assert spread([None])["n"] == 0
    assert spread([])["median"] is None


def test_a_figure_carries_its_unit_and_direction() -> None:
    made = figure([2.0, 4.0], "/s", "higher")
    assert made["unit"] == "/s"
    assert made["better"] == "higher"
    assert made["median"] == 3.0
    assert figure(spread([1.0]), "us/op") == {"unit": "us/op", "better": "lower", **spread([1.0])}


def test_quantiles_and_lateness() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0
    with pytest.raises(ValueError, match="empty"):
        quantile([], 0.5)
    late = lateness_ms([0.002, -0.001, 0.001])
    assert late["n"] == 3
    assert late["min"] == pytest.approx(-1.0)
    assert late["max"] == pytest.approx(2.0)
    assert lateness_ms([])["p99"] is None


def test_pyperf_runs_a_group_in_its_workers_and_reports_per_operation() -> None:
    """The whole path: this module starts ``python -m benchmarks.micro``, pyperf starts its
    workers with the group's arguments, and the values come back in microseconds per expiry."""
    settings = PyperfSettings(processes=1, values=2, warmups=0, min_time=0.001)
    found = pyperf_group("expiry-cost", settings, quick=True, seed=1)
    ((name, us),) = found.items()
    assert name == "expiry in a timer pass, 20,000 pending"
    assert us["n"] == 2
    low, median, high = (float(us[q] or 0.0) for q in ("min", "median", "max"))
    assert 0.0 < low <= median <= high


def test_a_failing_group_says_why() -> None:
    settings = PyperfSettings(processes=1, values=1, warmups=0, min_time=0.001)
    with pytest.raises(RuntimeError, match="pyperf group 'no-such-group' failed"):
        pyperf_group("no-such-group", settings, quick=True, seed=1)
