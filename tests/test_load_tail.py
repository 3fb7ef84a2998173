"""The load model's tail: each event's cost and stall drawn from the profile's distributions.

Covered, deterministically (seeded draws, no wall clock): the draws are used (a profile with a
wide cost distribution, or with stalls, gives a longer expiry-lateness tail than a constant
one of the same mean, and the same busy time within the draws' noise); the draws average to
the mean cost; a stall is as likely per second of CPU; the same trace replays identically, and
a group replays the same alone or beside others (a draw is a function of the group and the
event, not of the draws before it); an old profile (version 3) loads with constant costs and
says so, and replays exactly as before; bad distributions are refused; `shape_and_stall`
turns timed callbacks into a profile's distributions.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from load_support import MS, US, base_profile, gauges, w1_trace

from purgatory.pipeline import ReplayConfig, replay_table
from purgatory.pipeline._calibrate import shape_and_stall
from purgatory.pipeline._load import (
    COST_KINDS,
    SHAPE_QUANTILES,
    CostProfile,
    load_profile,
    profile_from_json,
)
from purgatory.pipeline._replay import _unit

#: Most events a little under the mean, one in a thousand 30 to 100 times it.
WIDE = (0.4, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1, 1.5, 2.0, 30.0, 60.0, 100.0, 150.0)
#: One event in two hundred held off the core (one in a thousand for 1 to 6 ms), as by a
#: preempting process.
STALLS = (0.0,) * 9 + (1 * MS, 2 * MS, 4 * MS, 6 * MS)
CONFIG = {0: ReplayConfig(tick=MS)}

#: Costs of the order the validation measures (one per module: see `base_profile`).
BASE = base_profile()


def test_a_wide_cost_distribution_gives_a_longer_tail_than_a_constant_one_of_its_mean() -> None:
    """Near the knee (the constant profile about 80 % busy) a rare long event holds a batch and
    the reaper behind it, and the backlog drains slowly: the lateness tail grows, while the
    busy time, whose mean the draws keep, stays."""
    trace = w1_trace(50_000)
    constant = gauges(replay_table(trace, CONFIG, costs=BASE, operations=False))["p0000"]
    assert 0.75 < constant["busy"] / constant["span"] < 0.9
    wide = gauges(
        replay_table(trace, CONFIG, costs=replace(BASE, cost_shape=WIDE), operations=False)
    )["p0000"]
    assert wide["busy"] == pytest.approx(constant["busy"], rel=0.05)
    assert wide["lateness_p99"] > 1.5 * constant["lateness_p99"]
    assert wide["pass_late_p99"] > constant["pass_late_p99"]


def test_stalls_lengthen_the_tail_without_adding_busy_time() -> None:
    trace = w1_trace(30_000)
    constant = gauges(replay_table(trace, CONFIG, costs=BASE, operations=False))["p0000"]
    stalled = gauges(
        replay_table(
            trace,
            CONFIG,
            costs=replace(BASE, stall=STALLS, stall_basis=15 * US),
            operations=False,
        )
    )["p0000"]
    assert stalled["lateness_p99"] > 1.5 * constant["lateness_p99"]
    # A stall holds the core without running the loop: no busy time of its own (and fewer
    # wake-ups, the loop finding work waiting after one), a longer share of the span idle.
    assert stalled["busy"] <= constant["busy"]
    assert stalled["busy"] / stalled["span"] < constant["busy"] / constant["span"]


def test_a_loop_just_woken_is_not_stalled() -> None:
    """The scheduler favours a thread that slept: within `stall_credit` of its wake-up an
    event draws no stall. A loop that sleeps more often than the credit is never stalled."""
    trace = w1_trace(30_000)
    constant = replay_table(trace, CONFIG, costs=BASE)
    stalled = replace(BASE, stall=STALLS, stall_basis=15 * US)
    assert replay_table(trace, CONFIG, costs=replace(stalled, stall_credit=1.0)).equals(constant)
    assert not replay_table(trace, CONFIG, costs=stalled).equals(constant)
    # A credit of a millisecond: only the events of the longer busy spells are stalled, so
    # the tail lies between none and stalls from every wake-up on.
    late = [
        gauges(replay_table(trace, CONFIG, costs=p, operations=False))["p0000"]["lateness_p99"]
        for p in (BASE, replace(stalled, stall_credit=MS), stalled)
    ]
    assert late[0] < late[1] < late[2]


def test_the_cost_factors_average_to_one() -> None:
    """The costs are means: a factor drawn uniformly averages to 1 (linear between the
    quantiles, scaled by the mean of that line)."""
    profile = replace(BASE, cost_shape=WIDE)
    n = 200_000
    mean = sum(profile.cost_factor((i + 0.5) / n) for i in range(n)) / n
    assert mean == pytest.approx(1.0, rel=1e-3)
    assert profile.cost_factor(0.0) == pytest.approx(WIDE[0] / profile.shape_mean)
    assert profile.cost_factor(1.0) == pytest.approx(WIDE[-1] / profile.shape_mean)
    assert BASE.cost_factor(0.999) == 1.0  # no distribution: the cost itself


def test_a_stall_is_as_likely_per_second_of_cpu() -> None:
    """An event costing twice the measured events' mean is stalled beyond x twice as often."""
    profile = replace(BASE, stall=STALLS, stall_basis=10 * US)
    n = 100_000
    for cost, share in ((10 * US, 0.005), (20 * US, 0.01), (5 * US, 0.0025)):
        stalled = sum(profile.stall_at((i + 0.5) / n, cost) > 0 for i in range(n)) / n
        assert stalled == pytest.approx(share, rel=0.02), cost
    assert profile.stall_at(0.99999, 0.0) == 0.0  # no CPU, no preemption
    # Without a basis, every event draws the measured stall as it is.
    assert replace(profile, stall_basis=0.0).stall_at(1.0, 1 * US) == 6 * MS


