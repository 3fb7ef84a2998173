"""One group split into time shards (`purgatory.pipeline._shards`): the same as one replay.

The engine's tests compare `split_table` (the shards replayed in this process, as the Spark
job's tasks replay them) with `replay_table` (one replay) on every operation's row and every
summary figure, exactly, on traces made to stress the split: timeouts as long as a shard,
bursts of simultaneous arrivals (one on a boundary), a loaded core whose backlog crosses a
boundary, Kafka's purge counter, which a warm-up rebuilds only by purging where the unsplit
replay did (`purgatory.pipeline._purge_carry`), and the cases where it cannot (the check fails,
the boundary is replayed sequentially, and said). The Spark test runs the job both ways on the
shared session.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from purgatory import DelayedOperationPurgatory
from purgatory._purge_rule import PurgeRule
from purgatory.pipeline import (
    W1,
    CostProfile,
    ReplayConfig,
    _direct,
    _job_replay,
    _job_shards,
    _purge_carry,
    _shards,
    replay,
    replay_table,
)
from purgatory.pipeline._checks import InputError, horizon_limits
from purgatory.pipeline._direct import ShardRead
from purgatory.pipeline._frames import TraceError
from purgatory.pipeline._generate import chunk_plan, generate_chunk
from purgatory.pipeline._job_replay import Phase
from purgatory.pipeline._job_trace import load_trace
from purgatory.pipeline._shards import (
    Boundary,
    Key,
    ShardRange,
    _kth,
    _merge_ranges,
    gather_parts,
    plan_ranges,
    settle,
    shard_input,
    split_table,
    warmup_seconds,
)
from purgatory.testing import ManualClock

MS = 1e-3
#: A core loaded by round costs: a watch costs 0.2 ms, so 6,000 arrivals a second need 120 %
#: of it, and a backlog builds during each burst of the overload trace.
LOADED = CostProfile(
    dispatch=0.02 * MS,
    wake=0.01 * MS,
    watch=0.15 * MS,
    watch_key=0.01 * MS,
    attempt=0.005 * MS,
    completion=0.02 * MS,
    expiry=0.01 * MS,
    timer_pass=0.02 * MS,
    purged_entry=0.001 * MS,
    iteration=0.005 * MS,
)


def w1_trace(**changes: Any) -> pa.Table:
    w1 = W1(**{"purgatories": 1, "operations": 4000, "rate": 2000.0, "seed": 3, **changes})
    return pa.Table.from_batches([generate_chunk(w1, c) for c in chunk_plan(w1)])


def rows_of(table: pa.Table) -> list[dict[str, Any]]:
    """Every row (operations', then the groups'), in one order; NaN made comparable."""
    rows = table.to_pylist()
    for row in rows:
        for name, value in row.items():
            if isinstance(value, float) and math.isnan(value):
                row[name] = "nan"
    return sorted(
        rows, key=lambda r: (r["purgatory"], r["config_id"], r["op_id"] is None, r["op_id"] or 0)
    )


def assert_split_is_exact(
    trace: pa.Table,
    configs: dict[int, ReplayConfig],
    shards: int,
    *,
    costs: CostProfile | None = None,
    extra: float = 0.0,
) -> list[Boundary]:
    """The split replay equals the unsplit one on every row and figure; its boundaries."""
    unsplit = replay_table(trace, configs, costs=costs)
    split, boundaries = split_table(trace, configs, shards, costs=costs, extra=extra)
    expected, got = rows_of(unsplit), rows_of(split)
    assert len(got) == len(expected)
    summary = [r for r in expected if r["op_id"] is None]
    assert [r for r in got if r["op_id"] is None] == summary
    assert got == expected
    assert len(boundaries) == len(configs) * (shards - 1)
    return boundaries


def test_split_equals_unsplit_with_every_boundary_matched() -> None:
    # Purging at every pass (purge_interval 0), a warm-up rebuilds the whole state: under
    # four configurations (coarse tick, small wheel with cascades, scaled timeouts and rate,
    # force trigger), every boundary matches and nothing is replayed twice.
    trace = w1_trace(never=0.2, key_skew=1.0)
    configs = {
        0: ReplayConfig(purge_interval=0),
        1: ReplayConfig(tick=0.01, wheel_size=8, purge_interval=0, timeout_scale=0.5),
        2: ReplayConfig(purge_interval=0, rate_scale=2.0, trigger="force"),
        3: ReplayConfig(purge_interval=0, timeout_scale=3.0),
    }
    boundaries = assert_split_is_exact(trace, configs, 4)
    assert all(b.matched for b in boundaries), [b.describe() for b in boundaries]


@pytest.mark.parametrize("interval", [0, 5])
def test_timeouts_as_long_as_a_shard(interval: int) -> None:
    # 2,000 arrivals a second in 4 shards of 0.5 s, timeouts up to 0.5 s (never met: every
    # operation waits its whole timeout): the warm-up is the whole previous shard. Timeouts of
    # 0 and of a tick expire at the clock's next move, each in a pass of its own (where the
    # purge counter is foreseen, at interval 5).
    rng = np.random.default_rng(5)
    n = 4000
    arrivals = np.round(np.sort(rng.uniform(0.0, 2.0, n)), 3)  # (on ticks, many together)
    timeouts = rng.choice([0.0, 0.001, 0.05, 0.5], n)
    conditions = np.where(rng.random(n) < 0.5, arrivals + rng.uniform(0, 0.6, n), np.nan)
    trace = trace_of(arrivals, timeouts, conditions, rng)
    boundaries = assert_split_is_exact(trace, {0: ReplayConfig(purge_interval=interval)}, 4)
    assert all(b.matched for b in boundaries), [b.describe() for b in boundaries]


@pytest.mark.parametrize("interval", [0, 17])
def test_bursts_one_on_a_boundary(interval: int) -> None:
    # Bursts of 200 simultaneous arrivals; the shard boundaries fall on bursts (an arrival of
    # the trace), so a burst's operations are split between a shard and its successor's input:
    # the successor's own and the previous shard's end, where it stops.
    rng = np.random.default_rng(6)
    bursts = np.repeat(np.arange(0.0, 2.0, 0.1), 200)
    quiet = rng.uniform(0.0, 2.0, 1000)
    arrivals = np.sort(np.concatenate([bursts, quiet]))
    n = len(arrivals)
    timeouts = rng.choice([0.01, 0.1, 0.3], n)
    conditions = np.where(rng.random(n) < 0.7, arrivals + rng.exponential(0.05, n), np.nan)
    trace = trace_of(arrivals, timeouts, conditions, rng)
    boundaries = assert_split_is_exact(trace, {0: ReplayConfig(purge_interval=interval)}, 5)
    assert all(b.matched for b in boundaries), [b.describe() for b in boundaries]
    assert any(b.at in set(np.arange(0.0, 2.0, 0.1)) for b in boundaries)  # one on a burst


def overload_trace() -> pa.Table:
    """Bursts of 6,000 arrivals a second for 0.2 s (120 % of the loaded core), then 0.3 s at
    1,000: a backlog builds in each burst and is worked off in the quiet part after it."""
    rng = np.random.default_rng(7)
    parts = []
    for start in np.arange(0.0, 2.0, 0.5):
        parts.append(rng.uniform(start, start + 0.2, 1200))
        parts.append(rng.uniform(start + 0.2, start + 0.5, 300))
    arrivals = np.sort(np.concatenate(parts))
    n = len(arrivals)
    timeouts = np.full(n, 0.1)
    conditions = np.where(rng.random(n) < 0.8, arrivals + rng.exponential(0.02, n), np.nan)
    return trace_of(arrivals, timeouts, conditions, rng)


def test_overload_backlog_across_a_boundary_with_a_longer_warmup() -> None:
    # The loaded core is behind when a boundary comes (each shard ends inside a burst), so one
    # longest timeout of warm-up misses its backlog; a warm-up 0.5 s longer reaches back to a
    # quiet part where the core was idle, and every boundary matches.
    trace = overload_trace()
    unsplit = replay_table(trace, {0: ReplayConfig(purge_interval=0)}, costs=LOADED)
    summary = unsplit.filter(pa.compute.is_null(unsplit["op_id"])).to_pylist()[0]
    assert summary["missed"] > 0  # overloaded: operations served late
    boundaries = assert_split_is_exact(
        trace, {0: ReplayConfig(purge_interval=0)}, 4, costs=LOADED, extra=0.5
    )
    assert all(b.matched for b in boundaries), [b.describe() for b in boundaries]


def test_hold_offs_at_given_times_split_as_unsplit() -> None:
    # A measured run's hold-offs are spells at fixed times of the trace, not a history: a
    # warm-up meets the same ones, and a split replay is exact with them (here 5 ms spells in
    # every shard, one just before a boundary, so a backlog they make crosses it).
    trace = overload_trace()
    spells = tuple((t, 5 * MS) for t in (0.05, 0.45, 0.99, 1.3, 1.75))
    held = replace(LOADED, holdoffs=spells)
    boundaries = assert_split_is_exact(
        trace, {0: ReplayConfig(purge_interval=0)}, 4, costs=held, extra=0.5
    )
    assert all(b.matched for b in boundaries), [b.describe() for b in boundaries]
    assert not replay_table(trace, {0: ReplayConfig(purge_interval=0)}, costs=held).equals(
        replay_table(trace, {0: ReplayConfig(purge_interval=0)}, costs=LOADED)
    )


def test_a_failed_check_falls_back_to_sequential_and_says_so() -> None:
    # The same overload with one longest timeout of warm-up only: the warm-up's core starts
    # idle where the unsplit core had a backlog, the pending operations differ, each such
    # boundary is replayed sequentially, reported, and the result is still exact.
    trace = overload_trace()
    boundaries = assert_split_is_exact(
        trace, {0: ReplayConfig(purge_interval=0)}, 4, costs=LOADED, extra=0.0
    )
    failed = [b for b in boundaries if not b.matched]
    assert failed
    assert all("pending" in b.parts or "core" in b.parts for b in failed)
    assert "replayed sequentially" in failed[0].describe()


def test_a_shards_values_in_parts_merge_as_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # A shard's waits and lateness leave its task in rows of at most VALUES_PER_ROW each (an
    # executor builds a row whole in its heap): with 50 per row, a shard of about 1,000
    # operations sends about 20 rows, and the driver's merge is still the unsplit replay's.
    monkeypatch.setattr(_shards, "VALUES_PER_ROW", 50)
    sent: list[int] = []
    gather = _shards.gather_parts

    def counted(rows: Any) -> dict[Key, dict[str, Any]]:
        rows = list(rows)
        sent.extend(r["shard_part"] for r in rows if r["shard_part"] is not None)
        return gather(rows)

    monkeypatch.setattr(_shards, "gather_parts", counted)
    trace = w1_trace(never=0.2)
    boundaries = assert_split_is_exact(trace, {0: ReplayConfig(purge_interval=0)}, 4)
    assert all(b.matched for b in boundaries), [b.describe() for b in boundaries]
    assert sent.count(0) == 4
    assert max(sent) >= 4000 // 4 // 50 - 2


def test_a_shard_with_a_part_missing_is_an_error() -> None:
    row = {"purgatory": "p", "config_id": 0, "shard": 1, "shard_waits": b"", "shard_lateness": b""}
    parts = [{**row, "shard_part": 0}, {**row, "shard_part": 2}, {**row, "shard_part": None}]
    with pytest.raises(ValueError, match=r"shard \('p', 0, 1\) came with the parts \[0, 2\]"):
        gather_parts(parts)


@pytest.mark.parametrize(
    ("setting", "refused"),
    [("1m", True), ("1048576", True), ("2m", False), ("0", False), ("1g", False), ("x", False)],
)
def test_a_split_whose_waits_pass_the_drivers_result_limit_is_refused_first(
    setting: str, refused: bool
) -> None:
    # 8 bytes a wait: 150,000 operations under one configuration send 1.1 MiB at least, over
    # 1m (Spark would abort the job once every task had replayed); 0 is no limit, and a value
    # this check cannot read is left to Spark.
    conf = types.SimpleNamespace(
        get=lambda key, default: {"spark.driver.maxResultSize": setting}[key]
    )
    spark = cast(SparkSession, types.SimpleNamespace(conf=conf))
    if refused:
        with pytest.raises(
            InputError,
            match=r"150,000 operations replayed: 1 MiB at least\).*"
            r"over spark.driver.maxResultSize \(1(m|048576)\): raise it",
        ):
            _job_shards._check_result_size(spark, 150_000)
    else:
        _job_shards._check_result_size(spark, 150_000)


def test_an_executor_out_of_memory_in_a_split_is_said_with_its_cause() -> None:
    # Spark names only a lost executor's exit code; the split says what its tasks hold.
    todo = {("p", 0, k): ShardRange(k, float(k), float(k + 1)) for k in range(4)}
    lost = RuntimeError(
        "An error occurred while calling o81.collectAsArrowToPython.\n: org.apache.spark."
        "SparkException: Job aborted due to stage failure: Task 1 in stage 1.0 failed 4 times"
        ", most recent failure: ExecutorLostFailure (executor 4 exited caused by one of the "
        "running tasks) Reason: Command exited with code 52\n\tat org.apache.spark..."
    )
    with (
        pytest.raises(
            RuntimeError,
            match=r"ran out of memory \(org.apache.spark.SparkException: "
            r"Job aborted .* code 52\)\. .*about 76 MiB a task here",
        ) as raised,
        _job_shards._out_of_memory_said(todo, {"p": 20_000_000}, 2),
    ):
        raise lost
    assert raised.value.__cause__ is lost
    other = RuntimeError("Job aborted due to stage failure: a task failed")
    with pytest.raises(RuntimeError) as passed, _job_shards._out_of_memory_said(todo, {"p": 1}, 2):
        raise other
    assert passed.value is other


@pytest.mark.parametrize(("interval", "operations"), [(3, 4000), (10, 4000), (1000, 12000)])
def test_kafkas_purge_counter_carried_into_each_shard(interval: int, operations: int) -> None:
    # Kafka's rule purges once more than `interval` operations have finished since the last
    # purge, a count over the group's whole history: each shard's warm-up reaches back one
    # longest timeout before the unsplit replay's last purge before it, purges there too, and
    # every boundary matches, the counter, the queue and the finished entries listed included
    # (the configurations of the purge-at-every-pass test: cascades, scaled time, force).
    trace = w1_trace(never=0.2, key_skew=1.0, operations=operations)
    configs = {
        0: ReplayConfig(purge_interval=interval),
        1: ReplayConfig(tick=0.01, wheel_size=8, purge_interval=interval, timeout_scale=0.5),
        2: ReplayConfig(purge_interval=interval, rate_scale=2.0, trigger="force"),
        3: ReplayConfig(purge_interval=interval, timeout_scale=3.0),
    }
    boundaries = assert_split_is_exact(trace, configs, 4)
    assert all(b.matched for b in boundaries), [b.describe() for b in boundaries]


def test_a_purge_counter_not_carried_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the carry does not hold, the check sees the counter and the boundary is replayed
    # sequentially, exactly: no purge yet before a boundary (nothing to re-enact); a loaded
    # core (a purge's cost moves its timing: not carried); a purge point foreseen wrong (moved
    # 50 ms earlier: the warm-up purges where the unsplit replay did not).
    trace = w1_trace()
    late = assert_split_is_exact(trace, {0: ReplayConfig(purge_interval=100_000)}, 3)
    assert [b.matched for b in late] == [False, False]
    assert all("purge" in b.parts for b in late)
    loaded = assert_split_is_exact(trace, {0: ReplayConfig(purge_interval=10)}, 3, costs=LOADED)
    assert not any(b.matched for b in loaded)
    assert all("purge" in b.parts for b in loaded)
    foreseen = _purge_carry.purge_points

    def wrong(*args: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        times, kinds, clean = foreseen(*args)
        return times - 0.05, np.full(len(kinds), _purge_carry.PASS), clean

    monkeypatch.setattr(_purge_carry, "purge_points", wrong)
    moved = assert_split_is_exact(trace, {0: ReplayConfig(purge_interval=10)}, 3)
    assert not any(b.matched for b in moved)
    assert "replayed sequentially" in moved[0].describe()


@pytest.mark.parametrize(
    "config",
    [
        ReplayConfig(purge_interval=17, wheel_size=8, timeout_scale=2.0, trigger="force"),
        ReplayConfig(purge_interval=5, tick=0.003, rate_scale=1.5),
    ],
)
def test_foreseen_purges_are_the_replays(
    config: ReplayConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The purges foreseen from the trace are where one replay purges, one for one: arrivals on
    # ticks and together, timeouts of 0 and of a tick (expired alone, at the next clock move),
    # conditions together, expiries in one pass per tick.
    rng = np.random.default_rng(9)
    n = 3000
    arrivals = np.round(np.sort(rng.uniform(0.0, 3.0, n)), 2)
    timeouts = rng.choice([0.0, 0.001, 0.02, 0.1, 0.3], n)
    conditions = np.where(rng.random(n) < 0.7, arrivals + rng.exponential(0.05, n), np.nan)
    conditions = np.where(rng.random(n) < 0.5, np.round(conditions, 3), conditions)
    trace = trace_of(arrivals, timeouts, conditions, rng)
    starts: list[float] = []
    start = PurgeRule.start

    def recorded(rule: PurgeRule, in_flight: int) -> None:
        starts.append(rule._timer.now())
        start(rule, in_flight)

    monkeypatch.setattr(PurgeRule, "start", recorded)
    replay_table(trace, {0: config}, operations=False)
    columns, _ = _purge_carry.trace_columns(trace)
    times, _, _ = _purge_carry.purge_points(*columns["p"], config)
    assert len(starts) > 100
    # (A pass runs at its tick's time, up to a millionth of a tick past the earliest that
    # reaches the tick, where the foreseen point is.)
    assert times.tolist() == pytest.approx(starts, rel=0, abs=config.tick * 1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_the_kth_of_sorted_runs_is_the_kth_of_them_merged(seed: int) -> None:
    # Runs with values repeated within and across them (waits of the same length), and an
    # empty run: every rank's value is the merged sort's.
    rng = np.random.default_rng(seed)
    runs = [np.sort(np.round(rng.exponential(1.0, int(rng.integers(0, 300))), 1)) for _ in range(4)]
    runs.append(np.zeros(0))
    merged = np.sort(np.concatenate(runs))
    assert [_kth(runs, k) for k in range(1, len(merged) + 1)] == merged.tolist()


def counter_hits_step_by_step(
    before: list[int], sizes: list[int], units: int, cycle: int
) -> tuple[list[int], list[int]]:
    """Kafka's purge counter one step at a time (each pass's completions, then the pass)."""
    unit_hits: list[int] = []
    pass_hits: list[int] = []
    owed = done = 0
    for j, (end, size) in enumerate(zip([*before, units], [*sizes, 0], strict=True)):
        unit_hits += range(done + cycle - owed - 1, end, cycle)
        owed = (owed + end - done) % cycle
        done = end
        if j < len(sizes):
            owed += size
            if owed >= cycle:
                pass_hits.append(j)
                owed = 0
    return unit_hits, pass_hits


@pytest.mark.parametrize("seed", range(6))
def test_the_purge_counter_in_blocks_is_the_step_by_step_one(seed: int) -> None:
    # Passes of 1 to 3 operations (or up to a whole cycle) between runs of completions, many
    # passes hitting: the counter's hits found a block at a time are those of a loop.
    rng = np.random.default_rng(seed)
    cycle = int(rng.choice([1, 2, 5, 11, 1001]))
    steps = int(rng.integers(0, 6000))
    units = int(rng.integers(0, 20000))
    before = np.sort(rng.integers(0, units + 1, steps))
    sizes = rng.integers(1, 4 if seed % 2 else cycle + 2, steps)
    hits, passes = _purge_carry._counter_hits(before, sizes, units, cycle)
    expected = counter_hits_step_by_step(before.tolist(), sizes.tolist(), units, cycle)
    assert (hits.tolist(), passes.tolist()) == expected
    assert len(hits) > 0  # (every seed's trace has both kinds of hits)
    assert len(passes) > 0


@pytest.mark.parametrize("tick", [0.001, 0.002, 0.01, 1 / 3, 0.1])
def test_time_of_is_the_timers(tick: float) -> None:
    # The foreseen passes' times are the timer's own, float for float.
    purgatory: DelayedOperationPurgatory[Any] = DelayedOperationPurgatory(
        "p", tick=tick, clock=ManualClock()
    )
    timer = purgatory._timer
    ticks = np.random.default_rng(8).integers(0, 10**9, 2000)
    expected = [timer.time_of(int(t)) for t in ticks]
    assert _purge_carry.time_of(ticks.astype(np.float64), tick).tolist() == expected


def test_mismatched_boundaries_join_their_shards_only() -> None:
    current = {("p", 0, k): ShardRange(k, float(k) if k else -math.inf, k + 1.0) for k in range(5)}
    current[("p", 0, 4)] = ShardRange(4, 4.0, math.inf)
    merged, replaced = _merge_ranges(current, {("p", 0, 2), ("p", 0, 4)})
    assert merged == {
        ("p", 0, 1): ShardRange(1, 1.0, 3.0),
        ("p", 0, 3): ShardRange(3, 3.0, math.inf),
    }
    assert replaced == {("p", 0, k) for k in (1, 2, 3, 4)}


def test_a_mismatch_after_another_waits_before_a_carried_shard() -> None:
    # Shard 1 could not be carried (it ends wrong: x), shard 2 was (it starts right, b):
    # the first round fails both boundaries, only shards 0 and 1 are replayed again as one, and
    # boundary 2 then matches that replay's end: shard 2 is not replayed again.
    ranges = {
        ("p", 0, 0): ShardRange(0, -math.inf, 1.0),
        ("p", 0, 1): ShardRange(1, 1.0, 2.0),
        ("p", 0, 2): ShardRange(2, 2.0, math.inf, warmup_from=0.5, reenact=(0, 0.9)),
    }
    ends = {(0, 1.0): "s=a", (1, 2.0): "s=x", (0, 2.0): "s=b", (2, math.inf): ""}
    starts = {0: "", 1: "s=y", 2: "s=b"}
    runs: list[list[int]] = []

    def run(todo: Mapping[Key, ShardRange]) -> dict[Key, Mapping[str, Any]]:
        runs.append(sorted(k[2] for k in todo))
        return {
            key: {
                "purgatory": "p",
                "config_id": 0,
                "shard": shard.index,
                "shard_start": starts[shard.index],
                "shard_end": ends[(shard.index, shard.end)],
            }
            for key, shard in todo.items()
        }

    final, _, boundaries = settle(ranges, run)
    assert runs == [[0, 1, 2], [0]]
    assert sorted(final) == [("p", 0, 0), ("p", 0, 2)]
    assert [(b.shard, b.matched) for b in boundaries] == [(1, False), (2, True)]


def trace_of(
    arrivals: np.ndarray, timeouts: np.ndarray, conditions: np.ndarray, rng: np.random.Generator
) -> pa.Table:
    """A trace of one purgatory on 50 keys, 1-3 keys per operation (NaN condition: never)."""
    n = len(arrivals)
    keys = [
        [f"k{k}" for k in rng.choice(50, int(rng.integers(1, 4)), replace=False)] for _ in range(n)
    ]
    return pa.table(
        {
            "purgatory": pa.array(["p"] * n),
            "op_id": pa.array(np.arange(n), pa.int64()),
            "arrival": pa.array(arrivals, pa.float64()),
            "keys": pa.array(keys, pa.list_(pa.string())),
            "timeout": pa.array(timeouts, pa.float64()),
            "condition_at": pa.array(conditions, pa.float64(), from_pandas=True),
        }
    )


@pytest.mark.parametrize("stored", [pa.float64(), pa.float32()])
def test_a_task_reads_its_shards_rows_as_the_shuffle_brings_them(
    tmp_path: Path, stored: pa.DataType
) -> None:
    # Each shard's rows read by its task from the trace's files (two files of small row
    # groups) are the rows the one-process reference gives the shard, in its order.
    trace = w1_trace(operations=3000)
    trace = trace.set_column(2, "arrival", trace["arrival"].cast(stored))
    (tmp_path / "t").mkdir()
    pq.write_table(trace.slice(0, 1700), tmp_path / "t" / "a.parquet", row_group_size=300)
    pq.write_table(trace.slice(1700), tmp_path / "t" / "b.parquet", row_group_size=300)
    files = [(tmp_path / "t" / name).as_uri() for name in ("a.parquet", "b.parquet")]
    config = ReplayConfig(purge_interval=10)
    cast = trace.set_column(2, "arrival", trace["arrival"].cast(pa.float64()))
    ranges = plan_ranges({("p0000", 0): cast["arrival"].to_numpy()}, 3)
    columns, longest = _purge_carry.trace_columns(cast)
    ranges = _purge_carry.carry(ranges, columns, longest, {0: config})
    expected = shard_input(cast, 0, config, ranges)
    for (name, config_id, k), shard in sorted(ranges.items()):
        lo = shard.warmup_start(warmup_seconds(longest[name], config))
        read = ShardRead(name, config_id, k, lo, shard.end, shard.start, shard.end, True)
        problems: list[dict[str, Any]] = []
        batches = list(_direct.shard_input(files, "t", [read], horizon_limits([config]), problems))
        assert problems == []
        got = pa.Table.from_batches(batches).select(expected.column_names)
        assert got.to_pylist() == expected.filter(pc.equal(expected["shard"], k)).to_pylist()


def test_a_shard_reads_only_the_row_groups_of_its_arrivals(tmp_path: Path) -> None:
    # Row groups of 250 operations in arrival order, the last one's page corrupted: the first
    # shard's task never reads it (the arrival statistics exclude it); the last one's says so.
    trace = w1_trace(operations=1000)
    path = tmp_path / "t" / "part-0.parquet"
    path.parent.mkdir()
    pq.write_table(trace, path, row_group_size=250, write_page_checksum=True)
    column = pq.read_metadata(path).row_group(3).column(1)
    data = bytearray(path.read_bytes())
    data[column.data_page_offset + 40 : column.data_page_offset + 240] = bytes(200)
    path.write_bytes(data)
    arrival = trace["arrival"].to_numpy()
    first = ShardRead("p0000", 0, 0, -math.inf, arrival[400], -math.inf, arrival[400], True)
    last = ShardRead("p0000", 0, 1, arrival[300], math.inf, arrival[400], math.inf, True)
    limits = horizon_limits([ReplayConfig()])
    problems: list[dict[str, Any]] = []
    rows = list(_direct.shard_input([path.as_uri()], "t", [first], limits, problems))
    assert problems == []
    assert sum(b.num_rows for b in rows) == 401
    assert list(_direct.shard_input([path.as_uri()], "t", [last], limits, problems)) == []
    assert [p["kind"] for p in problems] == ["file"]
    assert "fails its checksum" in problems[0]["message"]


@pytest.mark.parametrize("read", ["direct", "spark"])
def test_spark_split_job_equals_the_unsplit_job(
    spark: SparkSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    read: Literal["direct", "spark"],
) -> None:
    # A purgatory under three configurations in 3 shards each on local[2]: with purges at every
    # pass every boundary matches; with a purge every 101 finishes the driver carries the
    # counter into the shards (read from the trace's files) and every boundary matches too;
    # with Kafka's 1000, no purge has run yet before a boundary: replayed sequentially (a
    # second job), and said on stderr. Every output equals the unsplit job's, with the tasks
    # reading their shards' rows themselves or Spark shuffling them.
    trace = w1_trace(operations=1200, rate=500.0)  # boundaries 0.8 s apart: past a warm-up
    pq.write_table(trace, tmp_path / "trace.parquet")
    path = str(tmp_path / "trace.parquet")
    configs = [
        ReplayConfig(purge_interval=0),
        ReplayConfig(purge_interval=100, tick=0.002),
        ReplayConfig(purge_interval=1000),
    ]
    replay(spark, path, str(tmp_path / "one"), configs, tasks=None)
    capsys.readouterr()
    phases: list[Phase] = []
    split = str(tmp_path / "split")
    replay(spark, path, split, configs, tasks=None, shards=3, read=read, phases=phases.extend)
    said = [line for line in capsys.readouterr().err.splitlines() if "boundary" in line]
    for part in ("summary", "operations"):
        expected = pq.read_table(tmp_path / "one" / part).to_pylist()
        got = pq.read_table(tmp_path / "split" / part).to_pylist()
        order = lambda r: (r["purgatory"], r["config_id"], r.get("op_id") or 0)  # noqa: E731
        assert sorted(got, key=order) == sorted(expected, key=order)
    assert len(said) == 3 * 2, said
    assert all(line.endswith("matched") for line in said if "p0000@0 " in line), said
    assert all(line.endswith("matched") for line in said if "p0000@1 " in line), said
    assert all(line.endswith("replayed sequentially") for line in said if "p0000@2 " in line)
    first = "columns" if read == "direct" else "load_trace"
    assert [p.name for p in phases] == ["files", first, "plan", "tasks", "merge", "write"]
    assert all(p.seconds >= 0 and p.cpu_seconds >= 0 for p in phases)


def test_a_split_replay_reports_a_bad_trace_as_the_unsplit_one(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Keys the driver does not read: 7 bad rows over three shards under two configurations,
    # each reported once, by the shard whose own range holds it (others read some of them in
    # their warm-ups); the error is the one Spark's validation gives for the whole trace, and
    # nothing is written.
    trace = w1_trace(operations=600, rate=500.0)
    keys = trace["keys"].to_pylist()
    for i in (590, 20, 300, 301, 450, 10, 599):
        keys[i] = []
    trace = trace.set_column(3, "keys", pa.array(keys, pa.list_(pa.string())))
    (tmp_path / "t").mkdir()
    pq.write_table(trace, tmp_path / "t" / "part-0.parquet", row_group_size=100)
    path = str(tmp_path / "t")
    configs = [ReplayConfig(), ReplayConfig(purge_interval=10)]
    with pytest.raises(TraceError) as whole:
        load_trace(spark, path, configs)
    with pytest.raises(TraceError) as split:
        replay(spark, path, str(tmp_path / "o"), configs, tasks=None, shards=3)
    assert str(split.value) == str(whole.value)
    assert "op_id=10: column 'keys' is empty" in str(split.value)
    assert str(split.value).endswith("; 4+ more bad rows")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_a_split_replay_writes_no_event_log(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="writes no event log"):
        replay(spark, str(tmp_path), str(tmp_path / "o"), [ReplayConfig()], shards=2, event_log="x")


def test_spark_split_job_where_the_driver_cannot_read_the_trace(
    spark: SparkSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A trace the driver cannot read itself (say on HDFS): the shards are planned by Spark's
    # aggregation, the purge counter is not carried, the job says so, and the boundary falls
    # back; the summary still equals the one-process replay's.
    trace = w1_trace(operations=800, rate=500.0)
    pq.write_table(trace, tmp_path / "trace.parquet")
    # (As on HDFS: the tasks cannot read the files, so Spark's read; nor can the driver.)
    monkeypatch.setattr(_job_replay, "direct_read_problem", lambda files: "no pyarrow here")
    monkeypatch.setattr(_job_shards, "_local_columns", lambda path: None)
    config = ReplayConfig(purge_interval=10)
    replay(
        spark, str(tmp_path / "trace.parquet"), str(tmp_path / "o"), [config], tasks=None, shards=2
    )
    said = capsys.readouterr().err
    assert "the purge counter is not carried" in said
    assert "replayed sequentially" in said
    expected = replay_table(trace, {0: config}, operations=False).to_pylist()[0]
    got = pq.read_table(tmp_path / "o" / "summary").to_pylist()[0]
    gauges = ("peak_watched", "timer_passes", "purges", "purged_entries")
    for name in ("operations", "expired", *gauges):
        assert got[name] == expected[name], name
