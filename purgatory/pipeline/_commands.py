"""The commands: one table (`COMMANDS`) of a name, its options and a small run function each.

A run function checks what needs no Spark first (`purgatory.pipeline._checks`: the extra, the
settings, local paths, a cost profile), then starts a session, runs its job and prints what it
found. Spark and the jobs are imported only there, so parsing and ``--help`` need neither.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._checks import (
    EXTRA_MODULES,
    InputError,
    check_apart,
    check_checkpoint,
    check_configs,
    check_directory,
    check_event_logs,
    check_output,
    check_spark_start,
    check_trace,
    connect_url,
    files_here,
    local_path,
    missing_extra,
)
from ._load import MAX_COST, CostProfile, load_profile
from ._options import (
    W1_DEFAULTS,
    add_common,
    add_grid,
    add_w1,
    grid_of,
    positive_int,
    utc_time,
    w1_of,
)
from ._tables import (
    ANALYSIS_COLUMNS,
    KEY_COLUMNS,
    STUCK_COLUMNS,
    WINDOW_COLUMNS,
    print_replay_summary,
    print_table,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ._replay import ReplayConfig

__all__ = ("COMMANDS", "Command")


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand: its name, a one-line summary, examples, its options and what it runs."""

    name: str
    summary: str
    examples: tuple[str, ...]
    options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    spark: bool = True


# -- what every Spark command does ------------------------------------------------------------


def _need(*modules: str) -> None:
    """Refuse to go on without the Spark extra (and `modules`), saying what to install."""
    missing = missing_extra((*EXTRA_MODULES, *modules))
    if missing:
        raise InputError(missing)


def _paths(args: argparse.Namespace, *names: str) -> bool:
    """Whether this machine's files are the jobs' (`files_here`): then the path options
    `names` are checked here, and for a Spark Connect server on this machine made absolute
    (the server resolves a relative path against its own working directory)."""
    here = files_here(args.master, args.remote)
    args.given = {}
    if here and connect_url(args.master, args.remote) is not None:
        for name in names:
            value = getattr(args, name)
            if value and "://" not in value and not value.startswith("file:"):
                args.given[os.path.abspath(value)] = value
                setattr(args, name, os.path.abspath(value))
    return here


def _shown(args: argparse.Namespace, path: str) -> str:
    """`path` as the user typed it (before `_paths` made it absolute)."""
    given: dict[str, str] = getattr(args, "given", {})
    for absolute, typed in given.items():
        if path == absolute or path.startswith(absolute.rstrip("/") + "/"):
            return typed.rstrip("/") + path[len(absolute.rstrip("/")) :]
    return path


def _session(args: argparse.Namespace) -> SparkSession:
    """The command's session, once what it needs has been checked (`check_spark_start`); Ctrl-C
    then stops its job without a trace (`stop_on_interrupt`)."""
    check_spark_start(args.master, args.remote, dict(args.conf))
    from ._spark import get_session, quiet, stop_on_interrupt

    spark = get_session(
        args.master,
        f"purgatory-pipeline-{args.command}",
        dict(args.conf),
        ui=args.ui,
        remote=args.remote,
    )
    if not args.verbose:
        # Spark logs a failed task's traces itself, before the driver sees the error.
        quiet(spark, "FATAL")
    stop_on_interrupt(spark)
    return spark


def _costs(args: argparse.Namespace) -> CostProfile | None:
    return load_profile(args.cost_profile) if args.cost_profile else None


def _grid_and_costs(
    args: argparse.Namespace, timeout: float | None
) -> tuple[list[ReplayConfig], CostProfile | None]:
    configs = grid_of(args)
    check_configs(configs, timeout)
    return configs, _costs(args)


def _since(started: float) -> str:
    return f"{time.perf_counter() - started:.1f} s"


