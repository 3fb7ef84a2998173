"""The pipeline's replay engine alone (`benchmarks.pipeline`, ``--engine-only``): no Spark, on
the operations the pipeline's trace would hold, reported as operations per second per core."""

from __future__ import annotations

import json

import pytest

from benchmarks.config import QUICK
from benchmarks.pipeline import engine_trace, main, render_engine, run_engine


def test_the_engine_trace_is_the_first_purgatory_of_the_full_trace() -> None:
    # Chunks are seeded per purgatory: the first purgatory's rows do not depend on how many
    # purgatories the trace has, so these are the rows the Spark job would write.
    eight = engine_trace(80_000, 8, 1_500)
    two = engine_trace(20_000, 2, 1_500)
    assert eight.num_rows == 1_500
    assert eight.equals(two)
    assert set(eight.column("purgatory").to_pylist()) == {"p0000"}


def test_the_workload_reports_operations_per_second_per_core() -> None:
    lines: list[str] = []
    found = run_engine(
        QUICK.with_overrides(engine_operations=1_000, engine_repetitions=1), lines.append
    )
    rate = found["engine_ops_per_core_s"]
    assert rate == pytest.approx(1e6 / found["engine_us_per_op"])
    assert found["engine_ops_per_core_s_min"] <= rate <= found["engine_ops_per_core_s_max"]
    assert found["figures"]["pipeline engine: operations/s per core"]["median"] == pytest.approx(
        rate
    )
    assert "operations/s per core" in lines[0]
    assert render_engine(found).startswith("Engine alone")


def test_engine_only_needs_no_trace_and_no_spark(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--engine-only", "--engine-operations", "500", "--repetitions", "1"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["engine_operations"] == 500
    assert "operations/s per core" in out.err