def test_the_drawn_stalls_average_to_the_measured_mean() -> None:
    """The quantiles, linear up to the largest stall (one sample), overstate the mean: the
    draws are scaled to the mean measured, per CPU second as the stalls come."""
    profile = replace(BASE, stall=STALLS, stall_basis=10 * US, stall_mean=2 * US)
    n = 200_000
    for cost in (10 * US, 20 * US):
        mean = sum(profile.stall_at((i + 0.5) / n, cost) for i in range(n)) / n
        assert mean == pytest.approx(2 * US * cost / (10 * US), rel=0.01), cost
    unscaled = replace(profile, stall_mean=0.0)
    assert unscaled.stall_at(1.0, 10 * US) == STALLS[-1]
    assert profile.stall_at(1.0, 10 * US) == pytest.approx(STALLS[-1] * profile.stall_scale)
    assert profile.stall_scale < 1  # (these quantiles' mean is larger than 2 us)


def test_the_draws_depend_on_the_event_not_on_the_draws_before_it() -> None:
    draws = [_unit(12345, e) for e in range(20_000)]
    assert draws == [_unit(12345, e) for e in range(20_000)]
    assert all(0 <= u < 1 for u in draws)
    assert sum(draws) / len(draws) == pytest.approx(0.5, abs=0.01)
    assert sum(u < 0.01 for u in draws) == pytest.approx(200, rel=0.25)
    assert _unit(12346, 7) != _unit(12345, 7)


def test_the_same_trace_replays_identically_and_a_group_alone_as_beside_others() -> None:
    """The exactness the pipeline relies on (a Spark task, a split of the groups, a rerun):
    the draws are seeded by the group and keyed by the event."""
    profile = replace(BASE, cost_shape=WIDE, stall=STALLS, stall_basis=15 * US)
    trace = w1_trace(20_000, seconds=0.5, purgatories=2)
    first = replay_table(trace, CONFIG, costs=profile)
    assert replay_table(trace, CONFIG, costs=profile).equals(first)
    alone = replay_table(trace.filter(pc.equal(trace["purgatory"], "p0001")), CONFIG, costs=profile)
    assert alone.equals(first.filter(pc.equal(first["purgatory"], "p0001")))
    # The draws are used: the same trace with constant costs ends otherwise.
    assert not replay_table(trace, CONFIG, costs=BASE).equals(first)


def old_profile(tmp_path: Path) -> str:
    path = tmp_path / "old.json"
    data = BASE.to_json()
    data["version"] = 3
    for name in (
        "cost_shape",
        "stall",
        "stall_basis",
        "stall_credit",
        "stall_mean",
        "speed",
        "speed_window",
    ):
        del data[name]
    path.write_text(json.dumps(data))
    return str(path)


