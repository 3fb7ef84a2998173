"""The pipeline's command line without Spark: checks before a session, one-line errors, --help.

Every bad input must end in one line on stderr naming the file, with exit status 2, before a
Spark session starts: the `no_spark` fixture makes starting one fail the test. ``--help`` runs in
a subprocess where numpy, pyarrow and pyspark cannot be imported. Also: the replay's event-log
file names of different purgatories never collide, and the sweep chart's labels.
"""

from __future__ import annotations

import argparse
import dataclasses
import doctest
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers import FlagOperation, run_process
from spark_support import BASE_UTC, record_at, write_trace

from purgatory import ArrowEventLog, DelayedOperationPurgatory
from purgatory.pipeline import (
    W1,
    ReplayConfig,
    _chart,
    _checks,
    _cli,
    _options,
    _spark,
    replay_table,
)
from purgatory.pipeline._checks import InputError
from purgatory.testing import ManualClock

ROOT = Path(__file__).resolve().parent.parent

# Runs ``python -m purgatory.pipeline ARGS`` with the Spark extra's modules unimportable.
WITHOUT_EXTRA = """
import runpy, sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"numpy", "pyarrow", "pyspark", "pandas", "matplotlib"}:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Block())
runpy.run_module("purgatory.pipeline", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(autouse=True)
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting a Spark session fails the test: every error here must come before one."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a Spark session was started")

    monkeypatch.setattr(_spark, "get_session", refuse)


def fails(argv: Sequence[object], capsys: pytest.CaptureFixture[str], *named: object) -> str:
    """Run the command line; check exit 2 and one line on stderr naming `named`; the line."""
    assert _cli.main([str(a) for a in argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    line = lines[0]
    assert line.startswith(f"purgatory.pipeline {argv[0]}: error: "), line
    assert "Traceback" not in line
    for thing in named:
        assert str(thing) in line, line
    return line


def replay_args(trace: Path, out: Path, *more: object) -> list[object]:
    return ["replay", "--trace", trace, "--out", out, *more]


# -- traces ------------------------------------------------------------------------------------


def test_a_missing_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = fails(replay_args(tmp_path / "nope", tmp_path / "out"), capsys, tmp_path / "nope")
    assert "no such file or directory" in line


def test_event_logs_given_as_a_trace_say_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "events"
    logs.mkdir()
    (logs / "p-0123456789ab-000000.jsonl").write_text("{}\n")
    line = fails(replay_args(logs, tmp_path / "out"), capsys, logs)
    assert "holds event logs" in line
    assert f"generate --from-log {logs}" in line
    assert f"analyze --log {logs}" in line


def test_an_empty_trace_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "_SUCCESS").write_text("")  # hidden from Spark, and from the check
    line = fails(replay_args(tmp_path / "trace", tmp_path / "out"), capsys, tmp_path / "trace")
    assert "no Parquet files" in line


def test_a_truncated_parquet_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_trace(tmp_path / "trace" / "part-0.parquet")
    file = write_trace(tmp_path / "trace" / "part-1.parquet")
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    line = fails(replay_args(tmp_path / "trace", tmp_path / "out"), capsys, file)
    assert "truncated" in line


def test_a_file_that_is_not_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_trace(tmp_path / "trace" / "part-0.parquet")
    notes = tmp_path / "trace" / "notes.txt"
    notes.write_text("Spark reads every file of the directory, this one too\n")
    line = fails(replay_args(tmp_path / "trace", tmp_path / "out"), capsys, notes)
    assert "not a Parquet file" in line


def test_a_parquet_file_with_a_broken_footer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "trace.parquet"
    file.write_bytes(b"PAR1" + b"\x00" * 40 + b"\xff\xff\x00\x00PAR1")
    line = fails(replay_args(file, tmp_path / "out"), capsys, file)
    assert "unreadable Parquet footer" in line


def test_files_that_disagree_on_column_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = write_trace(tmp_path / "trace" / "part-0.parquet")
    second = write_trace(
        tmp_path / "trace" / "part-1.parquet", timeout=pa.array([1, 2], pa.int64())
    )
    line = fails(replay_args(tmp_path / "trace", tmp_path / "out"), capsys, second, first)
    assert "column 'timeout' has type int64" in line


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"keys": None}, "missing column 'keys'"),
        ({"purgatory": pa.array([1, 2])}, "column 'purgatory' has type int64, expected a string"),
        ({"timeout": pa.array(["1", "2"])}, "column 'timeout' has type string, expected a number"),
        ({"note": pa.array(["x", "y"])}, "unknown column 'note' (a trace of schema version 1 has"),
    ],
)
def test_a_trace_file_without_the_trace_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], message: str
) -> None:
    file = write_trace(tmp_path / "trace" / "part-0.parquet", **changes)
    line = fails(replay_args(tmp_path / "trace", tmp_path / "out"), capsys, file)
    assert message in line


def test_a_valid_trace_passes_the_checks(tmp_path: Path) -> None:
    write_trace(tmp_path / "trace" / "part-0.parquet")
    write_trace(tmp_path / "trace" / "sub" / "part-1.parquet")
    (tmp_path / "trace" / ".part-0.parquet.crc").write_bytes(b"crc")
    _checks.check_trace(str(tmp_path / "trace"))
    _checks.check_trace(f"file://{tmp_path / 'trace' / 'part-0.parquet'}")
    _checks.check_trace("hdfs://nowhere/trace")  # not local: left to Spark


def test_a_plain_path_under_spark_submit_is_left_to_spark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    _checks.check_trace(str(tmp_path / "nope"))  # the cluster's default filesystem may have it
    with pytest.raises(InputError, match="no such file"):
        _checks.check_trace(f"file:{tmp_path / 'nope'}")


# -- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--wheel-size", "1"], "wheel_size must be at least 2"),
        (["--purge-interval", "-1"], "purge_interval must be >= 0"),
        (["--tick", "0"], "tick must be a finite number > 0"),
    ],
)
def test_a_setting_the_purgatory_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], message: str
) -> None:
    file = write_trace(tmp_path / "trace.parquet")
    fails(replay_args(file, tmp_path / "out", *option), capsys, message)


def test_a_sweep_timeout_beyond_the_horizon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = fails(["sweep", "--out", tmp_path / "s", "--timeout", "5e12"], capsys, "5000000000000.0")
    assert "beyond the timer's horizon" in line
    assert "x2" in line  # the default grid's longest timeout scale is the one beyond


def test_the_horizon_is_the_purgatorys_own() -> None:
    """Found by asking a purgatory: the horizon is accepted, the next double refused."""
    for tick in (0.001, 0.05):
        horizon = _checks.timer_horizon(tick)
        p: DelayedOperationPurgatory[FlagOperation] = DelayedOperationPurgatory(
            "p", tick=tick, clock=ManualClock()
        )
        assert p.try_complete_else_watch(FlagOperation(horizon), ["k"]) is False
        with pytest.raises(ValueError, match="horizon"):
            p.try_complete_else_watch(FlagOperation(math.nextafter(horizon, math.inf)), ["k"])
    limits = _checks.horizon_limits(
        [ReplayConfig(tick=0.001), ReplayConfig(tick=0.001), ReplayConfig(timeout_scale=2.0)]
    )
    assert [(scale, limit) for scale, limit, _ in limits] == [
        (1.0, _checks.timer_horizon(0.001)),
        (2.0, _checks.timer_horizon(0.001)),
    ]


def test_a_bad_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "events").mkdir()
    fails(
        ["analyze", "--log", tmp_path / "events", "--out", tmp_path / "o", "--window", "0"],
        capsys,
        "--window",
    )


# -- event logs --------------------------------------------------------------------------------


def test_analyze_of_an_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "events").mkdir()
    line = fails(["analyze", "--log", tmp_path / "events", "--out", tmp_path / "o"], capsys)
    assert f"event log {tmp_path / 'events'}: no event logs (*.jsonl, *.arrows)" in line


def test_analyze_of_files_still_being_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    part = tmp_path / "events" / "p-0123456789ab-000000.jsonl.part"
    part.parent.mkdir()
    part.write_text("{}\n")
    line = fails(["analyze", "--log", tmp_path / "events", "--out", tmp_path / "o"], capsys, part)
    assert "still being written" in line


@pytest.mark.parametrize("command", ["analyze", "generate"])
def test_a_trace_given_as_event_logs_says_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    trace = tmp_path / "trace"
    write_trace(trace / "part-0.snappy.parquet")
    option = "--log" if command == "analyze" else "--from-log"
    line = fails([command, option, trace, "--out", tmp_path / "o"], capsys, trace)
    assert "holds Parquet files, not event logs" in line
    assert f"replay --trace {trace}" in line


def test_a_missing_event_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = fails(["analyze", "--log", tmp_path / "nope", "--out", tmp_path / "o"], capsys)
    assert f"event log {tmp_path / 'nope'}: no such file or directory" in line


# -- outputs -----------------------------------------------------------------------------------


def test_an_existing_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "out").mkdir()
    line = fails(["generate", "--out", tmp_path / "out"], capsys, tmp_path / "out")
    assert "already exists (pass --overwrite" in line


def test_an_output_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    line = fails(["generate", "--out", tmp_path / "file" / "out"], capsys, tmp_path / "file")
    assert "is a file, not a directory" in line


def test_an_output_that_would_replace_its_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace"
    write_trace(trace / "part-0.parquet")
    for out in (trace, trace / "replay"):
        line = fails(replay_args(trace, out, "--overwrite"), capsys, trace)
        assert "overlaps the input" in line


def test_an_event_log_directory_that_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = write_trace(tmp_path / "trace.parquet")
    (tmp_path / "events").write_text("")
    line = fails(replay_args(file, tmp_path / "out", "--event-log", tmp_path / "events"), capsys)
    assert f"event-log directory {tmp_path / 'events'}" in line


def test_sweep_outputs_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s" / "replay").mkdir(parents=True)
    fails(["sweep", "--out", tmp_path / "s"], capsys, tmp_path / "s" / "replay", "already exists")


# -- other errors: one line, the trace only with --verbose --------------------------------------


def test_other_errors_are_one_line_and_verbose_shows_the_trace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("gateway gone\n\tat org.apache.spark.Something(Something.scala:1)")

    monkeypatch.setattr(_spark, "get_session", broken)
    argv = ["generate", "--out", str(tmp_path / "out")]
    assert _cli.main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "purgatory.pipeline generate: error: RuntimeError: gateway gone "
        "(--verbose shows the full trace)"
    ]
    with pytest.raises(RuntimeError, match="gateway gone"):
        _cli.main([*argv, "--verbose"])


def test_one_line_of_a_spark_task_error() -> None:
    """What PySpark raises for a Python error in a task: JVM text around the task's traceback."""

    class PythonException(Exception):
        pass

    PythonException.__module__ = "pyspark.errors.exceptions.captured"
    text = (
        "\n  An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n"
        '  File "/x/worker.py", line 1, in main\n'
        "    process()\n"
        "ValueError: timeout 1e+20 s is beyond the timer's horizon\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handle(PythonRunner.scala:1)\n"
    )
    assert _cli.one_line(PythonException(text)) == (
        "in a Spark task: ValueError: timeout 1e+20 s is beyond the timer's horizon"
    )

    class Py4JJavaError(Exception):
        pass

    Py4JJavaError.__module__ = "py4j.protocol"
    text = (
        "An error occurred while calling o42.parquet.\n"
        ": org.apache.spark.SparkException: [FAILED_READ_FILE] Error while reading file x.\n"
        "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.cannotReadFilesError(x:1)\n"
    )
    assert _cli.one_line(Py4JJavaError(text)) == (
        "org.apache.spark.SparkException: [FAILED_READ_FILE] Error while reading file x."
    )


