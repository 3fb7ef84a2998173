"""`benchmarks.parked`: operations parked at once, the longest collector pause while scheduling
them and their bytes, ours beside A's. Small N here: the figures' shape, not their size."""

from __future__ import annotations

import gc

from benchmarks.config import QUICK
from benchmarks.contenders import w2_contenders
from benchmarks.measure import GcPauses
from benchmarks.parked import CONTENDERS, run, schedule_pauses
from benchmarks.w2 import Workload


def test_gc_pauses_keep_the_longest_collection() -> None:
    with GcPauses() as pauses:
        gc.collect()
        gc.collect(0)
    assert pauses.collections == 2
    assert pauses.full_collections == 1
    assert 0.0 < pauses.longest <= pauses.seconds


def test_scheduling_is_timed_with_the_collector_on_and_nothing_expires() -> None:
    work = Workload.make(3_000, seed=1)
    for contender in w2_contenders(with_uvloop=False):
        if contender.name not in CONTENDERS:
            continue
        found = schedule_pauses(contender, work)
        assert found["n"] == 3_000
        assert found["schedule_us"] > 0
        assert found["gc_collections"] > 0  # thousands of allocations: gen 0 ran
        assert 0.0 < found["gc_longest_s"] <= found["gc_s"]


def test_a_run_reports_both_contenders_with_their_bytes() -> None:
    lines: list[str] = []
    found = run(QUICK.with_overrides(parked_n=2_000), lines.append)
    assert found["n"] == 2_000
    assert set(found["contenders"]) == {"ours", "A"}
    for who, result in found["contenders"].items():
        assert result["bytes_per_op"] > found["user_object_bytes"] > 0, who
        assert f"parked N=2,000 {who}: longest GC pause" in found["figures"]
    assert len(lines) == 4
