"""The load model's core speed over time: spells in which every event costs more.

Covered, deterministically (virtual time, hand-made sequences, no wall clock): a profile whose
speed never changes replays exactly as one without a speed; a spell of a slower core near the
knee lengthens the expiry-lateness tail while the busy time, whose mean the sequence keeps,
stays; the factor is a function of the group and the trace's time (the same trace replays
identically, a group alone as beside others); a profile of version 5 keeps its speed, one of
version 4 loads with none; bad sequences are refused; `speed_of` turns timed units of work into
the sequence, window by window.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from load_support import MS, base_profile, gauges, w1_trace

from purgatory.pipeline import ReplayConfig, replay_table
from purgatory.pipeline._calibrate import speed_of
from purgatory.pipeline._load import COST_KINDS, load_profile, profile_from_json
from purgatory.pipeline._shards import split_table

CONFIG = {0: ReplayConfig(tick=MS)}
#: Every half second, a spell of 100 ms in which work costs 1.8 times what it costs around it
#: (20 ms windows), as the validation's machine was slowed: a spell lands in any 0.5 s of a
#: trace, wherever the group lays the sequence.
SPELLS = (1.0,) * 20 + (1.8,) * 5

#: Costs of the order the validation measures (one per module: see `base_profile`).
BASE = base_profile()


def test_one_speed_throughout_replays_as_no_speed_at_all() -> None:
    """Only the speed relative to its mean counts: a sequence that never changes, at whatever
    level, multiplies every cost by exactly 1."""
    trace = w1_trace(30_000, seconds=0.5)
    plain = replay_table(trace, CONFIG, costs=BASE)
    for level in (1.0, 3.0):
        steady = replace(BASE, speed=(level,) * 7, speed_window=20 * MS)
        assert steady.speed_at(0.123, 3) == 1.0
        assert not steady.constant
        assert replay_table(trace, CONFIG, costs=steady).equals(plain)


def test_a_slow_spell_near_the_knee_lengthens_the_tail_but_not_the_busy_time() -> None:
    """About 65 % busy on average, a loop slowed by 1.8 for 100 ms is past its knee meanwhile:
    it falls behind, and the expiries due in and after the spell are late by the backlog;
    the busy time, whose mean the sequence keeps (its factors over their mean), stays."""
    trace = w1_trace(45_000)
    steady = gauges(replay_table(trace, CONFIG, costs=BASE, operations=False))["p0000"]
    assert 0.55 < steady["busy"] / steady["span"] < 0.75
    spelled = replace(BASE, speed=SPELLS, speed_window=20 * MS)
    slowed = gauges(replay_table(trace, CONFIG, costs=spelled, operations=False))["p0000"]
    assert slowed["busy"] == pytest.approx(steady["busy"], rel=0.05)
    assert slowed["lateness_p99"] > 3 * steady["lateness_p99"]
    assert slowed["lateness_p99"] > 10 * MS
    # At a quarter of the load the same spells leave the loop well below its knee: the tail
    # stays within a millisecond of the steady one.
    light = w1_trace(12_000)
    quiet = gauges(replay_table(light, CONFIG, costs=BASE, operations=False))["p0000"]
    spelled_quiet = gauges(replay_table(light, CONFIG, costs=spelled, operations=False))["p0000"]
    assert spelled_quiet["lateness_p99"] == pytest.approx(quiet["lateness_p99"], abs=MS)


def test_the_speed_depends_on_the_group_and_the_time_only() -> None:
    """The exactness the pipeline relies on (a Spark task, a split of the groups, a rerun):
    the factor is the group's window of the sequence at the event's time."""
    profile = replace(BASE, speed=SPELLS, speed_window=20 * MS)
    trace = w1_trace(30_000, seconds=0.5, purgatories=2)
    first = replay_table(trace, CONFIG, costs=profile)
    assert replay_table(trace, CONFIG, costs=profile).equals(first)
    alone = replay_table(trace.filter(pc.equal(trace["purgatory"], "p0001")), CONFIG, costs=profile)
    assert alone.equals(first.filter(pc.equal(first["purgatory"], "p0001")))
    # The speed is used: the same trace at one speed ends otherwise.
    assert not replay_table(trace, CONFIG, costs=BASE).equals(first)
    # Window by window, laid from the group's offset, circular.
    mean = sum(SPELLS) / len(SPELLS)
    assert profile.speed_at(0.0, 20) == pytest.approx(1.8 / mean)
    assert profile.speed_at(0.019, 20) == pytest.approx(1.8 / mean)
    assert profile.speed_at(0.1, 20) == pytest.approx(1.0 / mean)  # window 25: back to 0
    assert profile.speed_at(0.5 + 0.001, 20) == pytest.approx(1.8 / mean)


def test_a_profile_keeps_its_speed_and_an_older_one_has_none(tmp_path: Path) -> None:
    profile = replace(BASE, speed=SPELLS, speed_window=20 * MS)
    path = tmp_path / "new.json"
    path.write_text(json.dumps(profile.to_json()))
    loaded = load_profile(str(path))
    assert loaded == profile
    assert loaded.speed_mean == profile.speed_mean == pytest.approx(sum(SPELLS) / len(SPELLS))
    assert loaded.spells() == pytest.approx(0.2)
    said = loaded.describe()
    assert "the core's speed over 25 windows of 20 ms" in said
    assert "20% of them slowed by 20 % or more" in said
    # Version 4 had no speed: what a file of it says about one is not read.
    data = profile.to_json()
    data["version"] = 4
    older = profile_from_json(data, "test")
    assert older.speed == ()
    assert older.speed_window == 0.0
    assert older.speed_at(0.3, 0) == 1.0


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"speed": [1.0, -1.0], "speed_window": 0.02}, "not a factor in (0, 100000]"),
        ({"speed": [1.0, 0.0], "speed_window": 0.02}, "not a factor in (0, 100000]"),
        ({"speed": [1.0, "fast"], "speed_window": 0.02}, "speed holds a value that is not"),
        ({"speed": [1.0, 2.0]}, "speed is given without its window"),
        ({"speed": 1.0, "speed_window": 0.02}, "speed must be at most"),
        ({"speed": [1.0], "speed_window": 2.0}, "'speed_window' must be a number of seconds"),
        ({"version": 6}, "version 6, expected 3 or 4 or 5"),
    ],
)
def test_bad_speeds_are_refused(changes: dict[str, object], said: str) -> None:
    data = {"version": 5, "costs": dict.fromkeys(COST_KINDS, 1e-6), **changes}
    with pytest.raises(ValueError, match=r"^cost profile test: ") as info:
        profile_from_json(data, "test")
    assert said in str(info.value)


def test_timed_units_of_work_give_the_speed_window_by_window() -> None:
    """Units of 1 us in the first 10 ms, of 2 us in the next, none in the third (the thread
    held off the core: left out), of 1 us in the fourth; (start, CPU) nanoseconds."""
    units = (
        [(i * 1_000_000, 1000) for i in range(10)]
        + [(10_000_000 + i * 1_000_000, 2000) for i in range(5)]
        + [(30_000_000 + i * 500_000, 1000) for i in range(5)]
    )
    mean = (10 * 1000 + 5 * 2000 + 5 * 1000) / 20
    assert speed_of(units, window=0.01) == pytest.approx((1000 / mean, 2000 / mean, 1000 / mean))
    assert speed_of([], window=0.01) == ()
    # One window for all: its factor is 1.
    assert speed_of(units, window=1.0) == (1.0,)


def test_a_replay_split_by_time_runs_at_the_same_speeds_as_unsplit() -> None:
    """The factor is the window of the trace's time the event starts in, not a history: a
    shard's warm-up meets the same speeds as the unsplit replay did, and the split replay
    equals it on every row (purging at every pass, so that a warm-up rebuilds the state;
    near the knee, so the spells make backlogs that cross boundaries)."""
    trace = w1_trace(40_000, seconds=1.0)
    configs = {0: ReplayConfig(tick=MS, purge_interval=0)}
    profile = replace(BASE, speed=SPELLS, speed_window=20 * MS)
    unsplit = replay_table(trace, configs, costs=profile)
    split, boundaries = split_table(trace, configs, 3, costs=profile, extra=0.3)

    def rows(table: pa.Table) -> list[dict[str, object]]:
        return sorted(
            table.to_pylist(), key=lambda r: (r["op_id"] is None, r["op_id"] or 0, r["purgatory"])
        )

    assert rows(split) == rows(unsplit)
    assert len(boundaries) == 2