# -- --help and the extra ----------------------------------------------------------------------


def without_extra(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return run_process(sys.executable, "-c", WITHOUT_EXTRA, *args, cwd=ROOT, env=env, timeout=60)


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ((), ["examples:", "sweep --out sweep/", "COMMAND --help"]),
        (("generate",), ["--rate RATE", "(default: 1000.0)", "(default: 100000)", "examples:"]),
        (("replay",), ["(default: 0.001)", "(default: 1024)", "(default: key)", "examples:"]),
        (("analyze",), ["(default: 60.0)", "examples:"]),
        (("sweep",), ["(default: 0.5,1,2)", "(default: 20000)", "examples:"]),
    ],
)
def test_help_works_without_the_extra_and_shows_defaults(
    command: tuple[str, ...], shown: list[str]
) -> None:
    done = without_extra(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    for text in [*shown, "pip install 'asyncio-purgatory[spark]'", "Not installed here"]:
        assert text in done.stdout
    assert "(default: None)" not in done.stdout
    assert "(default: False)" not in done.stdout
    assert "(default " not in done.stdout  # said by the formatter, not again by the help text


def test_no_option_states_its_default_twice() -> None:
    """The formatter adds "(default: X)" to each option's help: a help text that says its
    default too would show it twice."""
    parser = _cli.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert "calibrate" in commands.choices
    for name, command in commands.choices.items():
        formatter = command._get_formatter()
        for action in command._actions:
            if not action.help:
                continue
            text = formatter._expand_help(action)
            assert text.lower().count("default") <= 1, (name, action.option_strings, text)


def test_a_command_without_the_extra_says_what_to_install(tmp_path: Path) -> None:
    done = without_extra("replay", "--trace", str(tmp_path), "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "purgatory.pipeline replay: error: this command needs the Spark extra "
        "(no module 'pyspark'): pip install 'asyncio-purgatory[spark]'"
    ]


def test_the_python_api_says_what_to_install_without_the_extra() -> None:
    code = WITHOUT_EXTRA.split("runpy.run_module", maxsplit=1)[0] + (
        "import purgatory.pipeline\n"
        "try:\n"
        "    from purgatory.pipeline import replay\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run_process(sys.executable, "-c", code, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "asyncio-purgatory[spark]" in done.stdout


def test_the_help_defaults_are_the_library_defaults() -> None:
    assert dataclasses.asdict(W1()) == _options.W1_DEFAULTS
    config = ReplayConfig()
    assert {
        "tick": f"{config.tick:g}",
        "wheel_size": str(config.wheel_size),
        "purge_interval": str(config.purge_interval),
    } == _options.GRID_DEFAULTS


# -- replay event logs -------------------------------------------------------------------------


def test_purgatories_never_share_an_event_log_file(tmp_path: Path) -> None:
    """Names that map to the same safe characters, or start with what Spark hides."""
    names = ["orders eu", "orders/eu", "orders_eu", "_orders", ".orders", "x" * 300]
    rows = [(name, i, float(i), ["k"], 1.0, None) for i, name in enumerate(names)]
    columns = list(zip(*rows, strict=True))
    trace = pa.table(
        {
            "purgatory": pa.array(columns[0], pa.string()),
            "op_id": pa.array(columns[1], pa.int64()),
            "arrival": pa.array(columns[2], pa.float64()),
            "keys": pa.array(columns[3], pa.list_(pa.string())),
            "timeout": pa.array(columns[4], pa.float64()),
            "condition_at": pa.array(columns[5], pa.float64()),
        }
    )
    replay_table(trace, {0: ReplayConfig()}, event_log_dir=str(tmp_path))
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) == len(names)
    found = set()
    for file in files:
        assert not file.name.startswith(("_", ".")), file.name
        assert len(file.name) < 120, file.name
        lines = [json.loads(line) for line in file.read_text().splitlines()]
        assert len(lines) == 1
        found.add(lines[0]["purgatory"])
    assert found == {f"{name}@0" for name in names}


# -- the chart ---------------------------------------------------------------------------------


def summary_row(config_id: int, **settings: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "config_id": config_id,
        "tick": 0.001,
        "wheel_size": 1024,
        "purge_interval": 1000,
        "timeout_scale": 1.0,
        "rate_scale": 1.0,
        "trigger": "key",
        "operations": 1000,
        "expired": 159,
        "wait_p99": 0.2,
        "peak_watched": 12345,
    }
    return {**row, **settings}


def test_chart_labels_show_only_what_varies() -> None:
    rows = [
        summary_row(0, timeout_scale=0.5, tick=0.01),
        summary_row(1, timeout_scale=1.0, tick=0.01),
        summary_row(2, timeout_scale=2.0, tick=0.01),
    ]
    labels, common = _chart.config_labels(rows)
    assert labels == ["timeout x0.5", "timeout x1", "timeout x2"]
    assert common == "tick 10 ms, wheel 1,024, purge 1,000, rate x1, trigger key"
    labels, common = _chart.config_labels([summary_row(0)])
    assert labels == ["configuration 0"]
    labels, _ = _chart.config_labels([summary_row(0), summary_row(1, trigger="force")])
    assert labels == ["trigger key", "trigger force"]


def test_chart_numbers_and_docstring_examples() -> None:
    assert [_chart.number(v) for v in (0.0, 0.000123, 15.934, 99.96, 1024, 12345.6)] == [
        "0",
        "0.000123",
        "15.9",
        "100",
        "1,024",
        "12,346",
    ]
    assert doctest.testmod(_chart, raise_on_error=False).failed == 0


def test_chart_is_written(tmp_path: Path) -> None:
    rows = [summary_row(0, rate_scale=1.0), summary_row(1, rate_scale=2.0)]
    _chart.sweep_chart(rows, str(tmp_path / "sweep.png"), "a sweep")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_input_error_is_a_value_error() -> None:
    assert issubclass(InputError, ValueError)


def test_an_event_log_directory_inside_the_output_or_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The output is replaced whole at the end, and a trace directory is read whole: event logs
    written into either would be destroyed or would spoil the trace."""
    trace = tmp_path / "trace"
    write_trace(trace / "part-0.parquet")
    out = tmp_path / "out"
    for events, other in ((out / "events", out), (trace, trace), (trace / "events", trace)):
        line = fails([*replay_args(trace, out), "--event-log", events], capsys, events)
        assert f"overlaps the {'output' if other == out else 'input'} {other}" in line
    sweep = ["sweep", "--out", tmp_path / "s", "--event-log", tmp_path / "s" / "replay" / "ev"]
    line = fails(sweep, capsys, tmp_path / "s" / "replay")
    assert "overlaps the output" in line


@pytest.mark.parametrize(
    ("args", "out", "said"),
    [
        (["--application-cost", "nan"], "profile.json", "--application-cost must be a number"),
        (["--application-cost", "-1"], "profile.json", "in [0, 1], got -1.0"),
        (["--application-cost", "1e300"], "profile.json", "in [0, 1], got 1e+300"),
        (
            ["--application-condition-cost", "-1"],
            "profile.json",
            "--application-condition-cost must be a number of seconds in [0, 1], got -1.0",
        ),
        ([], "missing/profile.json", "no directory"),
        ([], "a-directory", "is a directory; give the profile file's name"),
        ([], "/proc/self/profile.json", "cannot write in /proc/self (permission denied)"),
    ],
)
def test_calibrate_refuses_bad_arguments_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], out: str, said: str
) -> None:
    """Checked before half a minute of measuring; nothing written. (/proc/self is a place not
    even root may write in.)"""
    (tmp_path / "a-directory").mkdir()
    before = sorted(tmp_path.iterdir())
    target = tmp_path / out
    assert _cli.main(["calibrate", "--quick", "--out", str(target), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing measured
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert said in lines[0]
    assert sorted(tmp_path.iterdir()) == before


def test_a_saturation_outside_the_measured_rates_is_a_note_not_a_line() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    outside = _chart.saturation_mark(ax, 50_000.0, [1000.0, 8000.0], "C0", "timeout x1")
    assert outside == (
        "timeout x1: saturation ~50,000/s, beyond the highest rate measured (no line drawn)"
    )
    assert not ax.lines
    assert _chart.saturation_mark(ax, 5000.0, [1000.0, 8000.0], "C0", "timeout x1") is None
    (line,) = ax.lines
    xy: Any = line.get_xydata()
    assert xy[0][0] == 5000.0  # a vertical line at the rate
    plt.close(fig)


def test_load_chart_is_written(tmp_path: Path) -> None:
    rows = [
        summary_row(i, timeout_scale=scale, rate_scale=rate, utilisation=rate / 40)
        | {"missed": 200, "lateness_p99": 0.001, "pass_lateness_p99": 0.0005}
        for i, (scale, rate) in enumerate((s, r) for s in (1.0, 2.0) for r in (1.0, 8.0))
    ]
    _chart.load_chart(rows, str(tmp_path / "load.png"), 1000.0, "a load sweep")
    assert (tmp_path / "load.png").read_bytes()[:4] == b"\x89PNG"


# -- analyze --follow, before Spark ---------------------------------------------------------


def follow_args(tmp_path: Path, *more: object) -> list[object]:
    (tmp_path / "events").mkdir(exist_ok=True)
    return ["analyze", "--follow", "--log", tmp_path / "events", "--out", tmp_path / "live", *more]


@pytest.mark.parametrize(
    ("more", "said"),
    [
        ((), "--follow needs --checkpoint DIR"),
        (("--checkpoint", "c", "--since", "2026-11-24"), "--since is not an option of --follow"),
        (("--checkpoint", "c", "--overwrite"), "--overwrite is not an option of --follow"),
        (("--checkpoint", "c", "--watermark", "-1"), "--watermark must be a finite number"),
        (("--checkpoint", "c", "--interval", "0"), "--interval must be a finite number"),
        (("--checkpoint", "c", "--window", "nan"), "--window must be a finite number"),
        (("--checkpoint", "c", "--stuck", "--grace", "-1"), "--grace must be a finite number"),
        (("--checkpoint", "c", "--stuck", "--tick", "inf"), "--tick must be a finite number"),
    ],
)
def test_follow_options_are_checked_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], more: tuple[str, ...], said: str
) -> None:
    more = tuple(str(tmp_path / m) if m == "c" else m for m in more)
    fails(follow_args(tmp_path, *more), capsys, said)


@pytest.mark.parametrize("option", ["--checkpoint", "--once", "--state-partitions"])
def test_follow_options_need_follow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "a.jsonl").write_text("{}\n")
    values: dict[str, list[object]] = {
        "--checkpoint": [tmp_path / "c"],
        "--state-partitions": ["2"],
    }
    value = values.get(option, [])
    argv = ["analyze", "--log", tmp_path / "events", "--out", tmp_path / "o", option, *value]
    fails(argv, capsys, f"{option} is an option of --follow")


@pytest.mark.parametrize(
    ("more", "said"),
    [
        (("--grace", "0.5"), "--grace is an option of --stuck"),
        (("--stuck", "--since", "2026-11-24"), "--stuck reads every record: not with --since"),
        (("--stuck", "--grace", "nan"), "--grace must be a finite number of seconds >= 0"),
    ],
)
def test_batch_stuck_options_are_checked_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], more: tuple[str, ...], said: str
) -> None:
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "a.jsonl").write_text("{}\n")
    argv = ["analyze", "--log", tmp_path / "events", "--out", tmp_path / "o", *more]
    fails(argv, capsys, said)


def test_follow_paths_are_checked_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = tmp_path / "checkpoint"
    line = fails(
        ["analyze", "--follow", "--log", tmp_path / "nope", "--out", tmp_path / "o",
         "--checkpoint", checkpoint],
        capsys,
    )  # fmt: skip
    assert "no such directory (--follow reads the files published into a directory)" in line
    for out, ck, other in (
        (tmp_path / "events" / "live", checkpoint, "input"),
        (tmp_path / "live", tmp_path / "live" / "ck", "output"),
    ):
        line = fails([*follow_args(tmp_path)[:5], out, "--checkpoint", ck], capsys)
        assert f"overlaps the {other}" in line


def test_a_checkpoint_keeps_its_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint's state is windows of one length: resuming with another is refused."""
    checkpoint = tmp_path / "checkpoint"
    _checks.check_checkpoint(str(checkpoint), {"window": 60.0, "watermark": 120.0})
    _checks.check_checkpoint(str(checkpoint), {"window": 60.0, "watermark": 30.0})
    line = fails(
        follow_args(tmp_path, "--checkpoint", checkpoint, "--window", "10"), capsys, checkpoint
    )
    assert "holds windows of 60.0 s, not 10.0: resume with --window 60.0" in line


# -- --remote, as pyspark takes it --------------------------------------------------------------


def test_remote_is_spark_connect_as_pyspark_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    assert _checks.connect_url(None, "sc://spark-host:15002") == "sc://spark-host:15002"
    assert _checks.connect_url("local[2]", None) is None
    assert _checks.connect_url(None, "local[2]") == "local[2]"  # a server started here
    assert _checks.files_here(None, "local[2]")
    assert _checks.files_here(None, "sc://127.0.0.1:15002")
    assert not _checks.files_here(None, "sc://spark-host:15002")
    parser = _cli.build_parser()
    args = parser.parse_args(["generate", "--out", "t", "--remote", "sc://h:1"])
    assert (args.master, args.remote) == (None, "sc://h:1")


def test_master_and_remote_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        _cli.main(["generate", "--out", "t", "--master", "local[2]", "--remote", "sc://h:1"])
    assert exit_.value.code == 2
    assert "not allowed with argument --master" in capsys.readouterr().err


def test_remote_reaches_the_session(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``--remote`` goes to `get_session` as its own argument (not as a classic master)."""
    seen: dict[str, Any] = {}

    def session(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs, master=args[0])
        raise RuntimeError("no Spark here")

    monkeypatch.setattr(_spark, "get_session", session)
    assert _cli.main(["generate", "--out", str(tmp_path / "t"), "--remote", "local[2]"]) == 1
    assert (seen["master"], seen["remote"]) == (None, "local[2]")


# -- Spark's start, checked before it: one line within seconds, no JVM -------------------------


def test_a_misspelt_master(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = fails(["generate", "--out", tmp_path / "t", "--master", "locl[2]"], capsys, "locl[2]")
    assert "not a master URL Spark knows" in line
    for good in ("local", "local[*]", "local[2]", "local[2,3]", "spark://h:7077", "yarn"):
        _checks.check_master(good)


def test_a_bad_local_remote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = fails(["generate", "--out", tmp_path / "t", "--remote", "locl[2]"], capsys, "locl[2]")
    assert "not a Spark Connect URL" in line


def test_a_java_home_without_java(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Spark's launcher takes JAVA_HOME's java even with a good one on PATH."""
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    line = fails(["generate", "--out", tmp_path / "t"], capsys, tmp_path / "no-jdk")
    assert "has no bin/java" in line


def test_a_java_too_old(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    line = fails(["generate", "--out", tmp_path / "t"], capsys, tmp_path / "jdk")
    assert "is Java 11: Spark needs Java 17 or later" in line


def test_no_java_at_all(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    fails(["generate", "--out", tmp_path / "t"], capsys, "Java not found")


def test_the_java_here_passes() -> None:
    """The one the tests' Spark runs (a release number read from its ``-version``)."""
    assert os.access(_checks.check_java(), os.X_OK)


def reserved_port() -> socket.socket:
    """A loopback port bound but not listening: a connection to it is refused."""
    reserved = socket.socket()
    reserved.bind(("127.0.0.1", 0))
    return reserved


def test_no_connect_server_at_the_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """pyspark's client retried this for minutes without a word."""
    with reserved_port() as reserved:
        port = reserved.getsockname()[1]
        started = time.monotonic()
        line = fails(
            ["generate", "--out", tmp_path / "t", "--remote", f"sc://127.0.0.1:{port}"],
            capsys,
            f"no Spark Connect server at 127.0.0.1:{port} (connection refused)",
        )
        assert time.monotonic() - started < 60  # (refused at once; generous for a busy host)
    assert "--remote" in line
    nowhere = ["generate", "--out", tmp_path / "t", "--remote", "sc://no-such-host.invalid"]
    fails(nowhere, capsys, "no Spark Connect server at no-such-host.invalid:15002 (unknown host")


def test_a_busy_port_for_a_local_connect_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Spark said this in a 47-line BindException, after the JVM had started."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["generate", "--out", tmp_path / "t", "--remote", "local[2]"]
        line = fails(
            [*argv, "--conf", f"spark.connect.grpc.binding.port={port}"],
            capsys,
            f"cannot start a Spark Connect server on 127.0.0.1:{port}: address already in use",
        )
    assert "drop --conf spark.connect.grpc.binding.port" in line


def test_start_errors_in_a_process_of_its_own(tmp_path: Path) -> None:
    """As a user sees them: one line on stderr, exit status 2, and no JVM (the process is
    done long before one could have started)."""
    with reserved_port() as reserved:
        cases = [
            (["--remote", f"sc://localhost:{reserved.getsockname()[1]}"], {}, "connection refused"),
            (["--master", "locl[2]"], {}, "not a master URL"),
            ([], {"JAVA_HOME": str(tmp_path / "nope")}, "has no bin/java"),
        ]
        for where, env, said in cases:
            started = time.monotonic()
            done = run_process(
                sys.executable, "-m", "purgatory.pipeline", "generate", "--out",
                tmp_path / "t", *where, cwd=tmp_path, env={**os.environ, **env}, timeout=120,
            )  # fmt: skip
            assert time.monotonic() - started < 60, said
            assert done.returncode == 2, done.stderr
            (line,) = done.stderr.splitlines()
            assert said in line, line
            assert not (tmp_path / "t").exists()


def test_a_jvm_that_dies_at_its_start_is_named_by_its_cause() -> None:
    """spark-submit's and the JVM's own words, as `JvmStartError` takes its first line."""
    cause = _spark._cause
    said = [
        "Unrecognized VM option 'NoSuchOption'",
        "Error: Could not create the Java Virtual Machine.",
        "Error: A fatal exception has occurred. Program will exit.",
    ]
    assert cause(said) == "Unrecognized VM option 'NoSuchOption'"
    said = [
        'Exception in thread "main" org.apache.spark.SparkException: Master must either be '
        "yarn or start with spark, k8s, or local",
        "\tat org.apache.spark.deploy.SparkSubmit.error(SparkSubmit.scala:1)",
    ]
    assert cause(said).startswith("org.apache.spark.SparkException: Master must either be")
    heap = ["Error occurred during initialization of VM", "Too small maximum heap"]
    assert cause(heap) == "Error occurred during initialization of VM: Too small maximum heap"
    assert "said nothing" in cause([])
    error = _spark.JvmStartError(said)
    assert _cli.one_line(error).startswith(
        "JvmStartError: Spark's JVM exited at its start: org.apache.spark.SparkException"
    )
    assert "SparkSubmit.scala" in str(error)  # all it said, for --verbose


# -- event logs whose edges show they are damaged: before Spark ---------------------------------


def recorded(directory: Path) -> tuple[Path, Path]:
    """A JSON Lines and an Arrow event log of a few operations in `directory`."""
    record_at(directory, "p", BASE_UTC, 30)
    record_at(directory, "q", BASE_UTC, 30, recorder=ArrowEventLog)
    return next(directory.glob("*.jsonl")), next(directory.glob("*.arrows"))


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("jsonl cut", "last line: not JSON"),
        ("jsonl garbage", "line 1: not JSON"),
        ("arrows cut", "unreadable Arrow stream (Expected to be able to read"),
        ("arrows garbage", "unreadable Arrow stream"),
    ],
)
def test_a_damaged_event_log_is_named_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, said: str
) -> None:
    jsonl, arrows = recorded(tmp_path / "events")
    argv = ["analyze", "--log", tmp_path / "events", "--out", tmp_path / "o"]
    _checks.check_event_logs(str(tmp_path / "events"))  # whole: they pass
    file = jsonl if damage.startswith("jsonl") else arrows
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 50] if damage.endswith("cut") else b"\x00garbage\n" + data)
    fails(argv, capsys, file, said)
    generate = ["generate", "--from-log", tmp_path / "events", "--out", tmp_path / "t"]
    fails(generate, capsys, file, said)


def test_a_jvm_that_dies_at_its_start_says_why_in_one_line(tmp_path: Path) -> None:
    """Through pyspark's real launch (spark-submit's scripts), a java that passes the check
    (``-version``: 17) but dies at its start, as a JVM that cannot reserve its heap does: its
    stderr was dropped, leaving "Java gateway process exited before sending its port number"."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -version ]; then echo \'openjdk version "17.0.9"\' >&2; exit 0; fi\n'
        "echo 'Error occurred during initialization of VM' >&2\n"
        "echo 'Could not reserve enough space for object heap' >&2\n"
        "exit 1\n"
    )
    java.chmod(0o755)
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "jdk")}
    env.pop("SPARK_REMOTE", None)
    started = time.monotonic()
    done = run_process(
        sys.executable, "-m", "purgatory.pipeline", "generate", "--out", tmp_path / "t",
        cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert time.monotonic() - started < 120
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "purgatory.pipeline generate: error: JvmStartError: Spark's JVM exited at its start: "
        "Error occurred during initialization of VM: Could not reserve enough space for object "
        "heap (--verbose shows the full trace)"
    ]