def _replayed(
    args: argparse.Namespace,
    spark: SparkSession,
    trace: str,
    out: str,
    grid: tuple[list[ReplayConfig], CostProfile | None],
) -> list[dict[str, Any]]:
    """Replay `trace` into `out` as the options say; print the summary; return its rows."""
    from ._job_replay import replay

    configs, costs = grid
    summary = replay(
        spark,
        trace,
        out,
        configs,
        event_log=args.event_log,
        partitions=args.partitions,
        overwrite=args.overwrite,
        costs=costs,
        operations=not args.summary_only,
        shards=getattr(args, "shards", 1),
        warmup=getattr(args, "warmup", 0.0),
        read=getattr(args, "read", "auto"),
    )
    rows = [row.asDict() for row in summary.collect()]
    print_replay_summary(rows, costs)
    return rows


def _done(args: argparse.Namespace, out: str, rows: Sequence[Mapping[str, Any]], t: float) -> None:
    ops = sum(row["operations"] for row in rows)
    print(f"\nreplay in {_shown(args, out)}: {ops:,} operations replayed in {_since(t)}")
    if args.verbose:
        import purgatory

        # Where the driver found the package: a zip under spark-submit --py-files, for instance.
        print(f"purgatory package: {os.path.dirname(purgatory.__file__)}")


# -- generate ---------------------------------------------------------------------------------


def _generate_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="trace directory (Parquet)")
    parser.add_argument(
        "--from-log",
        default=None,
        help="make the trace from the event logs (*.jsonl, *.arrows) here",
    )
    add_w1(parser, int(W1_DEFAULTS["operations"]))
    add_common(parser)


def run_generate(args: argparse.Namespace) -> int:
    """``generate``: a seeded W1 trace, or a trace from event logs."""
    _need()
    w1 = None if args.from_log else w1_of(args)
    if _paths(args, "out", "from_log"):
        if args.from_log:
            check_event_logs(args.from_log)
        check_output(
            args.out, overwrite=args.overwrite, inputs=[args.from_log] if args.from_log else []
        )
    spark = _session(args)
    from ._job_trace import generate, trace_from_log

    started = time.perf_counter()
    if w1 is None:
        rows = trace_from_log(spark, args.from_log, args.out, overwrite=args.overwrite)
    else:
        rows = generate(spark, w1, args.out, overwrite=args.overwrite)
    print(f"trace: {rows} operations in {_shown(args, args.out)} ({_since(started)})")
    return 0


# -- replay -----------------------------------------------------------------------------------


def _replay_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="trace: a Parquet file or directory")
    parser.add_argument("--out", required=True, help="output directory: summary/, operations/")
    add_grid(parser, "1", "1")
    add_common(parser)


def run_replay(args: argparse.Namespace) -> int:
    """``replay``: a trace over a configuration grid."""
    _need()
    grid = _grid_and_costs(args, None)
    if _paths(args, "trace", "out", "event_log"):
        if args.event_log:
            check_directory(args.event_log, "event-log directory")
            check_apart(
                args.event_log, "event-log directory", [("input", args.trace), ("output", args.out)]
            )
        check_trace(args.trace)
        check_output(args.out, overwrite=args.overwrite, inputs=[args.trace])
    spark = _session(args)
    started = time.perf_counter()
    rows = _replayed(args, spark, args.trace, args.out, grid)
    _done(args, args.out, rows, started)
    return 0


# -- analyze ----------------------------------------------------------------------------------


