"""``calibrate``'s estimator, fed fake timings: a busy machine gives a profile with its spread.

Every cost but a few is a difference of two runs, and a busy machine makes two runs differ by
more than the cost. These tests put noisy, drifting and spiky timings of a made-up machine into
the estimator (`estimate`, and `calibrate` itself with its micro-benchmarks replaced), so what
they check does not depend on how busy the machine running them is; no wall-clock figure is
read. The real micro-benchmarks run in test_load_model.py (``calibrate --quick``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from purgatory.pipeline import _calibrate
from purgatory.pipeline._calibrate import (
    NOISE_FLOOR,
    Estimate,
    estimate,
    interleaved,
    solve,
)
from purgatory.pipeline._load import COST_KINDS, SHAPE_QUANTILES, CostProfile, profile_from_json


def test_a_round_runs_each_measurement_once_in_an_order_rotated_each_round() -> None:
    ran: list[str] = []

    def measurement(name: str) -> Callable[[], float]:
        def run() -> float:
            ran.append(name)
            return float(len(name))

        return run

    measurements = {name: measurement(name) for name in ("a", "bb", "ccc")}
    orders = []
    for index in range(4):
        ran.clear()
        assert interleaved(measurements, index) == {"a": 1.0, "bb": 2.0, "ccc": 3.0}
        orders.append(list(ran))
    first = ["a", "bb", "ccc"]
    assert orders == [first, ["bb", "ccc", "a"], ["ccc", "a", "bb"], first]


def rounds_of(values: list[float]) -> Callable[[int], dict[str, float]]:
    """A `measure_round` that gives one cost, ``x``, the next of `values` at each round."""
    return lambda index: {"x": values[index]}


def test_a_steady_cost_takes_the_fewest_rounds_and_has_no_spread() -> None:
    costs, rounds = estimate(rounds_of([2e-6] * 10), min_rounds=3, max_rounds=9, precision=0.05)
    assert rounds == 3
    assert (costs["x"].value, costs["x"].spread, costs["x"].values) == (2e-6, 0.0, (2e-6,) * 3)


def test_a_wide_spread_takes_more_rounds_up_to_the_maximum() -> None:
    noise = random.Random(7)
    wide = [2e-6 + noise.gauss(0, 2e-6) for _ in range(20)]
    costs, rounds = estimate(rounds_of(wide), min_rounds=3, max_rounds=9, precision=0.05)
    assert rounds == 9
    assert costs["x"].values == tuple(wide[:9])
    assert costs["x"].spread > 1e-6


def test_more_rounds_stop_once_the_median_is_precise_enough() -> None:
    # Rounds 1-3 disagree widely; then they agree, and the median's interval narrows with
    # each round until it is within the precision asked.
    values = [1e-6, 9e-6, 5e-6] + [5e-6] * 20
    costs, rounds = estimate(rounds_of(values), min_rounds=3, max_rounds=20, precision=0.05)
    assert 3 < rounds < 20
    assert costs["x"].value == 5e-6


def test_a_difference_within_its_noise_of_zero_is_never_negative() -> None:
    """A small cost under microseconds of noise: most rounds' values are negative (each is a
    difference of two runs), the median too; the cost is 0, and its spread says how uncertain."""
    values = [v * 1e-6 for v in (-4, 3, -1, -2.5, 0.5, -3, 2, -0.5, 1.5)]  # median -0.5 us
    costs, rounds = estimate(rounds_of(values), min_rounds=5, max_rounds=9, precision=0.05)
    assert (rounds, costs["x"].value) == (9, 0.0)
    assert costs["x"].spread > 2e-6


def test_a_round_another_process_took_moves_the_median_little() -> None:
    values = [3e-6, 3.1e-6, 1e-3, 2.9e-6, 3e-6, 3.05e-6, 2.95e-6]  # round 3: a 1 ms stall
    costs, _ = estimate(rounds_of(values), min_rounds=7, max_rounds=7, precision=0.05)
    assert costs["x"].value == 3e-6
    assert costs["x"].spread < 0.2e-6


def test_a_cost_below_the_noise_floor_does_not_ask_for_more_rounds() -> None:
    values = [NOISE_FLOOR / 10 * (i % 3) for i in range(9)]  # 0-2 ns: imprecise, and nothing
    _, rounds = estimate(rounds_of(values), min_rounds=3, max_rounds=9, precision=0.05)
    assert rounds == 3


def test_rounds_must_be_at_least_one_and_at_most_the_maximum() -> None:
    for low, high in ((0, 3), (4, 3)):
        with pytest.raises(ValueError, match="1 <= min <= max"):
            estimate(rounds_of([1.0]), min_rounds=low, max_rounds=high, precision=0.1)


# -- calibrate() with a made-up machine --------------------------------------------------------

#: What each micro-benchmark costs on the made-up machine when it is quiet (CPU seconds; per
#: callback, per try, or in total for the expiry runs, as each scenario returns).
QUIET = {
    "_callbacks@busy": 1.0e-6,
    "_callbacks@idle": 30.0e-6,
    "_iterations": 1.8e-6,
    "_watches@1": 3.0e-6,
    "_watches@4": 4.2e-6,
    "_attempts": 0.1e-6,
    "_completions": 0.5e-6,
    "_expiries@bulk": 5e-6 + 500 * 0.7e-6,
    "_expiries@spaced": 60 * (30e-6 + 20e-6 + 0.7e-6),
    "_working@asleep": 45.0e-6,
    "_working@awake": 3.0e-6,
    "_purges": 0.05e-6,
}


@dataclass
class Machine:
    """The made-up machine's timings: each run takes its quiet cost times the load at the
    moment (which drifts from run to run, between `low` and `high` times), times its own jitter
    (each run's own, unpaired: up to `jitter` either way)."""

    low: float = 1.0
    high: float = 1.0
    jitter: float = 0.0
    seed: int = 1
    runs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        self.load = self.low

    def time(self, name: str) -> float:
        self.runs.append(name)
        if len(self.runs) % len(QUIET) == 1:  # the load changes between rounds
            self.load = self.random.uniform(self.low, self.high)
        wobble = 1 + self.random.uniform(-self.jitter, self.jitter)
        return QUIET[name] * self.load * wobble


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Machine]:
    """Replace calibrate's micro-benchmarks with a `Machine`'s timings (on real loops)."""
    made: list[Machine] = []

    def make(**options: Any) -> Machine:
        made.append(Machine(**options))
        return made[-1]

    def fake(name: str, variant: Callable[..., str] | None = None) -> Callable[..., Any]:
        async def scenario(*args: Any) -> float:
            return made[-1].time(name if variant is None else f"{name}@{variant(*args)}")

        return scenario

    monkeypatch.setattr(
        _calibrate, "_callbacks", fake("_callbacks", lambda n, s: "idle" if s >= 1e-3 else "busy")
    )
    monkeypatch.setattr(_calibrate, "_iterations", fake("_iterations"))
    monkeypatch.setattr(_calibrate, "_watches", fake("_watches", lambda n, keys: str(keys)))
    monkeypatch.setattr(_calibrate, "_attempts", fake("_attempts"))
    monkeypatch.setattr(_calibrate, "_completions", fake("_completions"))
    monkeypatch.setattr(
        _calibrate, "_expiries", fake("_expiries", lambda n, spaced: "spaced" if spaced else "bulk")
    )
    monkeypatch.setattr(
        _calibrate, "_working", fake("_working", lambda n, s: "asleep" if s >= 1e-3 else "awake")
    )
    monkeypatch.setattr(_calibrate, "_purges", fake("_purges"))

    async def latency(n: int, resolution: float) -> list[float]:
        return [1e-4] * n

    monkeypatch.setattr(_calibrate, "_wake_latency", latency)

    async def per_event(n: int) -> list[tuple[int, int]]:
        return [(3000, 3000)] * (n - 1) + [(30_000, 1_030_000)]

    async def credit(bursts: int) -> float:
        return 0.004

    def speed(seconds: float) -> list[tuple[int, int]]:
        # 20 ms windows of 10 us units, the third twice as slow.
        return [
            (w * 20_000_000 + i * 10_000, 20_000 if w == 2 else 10_000)
            for w in range(5)
            for i in range(100)
        ]

    monkeypatch.setattr(_calibrate, "_per_event", per_event)
    monkeypatch.setattr(_calibrate, "_stall_credit", credit)
    monkeypatch.setattr(_calibrate, "_speed", speed)
    return make


