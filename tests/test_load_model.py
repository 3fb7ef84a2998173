"""The replay's load model: each group served as one core serves an event loop.

Covered: a hand-made trace and profile whose queueing, late timer pass, utilisation and
lateness are worked out by hand below; a profile of zero costs replays exactly as no profile
(every operation, every gauge); no profile reports zero costs; bad profile files are refused in
one line (and by the command line with exit 2, before any Spark session); ``calibrate --quick``
writes a profile that loads; the Spark job with a profile equals the in-process replay.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import spark_support
from pyspark.sql import SparkSession
from spark_support import small_w1

from purgatory.pipeline import ReplayConfig, _spark, replay, replay_table
from purgatory.pipeline._calibrate import _QUICK
from purgatory.pipeline._chart import saturation_rate
from purgatory.pipeline._cli import main
from purgatory.pipeline._generate import chunk_plan, generate_chunk
from purgatory.pipeline._load import (
    COST_KINDS,
    GIVEN_KINDS,
    LATENCY_QUANTILES,
    PROFILE_VERSION,
    SHAPE_QUANTILES,
    CostProfile,
    load_profile,
    profile_from_json,
    save_profile,
)

MS = 0.001


def costs(every: float = 0.0, **changes: float) -> CostProfile:
    """A profile charging `every` seconds for each kind, but for `changes`."""
    return profile_from_json(
        {"version": PROFILE_VERSION, "costs": {**dict.fromkeys(COST_KINDS, every), **changes}},
        "test",
    )


#: Round numbers, so that the schedule can be worked out by hand.
PROFILE = CostProfile(
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
ZERO = costs()


def trace_table(rows: list[tuple[str, int, float, float, float | None]]) -> pa.Table:
    """A trace of (purgatory, op_id, arrival, timeout, condition_at) rows, all on key "a"."""
    return pa.table(
        {
            "purgatory": pa.array([r[0] for r in rows]),
            "op_id": pa.array([r[1] for r in rows], pa.int64()),
            "arrival": pa.array([r[2] for r in rows], pa.float64()),
            "keys": pa.array([["a"] for _ in rows], pa.list_(pa.string())),
            "timeout": pa.array([r[3] for r in rows], pa.float64()),
            "condition_at": pa.array([r[4] for r in rows], pa.float64()),
        }
    )


def split(table: pa.Table) -> tuple[dict[tuple[str, int], dict[str, Any]], dict[str, Any]]:
    """Operation rows by (purgatory, op_id), and the gauges rows by purgatory."""
    ops = table.filter(pc.is_valid(table["op_id"])).to_pylist()
    stats = table.filter(pc.is_null(table["op_id"])).to_pylist()
    return {(r["purgatory"], r["op_id"]): r for r in ops}, {r["purgatory"]: r for r in stats}


def test_queueing_and_a_late_timer_pass_worked_out_by_hand() -> None:
    trace = trace_table(
        [
            ("p", 0, 0.0, 10 * MS, None),
            ("p", 1, 0.5 * MS, 100 * MS, 3 * MS),
            ("p", 2, 1 * MS, 100 * MS, None),
            ("p", 3, 9.9 * MS, 100 * MS, None),
            ("q", 0, 0.0, 1.0, None),
            ("q", 1, 0.5 * MS, 1.0, 1 * MS),
        ]
    )
    ops, stats = split(replay_table(trace, {0: ReplayConfig(tick=MS)}, costs=PROFILE, check=True))
    # p, on one core. 0.0: op 0 watched (2 ms, busy to 2). Op 1 arrives at 0.5, waits for the
    # core, watched at 2 (busy to 4); op 2 arrives at 1, watched at 4 (busy to 6). Op 1's
    # condition (3) is served at 6: check_and_complete("a") completes it (1 ms, busy to 7).
    # Op 3 arrives at 9.9 to a free core (busy to 11.9). Op 0's deadline tick, 10, is served at
    # 11.9: a pass 1.9 ms late, expiring op 0 there (1 + 0.5 ms, busy to 13.4). Ops 2 and 3
    # expire on time at ticks 104 and 110 (deadline 109.9 rounded up), busy to 111.5.
    expected = {
        0: ("expired", 0.0, 10 * MS, 11.9 * MS),
        1: ("completed", 2 * MS, 102 * MS, 6 * MS),
        2: ("expired", 4 * MS, 104 * MS, 104 * MS),
        3: ("expired", 9.9 * MS, 109.9 * MS, 110 * MS),
    }
    for op_id, (outcome, watched, deadline, ended) in expected.items():
        row = ops["p", op_id]
        assert row["outcome"] == outcome, row
        assert row["watched_at"] == pytest.approx(watched, abs=1e-12)
        assert row["deadline"] == pytest.approx(deadline, abs=1e-12)
        assert row["ended_at"] == pytest.approx(ended, abs=1e-12)
    p = stats["p"]
    assert p["timer_passes"] == 3
    # 4 watches (8 ms), 1 completion (1 ms), 3 passes of one expiry each (4.5 ms).
    assert p["busy"] == pytest.approx(13.5 * MS)
    assert p["span"] == pytest.approx(111.5 * MS)
    # Passes 1.9, 0, 0 ms late: nearest rank p50 is 0, p99 and max 1.9 ms.
    assert p["pass_late_p50"] == 0.0
    assert p["pass_late_p99"] == pytest.approx(1.9 * MS, abs=1e-9)
    assert p["pass_late_max"] == pytest.approx(1.9 * MS, abs=1e-9)
    # Two tries per watch that waits, three on the key when op 1's condition fires.
    assert p["attempts"] == 4 * 2 + 3
    # Missed: the three expired; op 1 was answered at 6 ms, well within 100 ms of its arrival.
    assert p["missed"] == 3

    # q, on a core of its own: op 1's condition (1 ms) comes while it waits for the core (busy
    # with op 0 until 2): watched at 2 with its condition met, it completes inside the watch.
    assert ops["q", 1]["outcome"] == "completed"
    assert ops["q", 1]["watched_at"] == ops["q", 1]["ended_at"] == pytest.approx(2 * MS)
    assert stats["q"]["busy"] == pytest.approx(2 * MS + 1 * MS + 1.5 * MS)
    assert stats["q"]["missed"] == 1  # op 0 expired


def test_a_late_pass_is_late_from_its_deadline_even_when_its_first_bucket_empties() -> None:
    slow = costs(completion=5 * MS)
    trace = trace_table(
        [
            ("p", 0, 0.0, 100.0, 0.5 * MS),
            ("p", 1, 0.1 * MS, 2 * MS, 2.9 * MS),
            ("p", 2, 0.2 * MS, 3 * MS, None),
        ]
    )
    ops, stats = split(replay_table(trace, {0: ReplayConfig(tick=MS)}, costs=slow))
    # Op 0's condition (0.5 ms) holds the core until 5.5 ms. Op 1's condition (2.9 ms) comes
    # before its deadline tick (3 ms), so it is served first, at 5.5 ms: op 1 completes, its
    # bucket empties, and the next pass has op 2's tick, 4 ms, already past. That pass runs at
    # 10.5 ms, when the core is free: 6.5 ms late, from op 2's tick.
    assert ops["p", 1]["outcome"] == "completed"
    assert ops["p", 1]["ended_at"] == pytest.approx(5.5 * MS)
    assert ops["p", 2]["outcome"] == "expired"
    assert ops["p", 2]["ended_at"] == pytest.approx(10.5 * MS)
    assert stats["p"]["timer_passes"] == 1
    assert stats["p"]["pass_late_max"] == pytest.approx(6.5 * MS, abs=1e-9)


def test_an_event_that_finds_the_core_idle_pays_the_wake_up() -> None:
    """A watch costs 2 ms and waking an idle loop 1 ms, spent before the callback runs. Op 0
    arrives at 1 ms to an idle core: woken (busy to 2), watched at 2 (busy to 4). Op 1 arrives
    at 2 ms, queues behind it, and is watched in the loop's next turn at 4, no wake-up (busy to
    6). Op 2 arrives at 10 ms to an idle core: woken, watched at 11. Their expiries each wake an
    idle loop: 1 ms each. 11 ms in all; 6 without the wake-up."""
    trace = trace_table([("p", i, at * MS, 1.0, None) for i, at in enumerate((1, 2, 10))])
    config = {0: ReplayConfig(tick=MS)}
    ops, stats = split(replay_table(trace, config, costs=costs(watch=2 * MS, wake=1 * MS)))
    assert [ops["p", i]["watched_at"] for i in range(3)] == pytest.approx([2 * MS, 4 * MS, 11 * MS])
    assert stats["p"]["busy"] == pytest.approx(11 * MS)
    _, asleep = split(replay_table(trace, config, costs=costs(watch=2 * MS)))
    assert asleep["p"]["busy"] == pytest.approx(6 * MS)


def test_the_application_s_condition_work_is_charged_per_condition_callback() -> None:
    """The application's work for a condition (``application_condition``, 1 ms here) is
    charged where a callback runs, not per operation: an operation whose condition has come
    by its watch completes inside it and has no callback. Op 0 is watched at 0 (2 ms, busy to
    2). Op 1 arrives at 0.1 ms, queues, and is watched at 2 with its condition (0.2 ms) met:
    it completes inside the watch, at no cost here, and schedules nothing. Op 0's condition
    (0.5 ms) is served at 2: the application's 1 ms, busy to 3. Op 2 arrives at 2.5 ms and is
    watched at 3 (busy to 5). 5 ms in all; 1 ms an operation would have made it 7."""
    trace = trace_table(
        [
            ("p", 0, 0.0, 100 * MS, 0.5 * MS),
            ("p", 1, 0.1 * MS, 100 * MS, 0.2 * MS),
            ("p", 2, 2.5 * MS, 100 * MS, None),
        ]
    )
    config = {0: ReplayConfig(tick=MS)}
    profile = costs(watch=2 * MS, application_condition=1 * MS)
    ops, stats = split(replay_table(trace, config, costs=profile, check=True))
    assert ops["p", 1]["outcome"] == "completed"
    assert ops["p", 1]["watched_at"] == ops["p", 1]["ended_at"] == pytest.approx(2 * MS)
    assert ops["p", 0]["ended_at"] == pytest.approx(2 * MS)
    assert ops["p", 2]["watched_at"] == pytest.approx(3 * MS)
    assert stats["p"]["busy"] == pytest.approx(5 * MS)
    # The same work charged per operation (``application``) costs every arrival.
    _, per_operation = split(replay_table(trace, config, costs=costs(watch=2 * MS, application=MS)))
    assert per_operation["p"]["busy"] == pytest.approx(7 * MS)


def test_an_idle_loop_sleeps_to_its_next_timer_rounded_up_to_the_millisecond() -> None:
    """epoll's timeout is whole milliseconds: a loop idle from 0 sleeps until 1 ms for op 0
    (due at 0.3 ms), wakes (0.05 ms) and watches it at 1.05 ms (0.1 ms: busy to 1.15). Op 1,
    due at 0.5 ms, was due when the loop woke: it runs next, in the same turn (busy to 1.25).
    Op 2, due at 2.2 ms, finds the loop asleep since 1.25 ms: it wakes at 1.25 + 1 ms = 2.25
    ms, and watches it at 2.30."""
    trace = trace_table([("p", i, at * MS, 1.0, None) for i, at in enumerate((0.3, 0.5, 2.2))])
    profile = replace(costs(watch=0.1 * MS, wake=0.05 * MS), wake_resolution=MS)
    ops, stats = split(replay_table(trace, {0: ReplayConfig(tick=MS)}, costs=profile))
    assert [ops["p", i]["watched_at"] for i in range(3)] == pytest.approx(
        [1.05 * MS, 1.15 * MS, 2.30 * MS]
    )
    # Each expiry's pass wakes the loop too, at most a millisecond and a wake-up after its tick.
    assert 0 < stats["p"]["pass_late_max"] <= 1.05 * MS


def test_the_reapers_pass_runs_after_the_callbacks_collected_with_its_timer() -> None:
    """asyncio runs the reaper's timer as one callback among those collected in a turn of the
    loop; it only wakes the reaper's task, whose pass runs at the start of the next turn: after
    every callback collected with the timer, later ones included.

    A watch costs 0.1 ms, a completion 2 ms. Op 0 (0 ms) is watched at once; its condition (0.5
    ms) completes it: busy 0.5 to 2.5 ms. Meanwhile op 1's deadline tick comes (2 ms), op 3
    arrives (2.4 ms) and op 2's condition comes (2.5 ms): the turn at 2.5 ms collects all three
    and runs them in the order of their times: the reaper's timer, op 3's watch (2.5 to 2.6),
    op 2's completion (2.6 to 4.6). The pass opens the next turn at 4.6 ms and expires op 1
    there, 2.6 ms after its tick (before the callbacks due after it, the pass ran at 2.5)."""
    trace = trace_table(
        [
            ("p", 0, 0.0, 100 * MS, 0.5 * MS),
            ("p", 1, 0.2 * MS, 1 * MS, None),
            ("p", 2, 0.3 * MS, 100 * MS, 2.5 * MS),
            ("p", 3, 2.4 * MS, 100 * MS, None),
        ]
    )
    profile = costs(watch=0.1 * MS, completion=2 * MS)
    ops, stats = split(replay_table(trace, {0: ReplayConfig(tick=MS)}, costs=profile, check=True))
    assert ops["p", 3]["watched_at"] == pytest.approx(2.5 * MS)
    assert ops["p", 2]["ended_at"] == pytest.approx(2.6 * MS)
    assert ops["p", 1]["outcome"] == "expired"
    assert ops["p", 1]["ended_at"] == pytest.approx(4.6 * MS)
    assert stats["p"]["pass_late_max"] == pytest.approx(2.6 * MS, abs=1e-9)


def test_a_woken_loop_runs_late_by_a_latency_drawn_from_the_profile() -> None:
    """With a wake-up latency of exactly 0.25 ms (every quantile), an idle loop runs its
    callbacks 0.25 ms after its selector's timeout: op 0 (0.3 ms) at 1 + 0.25 ms; op 1 (5 ms),
    after a sleep from 1.35 ms (op 0's watch done) of 4 whole milliseconds, at 5.35 + 0.25 ms.
    The draws of a real distribution differ from wake-up to wake-up, and are the same on every
    replay of the same group."""
    trace = trace_table([("p", i, at * MS, 1.0, None) for i, at in enumerate((0.3, 5.0))])
    fixed = replace(
        costs(watch=0.1 * MS),
        wake_resolution=MS,
        wake_latency=(0.25 * MS,) * len(LATENCY_QUANTILES),
    )
    ops, _ = split(replay_table(trace, {0: ReplayConfig(tick=MS)}, costs=fixed))
    assert [ops["p", i]["watched_at"] for i in range(2)] == pytest.approx([1.25 * MS, 5.6 * MS])
    spread = replace(fixed, wake_latency=tuple(q * MS for q in range(len(LATENCY_QUANTILES))))
    assert spread.latency(0.5) == 3 * MS  # the 0.5 quantile is the fourth (0-based 3)
    assert spread.latency(0.3) == pytest.approx(2.2 * MS)  # 0.25 -> 2 ms, 0.5 -> 3 ms
    replayed = replay_table(trace, {0: ReplayConfig(tick=MS)}, costs=spread)
    assert replay_table(trace, {0: ReplayConfig(tick=MS)}, costs=spread).equals(replayed)
    ops, _ = split(replayed)
    first, second = (ops["p", i]["watched_at"] for i in range(2))
    slept_from = first + 0.1 * MS
    woken = slept_from + math.ceil((5 * MS - slept_from) / MS - 1e-9) * MS
    latencies = [first - 1 * MS, second - woken]
    assert all(0 <= latency <= 10 * MS for latency in latencies), latencies
    assert latencies[0] != latencies[1]  # two draws


@pytest.mark.parametrize(
    ("latency", "said"),
    [
        ((0.001,), "wake_latency must be 11 quantiles"),
        ((0.002, 0.001, *(0.003,) * 9), "quantiles must not decrease"),
        ((-0.001, *(0.0,) * 10), "not seconds in [0, 1]"),
        (("1 ms", *(0.0,) * 10), "a value that is not seconds"),
    ],
)
def test_a_bad_wake_latency_is_refused(latency: tuple[Any, ...], said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        replace(PROFILE, wake_latency=latency)


def w1_trace(operations: int = 1500) -> pa.Table:
    w1 = small_w1(operations, seed=3)
    return pa.Table.from_batches([generate_chunk(w1, chunk) for chunk in chunk_plan(w1)])


CONFIGS = dict(enumerate(spark_support.CONFIGS))


def test_zero_costs_replay_exactly_as_no_profile() -> None:
    trace = w1_trace()
    plain = replay_table(trace, CONFIGS)
    zero = replay_table(trace, CONFIGS, costs=ZERO, check=True)

    def ops(table: pa.Table) -> list[dict[str, Any]]:
        return sorted(table.filter(pc.is_valid(table["op_id"])).to_pylist(), key=str)

    def gauges(table: pa.Table) -> dict[tuple[str, int], dict[str, Any]]:
        rows = table.filter(pc.is_null(table["op_id"])).to_pylist()
        return {(r["purgatory"], r["config_id"]): r for r in rows}

    assert len(ops(plain)) == 2 * 2 * 1500
    assert ops(zero) == ops(plain)
    zero_gauges = gauges(zero)
    for group, row in gauges(plain).items():
        other = zero_gauges[group]
        # (`purges` counts passes that purged under the load model, clock moves without it.)
        for column in (
            "peak_watched",
            "peak_delayed",
            "timer_passes",
            "purged_entries",
            "attempts",
        ):
            assert other[column] == row[column], (group, column)
        assert other["busy"] == row["busy"] == 0.0
        assert other["pass_late_max"] == row["pass_late_max"] == 0.0


def test_no_profile_says_costs_are_zero() -> None:
    table = replay_table(w1_trace(), CONFIGS)
    _, stats = split(table)
    for row in stats.values():
        assert (row["busy"], row["span"]) == (0.0, 0.0)
        assert row["pass_late_p50"] == row["pass_late_p99"] == row["pass_late_max"] == 0.0


def test_more_traffic_than_the_core_makes_passes_late_and_waits_grow() -> None:
    # A costly application (2 ms per arrival) at 1000 arrivals/s: the core is 2x overloaded.
    costly = costs(application=2 * MS)
    trace = trace_table([("p", i, i * MS, 50 * MS, None) for i in range(200)])
    _, light = split(replay_table(trace, {0: ReplayConfig(tick=MS, rate_scale=0.25)}, costs=costly))
    ops, heavy = split(replay_table(trace, {0: ReplayConfig(tick=MS)}, costs=costly))
    assert light["p"]["pass_late_max"] == 0.0
    assert light["p"]["busy"] / light["p"]["span"] < 0.6
    # The last arrival (199 ms) is watched when 199 earlier ones have had their 2 ms, at 398;
    # the core is busy 400 ms out of 448 (its expiry, 50 ms later, costs nothing here).
    assert ops["p", 199]["watched_at"] == pytest.approx(398 * MS)
    assert heavy["p"]["busy"] == pytest.approx(400 * MS)
    assert heavy["p"]["span"] == pytest.approx(448 * MS)
    assert heavy["p"]["pass_late_max"] > 0.1


def test_past_saturation_answers_come_late_though_none_expires() -> None:
    """Each operation's condition holds 10 ms after its arrival, within its 50.5 ms timeout. On
    an overloaded core the watches fall behind the arrivals: an operation watched late finds its
    condition met and completes at once (nothing expires), but more than 50 ms after its
    arrival: missed, from the client's side. (Half a millisecond keeps the count off the edge.)"""
    costly = costs(application=2 * MS)
    trace = trace_table([("p", i, i * MS, 50.5 * MS, (i + 10) * MS) for i in range(200)])
    _, light = split(replay_table(trace, {0: ReplayConfig(tick=MS, rate_scale=0.25)}, costs=costly))
    ops, heavy = split(replay_table(trace, {0: ReplayConfig(tick=MS)}, costs=costly))
    assert light["p"]["expired"] == heavy["p"]["expired"] == 0
    assert light["p"]["missed"] == 0
    # Op i is watched at 2i ms (its condition met from i >= 10) and answered then: i ms after
    # its arrival, so late for i > 50.5.
    assert ops["p", 60]["ended_at"] == pytest.approx(120 * MS)
    assert heavy["p"]["missed"] == 149


def test_saturation_rate_from_utilisation() -> None:
    assert saturation_rate([(100.0, 0.1), (200.0, 0.2), (400.0, 0.5)]) == pytest.approx(1000.0)
    assert saturation_rate([(100.0, 0.95), (50.0, 0.99)]) == 50.0
    assert saturation_rate([(100.0, 0.0)]) is None


def write(tmp_path: Path, content: Any) -> str:
    path = tmp_path / "profile.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


GOOD_COSTS = {kind: 1e-6 for kind in COST_KINDS if kind not in GIVEN_KINDS}
GOOD: dict[str, Any] = {"version": 3, "loop": "asyncio", "costs": GOOD_COSTS}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ([1, 2], "expected a JSON object"),
        ({**GOOD, "version": 2}, "version 2, expected 3 or 4 or 5 (make a new one with"),
        ({**GOOD, "version": True}, "version True, expected 3 or 4 or 5"),
        ({**GOOD, "wake_latency": [0.001]}, "wake_latency must be 11 quantiles"),
        (
            {**GOOD, "costs": {**GOOD_COSTS, "expiry": -1e-6}},
            "'expiry' must be a number of seconds in [0, 1], got -1e-06",
        ),
        ({**GOOD, "costs": {**GOOD_COSTS, "watch": "1us"}}, "'watch' must be a number"),
        ({**GOOD, "costs": {**GOOD_COSTS, "wach": 1e-6}}, "unknown cost 'wach'"),
        (
            {**GOOD, "costs": {k: v for k, v in GOOD_COSTS.items() if k != "attempt"}},
            "missing cost 'attempt'",
        ),
        (b"\xff\xfe{}", "not UTF-8 text (byte 0: 0xff)"),
        ({**GOOD, "costs": {**GOOD_COSTS, "watch": 10**400}}, "in [0, 1], got 1000000"),
        ({**GOOD, "costs": {**GOOD_COSTS, "watch": 1e300}}, "in [0, 1], got 1e+300"),
        ({**GOOD, "costs": {**GOOD_COSTS, "watch": 2}}, "in [0, 1], got 2"),
        ({**GOOD, "costs": {**GOOD_COSTS, "watch": True}}, "'watch' must be a number"),
        ({**GOOD, "costs": {**GOOD_COSTS, "watch": math.nan}}, "in [0, 1], got nan"),
        ("1" * 5000, "not JSON"),
    ],
)
def test_bad_profiles_are_refused_in_one_line(tmp_path: Path, content: Any, message: str) -> None:
    path = write(tmp_path, content)
    with pytest.raises(ValueError, match=r"^cost profile ") as info:
        load_profile(path)
    assert message in str(info.value)
    assert path in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read it"),
        (b"\xff{}", "not UTF-8 text"),
        ({**GOOD, "costs": {**GOOD_COSTS, "expiry": 1e300}}, "cost 'expiry' must be"),
    ],
)
def test_a_bad_profile_ends_the_command_before_spark(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    content: Any,
    said: str,
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a Spark session was started")

    monkeypatch.setattr(_spark, "get_session", refuse)
    profile = str(tmp_path / "nope.json") if content is None else write(tmp_path, content)
    code = main(
        [
            "replay",
            "--trace",
            str(tmp_path),
            "--out",
            str(tmp_path / "o"),
            "--cost-profile",
            profile,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert f"cost profile {profile}: {said}" in err


def test_the_application_s_costs_may_be_left_out_of_a_profile_file(tmp_path: Path) -> None:
    # `calibrate` does not measure them: a file without them has 0 for both, and a profile
    # given both keeps them through its file.
    read = load_profile(write(tmp_path, GOOD))
    assert read.application == read.application_condition == 0.0
    given = replace(read, application=12e-6, application_condition=4e-6)
    path = str(tmp_path / "given.json")
    save_profile(given, path)
    assert load_profile(path) == given


def test_calibrate_quick_writes_a_profile_that_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """However busy the machine (the tests share it), calibrate gives a profile: its costs
    medians of paired rounds, never negative, with their spread (test_pipeline_calibrate.py
    tests the estimator with fake timings)."""
    out = tmp_path / "profile.json"
    argv = [
        *("calibrate", "--out", str(out), "--quick", "--application-cost", "0.00002"),
        *("--application-condition-cost", "0.000004"),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    profile = load_profile(str(out))
    data = json.loads(out.read_text())
    assert data["version"] == PROFILE_VERSION
    assert data["wake_resolution"] == 0.001  # Linux: epoll's milliseconds
    assert len(data["wake_latency"]) == len(LATENCY_QUANTILES)
    assert profile.wake_latency == tuple(sorted(profile.wake_latency))
    # Each event's cost over the mean and its stall, as quantiles: a tail, not a constant.
    assert len(data["cost_shape"]) == len(data["stall"]) == len(SHAPE_QUANTILES)
    assert not profile.constant
    assert profile.cost_shape[0] <= 1 <= profile.cost_shape[-1]
    assert 0 < profile.stall_basis < 0.01
    assert 0 <= profile.stall_credit <= 0.03
    assert 0 <= profile.iteration < 0.01
    assert data["loop"] == "asyncio"
    assert data["python"].startswith("CPython") or data["python"]
    assert profile.application == 0.00002
    assert profile.application_condition == 0.000004
    # Every cost measured directly is a real, positive CPU time; a solved one (a difference
    # of runs) is never negative, and every measured cost has its spread.
    for kind in ("dispatch", "attempt", "completion", "purged_entry"):
        assert 0 < getattr(profile, kind) < 0.01, kind
    for kind in ("watch", "watch_key", "expiry", "timer_pass", "wake"):
        assert 0 <= getattr(profile, kind) < 0.01, kind
    assert set(data["spread"]) == set(COST_KINDS) - set(GIVEN_KINDS)
    assert _QUICK.min_rounds <= data["rounds"] <= _QUICK.max_rounds
    assert not any(p.name.endswith(".part") for p in tmp_path.iterdir())
    assert "written to" in capsys.readouterr().out


def test_the_spark_job_with_a_profile_equals_the_replay(
    spark: SparkSession, tmp_path: Path
) -> None:
    trace = w1_trace(300)
    path = tmp_path / "trace"
    path.mkdir()
    pq.write_table(trace, path / "part-0.parquet")
    # With cost distributions: each group's draws are its own, whichever task replays it.
    profile = replace(costs(2e-4, application=0.0), cost_shape=WIDE, stall=STALLS)
    configs = [CONFIGS[0], CONFIGS[1]]
    summary = replay(spark, str(path), str(tmp_path / "out"), configs, costs=profile)
    rows = {(r["purgatory"], r["config_id"]): r.asDict() for r in summary.collect()}
    spark_ops = pq.read_table(tmp_path / "out" / "operations")
    plain = replay_table(trace, dict(enumerate(configs)), costs=profile)
    mine = (
        plain.filter(pc.is_valid(plain["op_id"]))
        .select(["purgatory", "config_id", "op_id", "outcome", "watched_at", "ended_at"])
        .to_pylist()
    )
    theirs = spark_ops.select(
        ["purgatory", "config_id", "op_id", "outcome", "watched_at", "ended_at"]
    ).to_pylist()
    assert sorted(theirs, key=str) == sorted(mine, key=str)
    gauges = plain.filter(pc.is_null(plain["op_id"])).to_pylist()
    assert len(rows) == len(gauges) == 4
    for g in gauges:
        row = rows[g["purgatory"], g["config_id"]]
        assert row["busy_seconds"] == g["busy"] > 0
        assert row["utilisation"] == pytest.approx(g["busy"] / g["span"])
        assert 0 < row["utilisation"] <= 1 + 1e-9  # (busy the whole span: 1, rounded)
        assert row["pass_lateness_p99"] == g["pass_late_p99"]
    # At 2000 arrivals/s, 0.8 ms per arrival is more than a core: passes run late.
    assert max(r["pass_lateness_max"] for r in rows.values()) > 0
    assert not math.isnan(sum(r["pass_lateness_p50"] for r in rows.values()))


#: A wide cost distribution (most events cost under the mean, one in a thousand 100 times it),
#: and stalls (one event in a hundred held off the core 2 ms, one in ten thousand 10 ms).
WIDE = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 2.0, 5.0, 20.0, 100.0, 100.0, 200.0)
STALLS = (0.0,) * 7 + (2 * MS, 2 * MS, 2 * MS, 5 * MS, 10 * MS, 10 * MS)


@pytest.mark.parametrize(
    "profile",
    [None, PROFILE, replace(PROFILE, cost_shape=WIDE, stall=STALLS)],
    ids=["plain", "loaded", "distributions"],
)
def test_without_operation_rows_the_group_rows_are_the_same(profile: CostProfile | None) -> None:
    """The summary does not depend on keeping each operation's row (the loaded engine counts
    its completions without them)."""
    trace = w1_trace()
    configs = {0: ReplayConfig(tick=MS), 1: ReplayConfig(tick=MS, rate_scale=4.0)}
    full = replay_table(trace, configs, costs=profile)
    lean = replay_table(trace, configs, costs=profile, operations=False)
    assert pc.all(pc.is_null(lean["op_id"])).as_py()
    assert lean.to_pylist() == full.filter(pc.is_null(full["op_id"])).to_pylist()
    assert pc.sum(lean["operations"]).as_py() == 2 * trace.num_rows
