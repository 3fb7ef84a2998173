"""`benchmarks.workloads` and the command line over it: every workload listed, picked by name,
run in order into one results file that says which ones failed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.__main__ import main, run
from benchmarks.config import QUICK, Config
from benchmarks.measure import figure
from benchmarks.workloads import ALIASES, WORKLOADS, Workload, _through_main, select


def test_every_workload_is_listed_by_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    helped = capsys.readouterr().out
    for workload in WORKLOADS:
        assert f"  {workload.name} " in helped, workload.name
    assert "compare A.json B.json" in helped


def test_every_workload_names_a_function_that_exists() -> None:
    import importlib

    for workload in WORKLOADS:
        module, function = workload.target.split(":")
        assert callable(getattr(importlib.import_module(f"benchmarks.{module}"), function))
    assert len({w.name for w in WORKLOADS}) == len(WORKLOADS)


def test_only_takes_names_and_aliases_in_run_order() -> None:
    assert [w.name for w in select("idle, w1-key")] == ["w1-key", "idle"]
    assert [w.name for w in select("w1")] == list(ALIASES["w1"])
    assert [w.name for w in select("micro,eventlog")] == list(ALIASES["micro"])
    with pytest.raises(ValueError, match="unknown workload 'w3'"):
        select("w1,w3")
    with pytest.raises(ValueError, match="at least one"):
        select(" , ")


def test_an_unknown_workload_is_refused_on_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--only", "nothing"])
    assert "unknown workload 'nothing'" in capsys.readouterr().err


@dataclass(frozen=True)
class _Fake(Workload):
    """A workload that measures nothing: two figures, or an error."""

    def run(self, config: Config, log: Any) -> dict[str, Any]:
        if self.name == "broken":
            raise RuntimeError("it broke")
        return {"figures": {f"{self.name} x": figure([1.0, 3.0], "us/op")}}


def test_a_run_writes_one_file_keeps_going_past_a_failure_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "run.json"
    workloads = [_Fake("first", "", ""), _Fake("broken", "", ""), _Fake("last", "", "")]
    assert run(workloads, QUICK, output) == 1
    results = json.loads(output.read_text())
    assert list(results["workloads"]) == ["first", "last"]
    assert results["failed"] == {"broken": "RuntimeError: it broke"}
    assert results["workloads"]["last"]["figures"]["last x"]["median"] == 2.0
    meta = results["meta"]
    assert meta["config"]["quick"] is True
    assert meta["commit"]
    report, err = capsys.readouterr()
    assert "**Smoke run (`--quick`)**" in report
    assert "`broken`: RuntimeError: it broke" in report
    assert "FAILED broken" in err


def test_a_module_with_its_own_command_line_runs_through_its_main(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def module_main(argv: list[str]) -> int:
        print("floor        4,902 instructions per operation", *argv)
        return 0

    found = _through_main(module_main, ["--x"])
    assert found["output"] == "floor        4,902 instructions per operation --x\n"
    assert "4,902" in capsys.readouterr().err  # progress goes on to stderr

    with pytest.raises(RuntimeError, match="exited with status 2"):
        _through_main(lambda argv: 2, [])
