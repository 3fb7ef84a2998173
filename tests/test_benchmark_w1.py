"""`benchmarks.w1`: W1's traffic, its replica in virtual time (which the ``w1-virtual``
microbenchmark drives), and the procedure that turns probes into rates and ratios."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from benchmarks.w1 import (
    SETTINGS,
    W1Setting,
    achieved_share,
    bracket,
    make_pools,
    run_virtual,
    search,
    setting_ratios,
)


def test_every_mode_completes_the_same_requests_on_the_same_traffic() -> None:
    # Thresholds re-try only what is due, a key trigger re-tries everything, force completes
    # directly: on the same traffic all three must complete and expire the same requests.
    outcomes = set()
    for mode in ("force", "key", "threshold"):
        stats = run_virtual(W1Setting(mode, 20, 60, 100), 20_000, 40_000.0)
        assert stats.completed + stats.expired + stats.delayed == 20_000
        outcomes.add((stats.completed, stats.expired, stats.delayed))
    assert len(outcomes) == 1
    ((completed, expired, _pending),) = outcomes
    assert completed > 0
    assert expired > 0


def test_the_virtual_replica_is_deterministic_and_takes_the_pools_it_is_given() -> None:
    setting = W1Setting("threshold", 20, 60, 100)
    pools = make_pools(setting, seed=1)
    first = run_virtual(setting, 3_000, 40_000.0, seed=1)
    again = run_virtual(setting, 3_000, 40_000.0, seed=1, pools=pools)
    assert first == again
    assert run_virtual(setting, 3_000, 40_000.0, seed=2) != first


def test_the_settings_cover_every_mode_and_both_traffics() -> None:
    traffics = ((20, 60), (200, 400))
    assert {(s.mode, s.p50_ms, s.p75_ms) for s in SETTINGS} >= {
        (mode, p50, p75) for mode in ("force", "key", "threshold") for p50, p75 in traffics
    }
    assert SETTINGS[0].name == "W1-force 20/60"
    assert W1Setting("key", 20, 60, 100_000).name == "W1-key 20/60, 100,000 keys"


# -- the rate procedure: search, rounds, criteria, ratios --------------------------------------


def limit_at(capacity: float, noisy: frozenset[float] = frozenset()) -> Callable[[float], Any]:
    """A fake probe: passes at rates up to `capacity`, except those listed as `noisy` (a stall
    failed them), and records the rates it was asked for."""
    asked: list[float] = []

    def attempt(rate: float) -> dict[str, Any]:
        asked.append(rate)
        return {"rate": rate, "passed": rate <= capacity and rate not in noisy}

    attempt.asked = asked  # type: ignore[attr-defined]
    return attempt


def test_a_bracket_walks_up_while_probes_pass_and_down_while_they_fail() -> None:
    rate, probes = bracket(limit_at(1000.0), 800.0, 1.1, 5)
    assert rate == pytest.approx(800.0 * 1.1**2)  # 968 passes, 1064.8 fails
    assert [p["passed"] for p in probes] == [True, True, True, False]
    rate, probes = bracket(limit_at(1000.0), 1300.0, 1.1, 5)
    assert rate == pytest.approx(1300.0 / 1.1**3)
    assert [p["passed"] for p in probes] == [False, False, False, True]
    # Nothing passes within `down_limit` steps: the round found no rate, and says so.
    rate, probes = bracket(limit_at(100.0), 1300.0, 1.1, 3)
    assert rate is None
    assert len(probes) == 4


def test_one_noisy_probe_caps_a_search_but_not_the_rounds() -> None:
    # The earlier procedure: one search, its verdict final. A stall at 2,000/s makes the search
    # settle below it for a contender that sustains 3,000/s.
    attempt = limit_at(3000.0, noisy=frozenset({2000.0}))
    found, _ = search(attempt, 4000.0, 1.1, 9)
    assert found is not None
    assert found < 2000.0
    # Rounds start from there and walk up: each finds the capacity to within a step.
    rate: float | None = found
    for _ in range(3):
        rate, _ = bracket(limit_at(3000.0), rate or 500.0, 1.05, 6)
    assert rate is not None
    assert 3000.0 / 1.05 <= rate <= 3000.0


def test_achieved_reads_a_steady_fall_behind_not_a_stall() -> None:
    span = 1.0
    on_time = [0.0005] * 1000
    assert achieved_share(on_time, span) > 0.999
    # A 50 ms stall in the last moments, caught up by the end: kept pace.
    stalled = on_time[:990] + [0.05 - 0.005 * i for i in range(10)]
    assert achieved_share(stalled, span) > 0.99
    # 2 % short of the rate: the lag grows all along and the last quarter shows it.
    behind = [0.02 * i / 1000 for i in range(1000)]
    assert achieved_share(behind, span) < 0.99
    assert achieved_share([], span) == 0.0


def round_of(rate: float | None, cpu: float) -> dict[str, Any]:
    return {"max_rate": rate, "common": {"cpu_s_per_million": cpu}}


def test_ratios_pair_each_round_and_each_baseline_with_ours_on_its_loop() -> None:
    results = {
        "ours": {"round_details": [round_of(3000, 10), round_of(2000, 10), round_of(3300, 12)]},
        "A": {"round_details": [round_of(2000, 15), round_of(2000, 20), round_of(None, 12)]},
        "ours-uvloop": {"round_details": [round_of(4000, 8)]},
        "B": {"round_details": [round_of(1000, 16)]},
    }
    ratios = setting_ratios(results)
    rate = ratios["rate ours/A"]
    assert (rate["n"], rate["min"], rate["median"], rate["max"]) == (2, 1.0, 1.25, 1.5)
    cpu = ratios["cpu A/ours"]
    assert (cpu["n"], cpu["min"], cpu["median"], cpu["max"]) == (3, 1.0, 1.5, 2.0)
    assert ratios["rate ours-uvloop/B"]["median"] == 4.0
    assert ratios["cpu B/ours-uvloop"]["median"] == 2.0
    assert "rate ours/B" not in ratios  # never across loops


def test_a_setting_runs_its_rounds_and_the_report_renders_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole procedure on real probes, kept short: 50 ms schedules at rates capped at
    4,000/s, so each round is two or three probes. Nothing here is judged on speed."""
    from benchmarks import w1
    from benchmarks.config import QUICK
    from benchmarks.contenders import w1_contenders
    from benchmarks.report import render

    monkeypatch.setattr(w1, "MAX_RATE", 4_000.0)
    config = QUICK.with_overrides(
        probe_seconds=0.05, repeat=2, max_search_probes=1, start_rate=2_000.0, bracket_down=1
    )
    contenders = [c for c in w1_contenders(with_uvloop=False) if c.name in ("ours", "A")]
    setting = W1Setting("force", 20, 60, 100)
    entry = w1.run_setting(setting, contenders, config, lambda line: None, {})
    for who in ("ours", "A"):
        found = entry["contenders"][who]
        assert found["rounds"] == 2
        assert len(found["round_details"]) == 2
        for details in found["round_details"]:
            assert details["probes"][0]["rate"] > 0
            assert details["common"]["rate"] == entry["common_rate"]
    assert set(entry["ratios"]) == {"rate ours/A", "cpu A/ours"}
    assert entry["ratios"]["cpu A/ours"]["n"] == 2  # both common-rate probes always measure

    results = {
        "meta": {
            "config": {"quick": True, "seed": 1, "repeat": 2, "big_repeat": 1},
            "date": "-",
            "python": "-",
            "implementation": "-",
            "platform": "-",
            "cpu_count": 2,
            "cpu_model": "-",
            "load_before": "-",
            "purgatory_version": "-",
            "git": "-",
            "uvloop": "-",
            "command": "-",
        },
        "workloads": {
            "w1-force": {
                "timeout_s": w1.TIMEOUT,
                "keys_per_request": w1.KEYS_PER_REQUEST,
                "criteria": {"min_achieved": w1.MIN_ACHIEVED, "max_lag_p99_ms": 100.0},
                "rounds": 2,
                "bracket_step": config.bracket_step,
                "common_share": w1.COMMON_SHARE,
                "settings": [entry],
                "figures": w1._figures([entry]),
            }
        },
        "failed": {},
    }
    text = render(results)
    assert "| W1-force 20/60 | ours |" in text
    assert "| W1-force 20/60 | A |" in text
    assert "| W1-force 20/60: rate vs A (asyncio) | >= 1.5x |" in text