def test_an_old_profile_loads_with_constant_costs_and_says_so(tmp_path: Path) -> None:
    profile = load_profile(old_profile(tmp_path))
    assert profile.constant
    assert profile.cost_shape == profile.stall == ()
    assert "constant costs per event kind" in profile.describe()
    assert profile == BASE
    # Constant costs draw nothing per event: the replay is the one before distributions were
    # drawn (the wake-ups' latencies from the group's sequence, as then).
    trace = w1_trace(20_000, seconds=0.5)
    assert replay_table(trace, CONFIG, costs=profile).equals(
        replay_table(trace, CONFIG, costs=BASE)
    )


def test_a_new_profile_round_trips(tmp_path: Path) -> None:
    profile = replace(
        BASE, cost_shape=WIDE, stall=STALLS, stall_basis=15 * US, stall_credit=MS, stall_mean=US
    )
    path = tmp_path / "new.json"
    path.write_text(json.dumps(profile.to_json()))
    loaded = load_profile(str(path))
    assert loaded == profile
    assert loaded.shape_mean == profile.shape_mean
    assert loaded.stall_scale == profile.stall_scale != 1.0
    assert not loaded.constant
    assert "p99.9 x" in loaded.describe()


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"cost_shape": [1.0]}, "cost_shape must be 13 quantiles"),
        ({"cost_shape": [2.0, *(1.0,) * 12]}, "cost_shape's quantiles must not decrease"),
        ({"cost_shape": [0.0] * 13}, "cost_shape's quantiles are all 0"),
        ({"cost_shape": [-1.0, *(1.0,) * 12]}, "not factors in [0, 100000]"),
        ({"stall": ["1 ms", *(0.0,) * 12]}, "stall holds a value that is not seconds"),
        ({"stall": [*(0.0,) * 12, 2.0]}, "stall holds 2.0, not seconds in [0, 1]"),
        ({"version": 6}, "version 6, expected 3 or 4 or 5"),
        ({"stall_basis": -1.0}, "'stall_basis' must be a number of seconds"),
        ({"stall_credit": 2.0}, "'stall_credit' must be a number of seconds in [0, 1]"),
        (
            {"stall": [0.0] * 13, "stall_mean": 1e-6},
            "stall_mean is given, but stall's quantiles are all 0",
        ),
    ],
)
def test_bad_distributions_are_refused(changes: dict[str, object], said: str) -> None:
    data = {"version": 4, "costs": dict.fromkeys(COST_KINDS, 1e-6), **changes}
    with pytest.raises(ValueError, match=r"^cost profile test: ") as info:
        profile_from_json(data, "test")
    assert said in str(info.value)


def test_timed_callbacks_give_the_shape_the_stall_and_its_basis() -> None:
    """99 callbacks of 1 us, one of 10 us held off the core 20 us more (nanoseconds)."""
    timings = [(1000, 1000)] * 99 + [(10_000, 30_000)]
    shape, stall, basis, stall_mean = shape_and_stall(timings)
    assert stall_mean == pytest.approx(20e-6 / 100)
    mean = (99 * 1000 + 10_000) / 100
    assert basis == pytest.approx(mean * 1e-9)
    assert len(shape) == len(stall) == len(SHAPE_QUANTILES)
    assert shape[SHAPE_QUANTILES.index(0.5)] == pytest.approx(1000 / mean)
    assert shape[-1] == pytest.approx(10_000 / mean)
    assert stall[SHAPE_QUANTILES.index(0.99)] == 0.0
    assert stall[-1] == pytest.approx(20e-6)


# Hold-offs: spells the core is held off at given times (a measured run's preemptions).

#: Round numbers, so that the schedule can be worked out by hand (no draws, no wake cost).
HAND = CostProfile(
    dispatch=0.0,
    wake=0.0,
    watch=2 * MS,
    watch_key=0.0,
    attempt=0.0,
    completion=1 * MS,
    expiry=0.5 * MS,
    timer_pass=1 * MS,
    purged_entry=0.0,
)


def hand_trace(rows: list[tuple[int, float, float]]) -> pa.Table:
    """(op_id, arrival, timeout) rows of one purgatory on key "a", never met."""
    return pa.table(
        {
            "purgatory": pa.array(["p"] * len(rows)),
            "op_id": pa.array([r[0] for r in rows], pa.int64()),
            "arrival": pa.array([r[1] for r in rows], pa.float64()),
            "keys": pa.array([["a"] for _ in rows], pa.list_(pa.string())),
            "timeout": pa.array([r[2] for r in rows], pa.float64()),
            "condition_at": pa.array([None] * len(rows), pa.float64()),
        }
    )