def _analyze_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", required=True, help="directory of event logs (*.jsonl, *.arrows)")
    parser.add_argument("--out", required=True, help="output: summary/ keys/ windows/ waits/")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per time window")
    for name, edge in (("--since", "from"), ("--until", "before")):
        parser.add_argument(
            name,
            type=utc_time,
            default=None,
            help=f"only operations watched {edge} this ISO-8601 time (naive: UTC); "
            "needs logs with a UTC anchor",
        )
    live = parser.add_argument_group(
        "following a directory that recorders keep writing (Structured Streaming)"
    )
    live.add_argument(
        "--follow",
        action="store_true",
        help="keep OUT/windows/ up to date as event logs are published into --log, until "
        "stopped (Ctrl-C); needs --checkpoint",
    )
    live.add_argument(
        "--checkpoint",
        default=None,
        help="the stream's checkpoint directory: a job started again with it resumes where it "
        "stopped, no window counted twice or lost",
    )
    live.add_argument(
        "--watermark",
        type=float,
        default=120.0,
        metavar="S",
        help="a window is written once the newest window read ends S seconds after it; "
        "operations of a window already written are dropped (and counted)",
    )
    live.add_argument(
        "--interval", type=float, default=10.0, metavar="S", help="seconds between batches"
    )
    live.add_argument(
        "--state-partitions",
        type=positive_int,
        default=None,
        metavar="N",
        help="partitions of the open windows' state, a task each per batch (default: the "
        "shuffle partitions, at most 8; a checkpoint keeps its own)",
    )
    live.add_argument(
        "--stuck",
        action="store_true",
        help="also report, into OUT/stuck/, the operations whose end has not come by their "
        "deadline plus --grace (logs of recorders made with watch_records=True); without "
        "--follow, those of every record read, once the newest is --watermark S past it",
    )
    live.add_argument(
        "--grace",
        type=float,
        default=None,
        metavar="S",
        help="seconds past its deadline an operation may end unreported (default: the "
        "checkpoint's, else 4 ticks plus the p99 lateness of the expired operations already "
        "logged, measured once and kept in the checkpoint)",
    )
    live.add_argument(
        "--tick",
        type=float,
        default=0.001,
        metavar="S",
        help="the purgatories' tick (4 of them in the grace when --grace is not given)",
    )
    live.add_argument(
        "--once",
        action="store_true",
        help="read what is there now, write what it completes, and exit (for a scheduler)",
    )
    add_common(parser)


def _check_window(args: argparse.Namespace) -> None:
    if not (args.window > 0 and math.isfinite(args.window)):
        raise InputError(f"--window must be a finite number of seconds > 0, got {args.window!r}")


def run_analyze(args: argparse.Namespace) -> int:
    """``analyze``: summaries of recorded event logs (``--follow``: windows, kept up to date)."""
    _need()
    _check_window(args)
    if args.follow:
        return _run_follow(args)
    given = [
        name
        for name in ("checkpoint", "once", "state_partitions")
        if getattr(args, name) not in (None, False)
    ]
    if args.grace is not None and not args.stuck:
        raise InputError("--grace is an option of --stuck")
    _check_stuck(args)
    if args.stuck and (args.since is not None or args.until is not None):
        raise InputError(
            "--stuck reads every record: not with --since or --until (a range would part "
            "watches from their ends)"
        )
    if given:
        raise InputError(f"--{given[0].replace('_', '-')} is an option of --follow")
    if _paths(args, "log", "out"):
        check_event_logs(args.log)
        check_output(args.out, overwrite=args.overwrite, inputs=[args.log])
    spark = _session(args)
    from ._job_eventlog import analyze
    from ._job_trace import read_parquet

    started = time.perf_counter()
    summary = analyze(
        spark,
        args.log,
        args.out,
        window=args.window,
        since=args.since,
        until=args.until,
        overwrite=args.overwrite,
        stuck=args.stuck,
        grace=args.grace,
        tick=args.tick,
        watermark=args.watermark,
    )
    print_table([row.asDict() for row in summary.collect()], ANALYSIS_COLUMNS)
    keys = read_parquet(spark, f"{args.out}/keys").orderBy("peak_waiters", ascending=False)
    print("\nkeys with the most waiters:")
    print_table([row.asDict() for row in keys.limit(10).collect()], KEY_COLUMNS)
    if args.stuck:
        stuck = read_parquet(spark, f"{args.out}/stuck").orderBy("purgatory", "deadline_utc")
        found = [row.asDict() for row in stuck.collect()]
        print(f"\nstuck operations ({len(found)}): watched, no end by deadline + grace")
        if found:
            print_table(found, STUCK_COLUMNS)
    windows = read_parquet(spark, f"{args.out}/windows")
    if windows.where(windows["time_base"] == "clock").limit(1).count():
        print("\nwindows: in seconds of the purgatory's clock for logs without a UTC anchor")
    print(f"\nanalysis in {_shown(args, args.out)} ({_since(started)})")
    return 0