def truth() -> dict[str, float]:
    """The costs the quiet machine's timings solve to."""
    raw = {
        "callbacks": QUIET["_callbacks@busy"],
        "turns": QUIET["_iterations"],
        "watch1": QUIET["_watches@1"],
        "watch4": QUIET["_watches@4"],
        "attempt": QUIET["_attempts"],
        "completion": QUIET["_completions"],
        "bulk": QUIET["_expiries@bulk"],
        "spaced": QUIET["_expiries@spaced"],
        "idle": QUIET["_callbacks@idle"],
        "asleep": QUIET["_working@asleep"],
        "awake": QUIET["_working@awake"],
        "purged_entry": QUIET["_purges"],
    }
    return solve(raw, 60, 500)


def test_the_quiet_machine_solves_to_its_costs_in_the_fewest_rounds(
    machine: Callable[..., Machine],
) -> None:
    want = truth()
    assert want["iteration"] == pytest.approx(0.8e-6)
    assert all(value > 0 for value in want.values())
    made = machine()
    profile = _calibrate.calibrate(quick=True)
    assert profile.rounds == _calibrate._QUICK.min_rounds
    assert len(made.runs) == profile.rounds * len(QUIET)
    for kind, value in want.items():
        assert getattr(profile, kind) == pytest.approx(value), kind
    assert profile.spread == pytest.approx(dict.fromkeys(want, 0.0), abs=1e-15)
    assert profile.noisy() == []
    assert "noisy" not in profile.describe()
    # The distributions, from callbacks timed one by one: all 3 us but one of 30 us held off
    # the core 1 ms; a stall only 4 ms after a wake-up.
    n = _calibrate._QUICK.events
    mean = (3000 * (n - 1) + 30_000) / n
    assert profile.stall_basis == pytest.approx(mean * 1e-9)
    assert profile.cost_shape[-1] == pytest.approx(30_000 / mean)
    assert profile.cost_shape[0] == pytest.approx(3000 / mean)
    assert profile.stall[-1] == pytest.approx(1e-3)
    assert profile.stall[SHAPE_QUANTILES.index(0.999)] == 0.0
    assert profile.stall_credit == 0.004
    assert profile.stall_mean == pytest.approx(1e-3 / n)
    assert "none within 4.00 ms of a wake-up" in profile.describe()
    # The core's speed: five windows of 20 ms, the third twice the others' CPU per unit.
    assert profile.speed_window == _calibrate.SPEED_WINDOW
    assert profile.speed == pytest.approx(tuple(x / 1.2 for x in (1, 1, 2, 1, 1)))
    assert "the core's speed over 5 windows of 20 ms" in profile.describe()


