"""`benchmarks.instructions`: the hot paths it counts under callgrind, and the goals it states.

Nothing here runs valgrind (the counts are the ``instructions`` workload's): the paths are run as
plain Python, on the same set-up the child process builds, to show that each one does the work
its name says, and the goals table is rendered from figures made up at the thresholds.
"""

from __future__ import annotations

import pytest

from benchmarks import instructions
from benchmarks.instructions import HOT_WATCHERS, PATHS, TARGETS, goals, main, section, w1_pools
from benchmarks.w1 import W1Setting, make_pools


def test_every_path_runs_through_the_public_api() -> None:
    for path in PATHS:
        if path.startswith("record_"):
            continue  # they write event logs: the eventlog workload's tests cover them
        run = instructions._build(path)
        run(2 * HOT_WATCHERS)


@pytest.mark.parametrize("path", ["hot_key_retry", "user_try_complete"])
def test_one_try_complete_call_per_operation_on_the_hot_key_paths(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = instructions._Paths()
    run = getattr(paths, path)()
    calls = []
    real = paths.Op.try_complete

    def counted(op: object) -> bool:
        calls.append(op)
        return real(op)  # type: ignore[arg-type]

    monkeypatch.setattr(paths.Op, "try_complete", counted)
    before = paths.purgatory.statistics()
    run(3 * HOT_WATCHERS)
    assert len(calls) == 3 * HOT_WATCHERS
    assert len(set(map(id, calls))) == HOT_WATCHERS  # the same operations, each re-tried
    assert paths.purgatory.statistics().completed == before.completed  # none was ready


@pytest.mark.parametrize(
    ("path", "completed", "expired"),
    [("watch_force_driver", 2000, 0), ("watch_expire_driver", 0, 51 * 20)],
)
def test_the_driver_paths_run_on_a_users_own_clock_moved_by_their_loop(
    path: str, completed: int, expired: int
) -> None:
    paths = instructions._Paths()
    run = getattr(paths, path)()
    purgatory = paths.driven
    assert type(paths.driver) is instructions.SteppingDriver  # not ManualClock
    run(2000)  # 100 moves of 1 ms, one per 20 operations
    stats = purgatory.statistics()
    assert stats.completed == completed
    # The 20 watched at g ms are due at g + 50 ms: by 100 ms, those of 0..50 ms have expired.
    assert stats.expired == expired
    assert paths.driver.now == pytest.approx(0.1)


def test_the_child_draws_w1_pools_as_the_suite_does() -> None:
    pools = make_pools(W1Setting("threshold", 20, 60, 100), 1)
    mine = w1_pools(seed=1)
    assert mine["gaps"] == pools.gaps
    assert mine["latencies"] == pools.latencies
    assert mine["keys"] == pools.keys


def test_run_lengths_must_be_whole_rounds_of_the_hot_key() -> None:
    with pytest.raises(SystemExit):
        main(["--paths", "hot_key_retry", "--short", "150", "--long", "400"])


def figures_at(ratios: dict[str, float]) -> dict[str, int]:
    """Each target's path at `ratios[path]` times its reference path."""
    found = {against: 10_000 for _, _, against, _, _, _ in TARGETS}
    for _, path, against, _, _, _ in TARGETS:
        found[path] = round(found[against] * ratios[path])
    return found


def verdicts(results: dict[str, dict[str, int]], column: str) -> dict[str, str]:
    return {row[0].split(" (")[0]: row[3] for row in goals(results, column)}


def test_the_goals_are_the_native_core_targets() -> None:
    wanted = {
        "watch_force": ("floor", 2.0, 1.5),
        "watch_expire": ("floor", 2.0, 1.5),
        "watch_force_driver": ("floor_driver", 1.6, 1.3),
        "watch_expire_driver": ("floor_driver", 1.6, 1.3),
        "threshold": ("watch_force", 1.3, None),
        "hot_key_retry": ("user_try_complete", 1.2, None),
        "subclass_create": ("plain_create", 1.6, None),
    }
    assert {path: (against, limit, moon) for _, path, against, limit, moon, _ in TARGETS} == wanted
    at_limit = figures_at({path: limit for path, (_, limit, _) in wanted.items()})
    for what, path, against, limit, moon, _ in TARGETS:
        for ratio, verdict in (
            (limit, "met"),
            (limit * 1.01, "**not met**"),
            (moon or limit, "met, moonshot too" if moon else "met"),
        ):
            column = dict(at_limit)
            column[path] = round(column[against] * ratio)
            assert verdicts({"native": column}, "native")[what] == verdict, (what, ratio)


def test_the_pure_build_is_judged_against_today_when_both_are_written() -> None:
    today = {"floor": 5000, "watch_force": 20000, "hot_key_retry": 1100}
    pure = {"floor": 5000, "watch_force": 20001, "hot_key_retry": 1000}
    rows = goals({"today": today, "pure": pure, "native": pure}, "native")
    judged = {row[0].split("`")[1]: row[3] for row in rows if "pure-Python" in row[0]}
    assert judged == {"floor": "met", "watch_force": "**not met**", "hot_key_retry": "met"}
    assert not [row for row in goals({"native": pure}, "native") if "pure-Python" in row[0]]
    assert "## Goals against `native`" in section({"today": today, "pure": pure, "native": pure})