def _check_stuck(args: argparse.Namespace) -> None:
    for name in ("grace", "tick", "watermark"):
        value = getattr(args, name)
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise InputError(f"--{name} must be a finite number of seconds >= 0, got {value!r}")


def _check_follow(args: argparse.Namespace) -> None:
    """What ``--follow`` needs, checked before Spark starts."""
    if args.checkpoint is None:
        raise InputError("--follow needs --checkpoint DIR (where the stream keeps its progress)")
    for name in ("since", "until"):
        if getattr(args, name) is not None:
            raise InputError(f"--{name} is not an option of --follow (it reads what comes)")
    if args.overwrite:
        raise InputError(
            "--overwrite is not an option of --follow: a job resumes from its checkpoint; give "
            "a new --out and --checkpoint to start over"
        )
    if not (args.watermark >= 0 and math.isfinite(args.watermark)):
        raise InputError(
            f"--watermark must be a finite number of seconds >= 0, got {args.watermark!r}"
        )
    if not (args.interval > 0 and math.isfinite(args.interval)):
        raise InputError(
            f"--interval must be a finite number of seconds > 0, got {args.interval!r}"
        )
    _check_stuck(args)
    if _paths(args, "log", "out", "checkpoint"):
        local = local_path(args.log)
        if local is not None and not os.path.isdir(local):
            what = "not a directory" if os.path.exists(local) else "no such directory"
            raise InputError(
                f"--log {args.log}: {what} (--follow reads the files published into a directory)"
            )
        check_apart(args.out, "output", [("input", args.log)])
        check_apart(args.checkpoint, "checkpoint", [("input", args.log), ("output", args.out)])
        check_directory(args.out, "output")
        check_directory(args.checkpoint, "checkpoint")
        check_checkpoint(args.checkpoint, {"window": args.window, "watermark": args.watermark})


def _run_follow(args: argparse.Namespace) -> int:
    _check_follow(args)
    spark = _session(args)
    from ._job_follow import follow

    windows = _shown(args, args.out).rstrip("/") + "/windows/"
    print(
        f"following {_shown(args, args.log)}: {args.window:g} s windows into {windows}, each "
        f"written once the newest window read ends {args.watermark:g} s after it"
        + (" (what is there now, then exit)" if args.once else ""),
        flush=True,
    )
    started = time.perf_counter()
    last: dict[str, Any] = {}

    def report(progress: dict[str, Any], written: list[dict[str, Any]] | None) -> None:
        last.update(progress)
        print(_batch_line(progress, written), flush=True)
        if written is not None:
            print_table(written, WINDOW_COLUMNS)
            sys.stdout.flush()

    stuck_count = [0, 0]

    def report_stuck(progress: dict[str, Any], written: list[dict[str, Any]] | None) -> None:
        if written:
            for row in written:
                stuck_count[row["status"] != "stuck"] += 1
            print(f"stuck batch {progress['batchId']}: {len(written)} reports", flush=True)
            print_table(written, STUCK_COLUMNS)
            sys.stdout.flush()

    grace = follow(
        spark,
        args.log,
        args.out,
        args.checkpoint,
        window=args.window,
        watermark=args.watermark,
        once=args.once,
        interval=args.interval,
        report=report,
        partitions=args.state_partitions,
        stuck=args.stuck,
        grace=args.grace,
        tick=args.tick,
        report_stuck=report_stuck,
    )
    if grace is not None:
        print(
            f"\nstuck operations in {_shown(args, args.out).rstrip('/')}/stuck/: "
            f"{stuck_count[0]} reported (no end by deadline + {grace:.3g} s), "
            f"{stuck_count[1]} of them ended since (late_end)"
        )
    state = (last.get("stateOperators") or [{}])[0].get("numRowsTotal", 0)
    print(
        f"\nwindows in {windows} ({_since(started)}); {state} still open: written once the "
        "watermark passes them"
    )
    return 0