def test_a_load_that_drifts_between_rounds_cancels_in_each_rounds_differences(
    machine: Callable[..., Machine],
) -> None:
    """The load changes tenfold from round to round, but each round's runs see the same load:
    their differences never go negative, and each cost is the truth at some load in between."""
    machine(low=1.0, high=10.0)
    profile = _calibrate.calibrate(quick=True)
    for kind, value in truth().items():
        assert value <= getattr(profile, kind) <= 10 * value, kind


def test_a_busy_machine_gives_a_profile_with_its_spread(machine: Callable[..., Machine]) -> None:
    """Each run's own jitter (up to +-60 %) makes the differences of runs noisy, some rounds'
    negative: the rounds go to the maximum, every cost is still >= 0, and the profile records
    its spread and says which costs are noisy; it survives its file's round trip."""
    made = machine(low=1.0, high=4.0, jitter=0.6, seed=11)
    solved: list[dict[str, Estimate]] = []

    def estimate_seen(*args: Any, **options: Any) -> tuple[dict[str, Estimate], int]:
        costs, rounds = estimate(*args, **options)
        solved.append(costs)
        return costs, rounds

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_calibrate, "estimate", estimate_seen)
        profile = _calibrate.calibrate(quick=True)
    (costs,) = solved
    negative = [kind for kind, cost in costs.items() if min(cost.values) < 0]
    assert negative  # (what a difference of runs gives on a busy machine)
    assert profile.rounds == _calibrate._QUICK.max_rounds
    assert len(made.runs) == profile.rounds * len(QUIET)
    for kind in truth():
        assert getattr(profile, kind) >= 0, kind
        assert profile.spread[kind] > 0, kind
    assert profile.noisy()
    assert "noisy" in profile.describe()
    again = profile_from_json(profile.to_json(), "the round trip")
    assert (again.spread, again.rounds) == (profile.spread, profile.rounds)


def test_a_profile_checks_its_spread() -> None:
    costs: dict[str, Any] = dict.fromkeys(COST_KINDS, 1e-6)
    assert CostProfile(**costs).spread == {}  # a profile by hand: none
    for spread, said in (
        ({"nope": 0.0}, "unknown cost"),
        ({"wake": -1.0}, "must be seconds in"),
        ({"wake": "1"}, "must be seconds"),
    ):
        with pytest.raises(ValueError, match=said):
            CostProfile(**costs, spread=spread)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rounds must be"):
        CostProfile(**costs, rounds=-1)