def ops_by_id(table: pa.Table) -> dict[int, dict[str, object]]:
    return {r["op_id"]: r for r in table.filter(pc.is_valid(table["op_id"])).to_pylist()}


def test_a_hold_off_delays_the_work_it_falls_in_and_a_wake_up_inside_it_worked_out_by_hand() -> (
    None
):
    trace = hand_trace([(0, 0.0, 10 * MS), (1, 1.5 * MS, 100 * MS)])
    plain = replay_table(trace, CONFIG, costs=HAND)
    # Without hold-offs: op 0 watched 0-2 ms, op 1 at 2-4; op 0's pass at its deadline, 10 ms.
    assert ops_by_id(plain)[1]["watched_at"] == pytest.approx(2 * MS)
    assert ops_by_id(plain)[0]["ended_at"] == pytest.approx(10 * MS)
    # Held off 1-5 ms: op 0's watch (0-2 ms) is interrupted at 1 and ends at 6; op 1, arrived
    # at 1.5, is watched at 6 (to 8). Held off 9.5-12.5 ms: the idle loop due to wake at 10
    # for op 0's pass wakes at 12.5, and the expiry is 2.5 ms late.
    held = replace(HAND, holdoffs=((1 * MS, 4 * MS), (9.5 * MS, 3 * MS)))
    table = replay_table(trace, CONFIG, costs=held)
    ops = ops_by_id(table)
    assert ops[1]["watched_at"] == pytest.approx(6 * MS)
    assert ops[0]["outcome"] == "expired"
    assert ops[0]["ended_at"] == pytest.approx(12.5 * MS)
    # A hold-off holds the core without running the loop: the busy time is the same.
    assert gauges(table)["p"]["busy"] == pytest.approx(gauges(plain)["p"]["busy"])
    # A hold-off while the loop sleeps and ends before its wake-up changes nothing.
    idle = replace(HAND, holdoffs=((5 * MS, 3 * MS),))
    assert replay_table(trace, CONFIG, costs=idle).equals(plain)


def test_hold_offs_near_the_knee_lengthen_the_tail_and_replay_the_same() -> None:
    """A few spells of 8 ms (as the validation's runs were held off by other processes) near
    the knee give a longer expiry-lateness tail than none at the same load, and the same
    profile with the same hold-offs replays identically."""
    trace = w1_trace(30_000)
    spells = tuple((t, 8 * MS) for t in (0.3, 0.7, 1.1))
    held = replace(BASE, holdoffs=spells)
    without = gauges(replay_table(trace, CONFIG, costs=BASE, operations=False))["p0000"]
    first = replay_table(trace, CONFIG, costs=held)
    assert replay_table(trace, CONFIG, costs=held).equals(first)
    with_them = gauges(first)["p0000"]
    assert with_them["lateness_p99"] > 2 * without["lateness_p99"]
    assert with_them["lateness_p99"] > 5 * MS
    assert with_them["busy"] == pytest.approx(without["busy"], rel=0.01)


def test_hold_offs_are_not_kept_in_a_profile_file(tmp_path: Path) -> None:
    held = replace(BASE, cost_shape=WIDE, holdoffs=((0.1, MS),))
    assert "held off 1 times" in held.describe()
    path = tmp_path / "held.json"
    path.write_text(json.dumps(held.to_json()))
    assert load_profile(str(path)) == replace(held, holdoffs=())
    assert not BASE.zero
    zero = profile_from_json({"version": 4, "costs": dict.fromkeys(COST_KINDS, 0.0)}, "test")
    assert zero.zero
    assert not replace(zero, holdoffs=((0.1, MS),)).zero


@pytest.mark.parametrize(
    ("holdoffs", "said"),
    [
        (((0.2, MS), (0.1, MS)), "sorted and apart"),
        (((0.1, 2 * MS), (0.1015, MS)), "sorted and apart"),
        (((0.1, -MS),), "seconds in [0, 1]"),
        (((0.1, 2.0),), "seconds in [0, 1]"),
        (((math.inf, MS),), "a finite start"),
        (((0.1,),), "not a (start, seconds) pair"),
        ((("0.1", MS),), "not seconds"),
    ],
)
def test_bad_hold_offs_are_refused(holdoffs: tuple[object, ...], said: str) -> None:
    with pytest.raises(ValueError, match="holdoffs") as info:
        replace(BASE, holdoffs=holdoffs)  # type: ignore[arg-type]
    assert said in str(info.value)