def _batch_line(progress: Mapping[str, Any], written: Sequence[Any] | None) -> str:
    """One line per micro-batch: what it read, wrote and dropped, and the watermark."""
    state = (progress.get("stateOperators") or [{}])[0]
    late = state.get("numRowsDroppedByWatermark", 0)
    watermark = progress.get("eventTime", {}).get("watermark", "")
    line = f"batch {progress['batchId']}: {progress.get('numInputRows', 0):,} operations read"
    line += f", {len(written)} windows written" if written else ", no window complete"
    if late:  # (Spark counts what it drops after a first aggregation: per window and task)
        line += f", late operations dropped in {late:,} windows already written (raise --watermark)"
    if watermark and not watermark.startswith("1970-01-01"):
        line += f"; watermark {watermark}"
    return line


# -- sweep ------------------------------------------------------------------------------------


def _sweep_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory: trace/, replay/, sweep.png")
    add_w1(parser, 20_000)
    add_grid(parser, "0.5,1,2", "1,2,4")
    add_common(parser)


def run_sweep(args: argparse.Namespace) -> int:
    """``sweep``: generate, replay a grid, print the summary, chart it."""
    _need("matplotlib")
    w1 = w1_of(args)
    grid = _grid_and_costs(args, w1.timeout)
    costs = grid[1]
    if _paths(args, "out", "event_log"):
        out = args.out.rstrip("/")
        if args.event_log:
            check_directory(args.event_log, "event-log directory")
            check_apart(
                args.event_log,
                "event-log directory",
                [("output", f"{out}/trace"), ("output", f"{out}/replay")],
            )
        check_directory(out, "output")
        check_output(f"{out}/trace", overwrite=args.overwrite)
        check_output(f"{out}/replay", overwrite=args.overwrite)
    out = args.out.rstrip("/")
    spark = _session(args)
    from ._chart import load_chart, sweep_chart
    from ._job_trace import generate

    started = time.perf_counter()
    rows = generate(spark, w1, f"{out}/trace", overwrite=args.overwrite)
    print(f"trace: {rows} operations ({_since(started)})")
    summary = _replayed(args, spark, f"{out}/trace", f"{out}/replay", grid)
    local = "://" not in out
    title = (
        f"W1 sweep: {w1.purgatories} purgatories x {w1.operations:,} operations, "
        f"timeout {w1.timeout * 1000:g} ms, latency p50/p75 {w1.p50 * 1000:g}/{w1.p75 * 1000:g} ms"
    )
    sweep_chart(summary, f"{out}/sweep.png" if local else "sweep.png", title)
    print(f"chart: {_shown(args, out)}/sweep.png" if local else "chart: sweep.png")
    if costs is not None:
        load_chart(
            summary,
            f"{out}/load.png" if local else "load.png",
            w1.rate,
            f"Load model ({costs.loop} loop): W1, {w1.purgatories} purgatories, one core each",
        )
        print(f"load chart: {_shown(args, out)}/load.png" if local else "load chart: load.png")
    _done(args, f"{out}/replay", summary, started)
    return 0


# -- calibrate --------------------------------------------------------------------------------


