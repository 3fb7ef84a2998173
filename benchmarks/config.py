"""Run parameters: the full run and the `--quick` smoke run, overridable from the command line."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from .measure import PyperfSettings

__all__ = ("FULL", "QUICK", "Config")


@dataclass(frozen=True)
class Config:
    """Everything that decides how long a run takes and how precise it is."""

    quick: bool
    seed: int
    repeat: int
    """Measured repetitions after the warm-up (W1: rounds of a rate bracket and a probe at the
    common rate; W2: repetitions per N)."""
    warmup: int
    """Unmeasured W2 repetitions first (W1 always runs one warm-up probe per contender)."""
    # W1
    probe_seconds: float
    """Length of the arrival schedule of one W1 probe (the drain after it is extra)."""
    search_precision: float
    """The W1 rate search stops once the failing rate is within this factor of the passing one."""
    max_search_probes: int
    start_rate: float
    """First rate probed for the first contender of each setting; later ones start at its result."""
    bracket_step: float
    """A W1 round's step between probed rates: its rate is known to within this factor."""
    bracket_down: int
    """Probes a W1 round takes below its start before it gives up (the round then found none)."""
    # W2
    sizes: tuple[int, ...]
    big_repeat: int
    """Repetitions at N >= 1e6: 3 in the full run, where one repetition costs 10-20 s per
    contender and the memory pass about 25 s (tracemalloc)."""
    c_max_n: int
    """Baseline C (a Task per request) is skipped above this N."""
    parked_n: int
    """Operations parked at once in ``parked`` (longest GC pause, bytes per operation)."""
    # idle and the expiry rate (real time)
    idle_repeat: int
    expiry_rate_seconds: float
    """Length of the offer at each rate of the expiry-rate search."""
    expiry_rate_steps: int
    """Bisection steps of the expiry-rate search after the doubling."""
    # the microbenchmarks (pyperf)
    micro: PyperfSettings
    virtual_requests: int
    """W1 requests per value of ``w1-virtual``."""
    expiry_ops: int
    """Operations pending in ``expiry-cost`` (half of them expire in the timed walk)."""
    steady_ops: int
    steady_pending: tuple[int, ...]
    eventlog_ops: int
    # the pipeline's replay engine alone (no Spark)
    engine_operations: int
    engine_repetitions: int

    def with_overrides(self, **changes: Any) -> Config:
        """A copy with the given fields replaced (``None`` values are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = Config(
    quick=False,
    seed=1,
    repeat=5,
    warmup=1,
    probe_seconds=1.0,
    search_precision=1.1,
    max_search_probes=9,
    start_rate=50_000.0,
    bracket_step=1.05,
    bracket_down=6,
    sizes=(1_000, 10_000, 100_000, 1_000_000),
    big_repeat=3,
    c_max_n=100_000,
    parked_n=1_000_000,
    idle_repeat=3,
    expiry_rate_seconds=3.0,
    expiry_rate_steps=4,
    micro=PyperfSettings(processes=6, values=3, warmups=1, min_time=0.1),
    virtual_requests=50_000,
    expiry_ops=200_000,
    steady_ops=50_000,
    steady_pending=(1_000, 8_000),
    eventlog_ops=100_000,
    engine_operations=200_000,
    engine_repetitions=5,
)

QUICK = replace(
    FULL,
    quick=True,
    repeat=2,
    warmup=0,
    probe_seconds=0.25,
    search_precision=2.0,
    max_search_probes=3,
    bracket_step=1.5,
    bracket_down=2,
    sizes=(1_000, 10_000, 100_000),
    big_repeat=1,
    c_max_n=10_000,
    parked_n=100_000,
    idle_repeat=2,
    expiry_rate_seconds=1.0,
    expiry_rate_steps=1,
    micro=PyperfSettings(processes=2, values=2, warmups=1, min_time=0.02),
    virtual_requests=5_000,
    expiry_ops=20_000,
    steady_ops=5_000,
    steady_pending=(1_000,),
    eventlog_ops=10_000,
    engine_operations=20_000,
    engine_repetitions=2,
)
