"""`benchmarks.w1`: W1's traffic, and its replica in virtual time, which the instruction counts and
the ``w1-virtual`` microbenchmark drive."""

from __future__ import annotations

from benchmarks.w1 import SETTINGS, W1Setting, make_pools, run_virtual


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