def _calibrate_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", required=True, metavar="PROFILE.json", help="profile file to write"
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop to measure on",
    )
    parser.add_argument("--quick", action="store_true", help="a rough profile in a few seconds")
    parser.add_argument("--verbose", action="store_true", help="on an error, show the full trace")
    parser.add_argument(
        "--application-cost",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help=f"the application's own CPU seconds per operation, added to every arrival "
        f"(at most {MAX_COST:g})",
    )
    parser.add_argument(
        "--application-condition-cost",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the application's own CPU seconds per condition callback (scheduling it while "
        "its operation waits, and serving it), added to every condition that fires "
        f"(at most {MAX_COST:g})",
    )


def check_profile_output(path: str) -> None:
    """Check, before measuring, that a profile can be written at `path` (a file, replaced).

    Raises:
        InputError: `path` is a directory, an existing file that cannot be written, or in a
            directory that does not exist or cannot be written.
    """
    if os.path.isdir(path):
        raise InputError(f"--out {path}: is a directory; give the profile file's name")
    if os.path.lexists(path) and not os.access(path, os.W_OK):
        raise InputError(f"--out {path}: cannot replace it (permission denied)")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise InputError(f"--out {path}: no directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out {path}: cannot write in {parent} (permission denied)")


def run_calibrate(args: argparse.Namespace) -> int:
    """``calibrate``: measure a cost profile for the load model (no Spark)."""
    from ._calibrate import calibrate
    from ._load import save_profile

    # What can fail after half a minute of measuring is checked before it.
    for flag, value in (
        ("--application-cost", args.application_cost),
        ("--application-condition-cost", args.application_condition_cost),
    ):
        if not 0 <= value <= MAX_COST:
            raise InputError(
                f"{flag} must be a number of seconds in [0, {MAX_COST:g}], got {value!r}"
            )
    if args.loop == "uvloop" and missing_extra(("uvloop",)):
        raise InputError("--loop uvloop needs uvloop: pip install 'asyncio-purgatory[uvloop]'")
    check_profile_output(args.out)
    started = time.perf_counter()
    profile = calibrate(
        args.loop,
        quick=args.quick,
        application=args.application_cost,
        application_condition=args.application_condition_cost,
        progress=lambda name: print(f"measuring {name} ...", flush=True),
    )
    save_profile(profile, args.out)
    print(f"profile: {profile.describe()}")
    print(f"written to {args.out} ({_since(started)})")
    return 0


COMMANDS: tuple[Command, ...] = (
    Command(
        "generate",
        "write a seeded W1 trace, or a trace from event logs",
        (
            "generate --out trace/",
            "generate --out trace/ --purgatories 8 --operations 1000000 --timeout 0.5",
            "generate --from-log events/ --out night/",
        ),
        _generate_options,
        run_generate,
    ),
    Command(
        "replay",
        "replay a trace over a configuration grid",
        (
            "replay --trace trace/ --out replay/",
            "replay --trace trace/ --out replay/ --tick 0.001,0.01 --rate-scale 1,2 "
            "--event-log events/",
            "replay --trace /data/trace --out /data/replay --master sc://spark-host:15002",
        ),
        _replay_options,
        run_replay,
    ),
    Command(
        "analyze",
        "summaries of recorded event logs",
        (
            "analyze --log events/ --out analysis/",
            "analyze --log events/ --out analysis/ --window 1",
            "analyze --follow --log events/ --out live/ --checkpoint live-checkpoint/",
            "analyze --follow --once --log events/ --out live/ --checkpoint live-checkpoint/",
        ),
        _analyze_options,
        run_analyze,
    ),
    Command(
        "sweep",
        "generate, replay a grid, print the summary, chart it",
        (
            "sweep --out sweep/",
            "sweep --out sweep/ --operations 100000 --timeout-scale 0.5,1,2 --rate-scale 1,2,4",
        ),
        _sweep_options,
        run_sweep,
    ),
    Command(
        "calibrate",
        "measure a cost profile for the load model (no Spark needed)",
        ("calibrate --out profile.json", "calibrate --out quick.json --quick"),
        _calibrate_options,
        run_calibrate,
        spark=False,
    ),
)
