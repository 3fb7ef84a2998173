"""The command line: ``python -m purgatory.pipeline generate | replay | analyze | sweep``, and
``calibrate``, which measures a cost profile for the load model without Spark.

Parsing imports neither Spark nor numpy nor pyarrow, so ``--help`` works (and says what to
install) without the Spark extra. A command then checks its paths and settings
(`purgatory.pipeline._checks`) before it starts a Spark session, and any error ends in one line
on stderr: exit status 2 for bad input, 1 for anything else; ``--verbose`` shows the full trace.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from ._checks import (
    EXTRA_MODULES,
    InputError,
    check_apart,
    check_configs,
    check_directory,
    check_event_logs,
    check_output,
    check_trace,
    missing_extra,
)
from ._load import CostProfile, load_profile

if TYPE_CHECKING:
    from ._generate import W1
    from ._replay import ReplayConfig

__all__ = ("build_parser", "main", "one_line")

#: `purgatory.pipeline.W1`'s defaults, written out so that parsing needs no numpy (a test checks
#: that they agree).
W1_DEFAULTS: Final = {
    "purgatories": 4,
    "operations": 100_000,
    "rate": 1000.0,
    "timeout": 0.2,
    "p50": 0.02,
    "p75": 0.06,
    "keys": 100,
    "keys_per_op": 3,
    "key_skew": 0.0,
    "never": 0.0,
    "seed": 1,
    "chunk": 200_000,
}
#: `purgatory.pipeline.ReplayConfig`'s defaults, as comma lists (checked by the same test).
GRID_DEFAULTS: Final = {"tick": "0.001", "wheel_size": "1024", "purge_interval": "1000"}
_PROG: Final = "python -m purgatory.pipeline"


def _floats(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one number, got {text!r}")
    return values


def _ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one integer, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (none for flags and required options); keeps the examples."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            action.required
            or action.default in (None, False, argparse.SUPPRESS)
            or "%(default)" in text
        ):
            return text
        return f"{text} (default: %(default)s)".strip()


def _requirements() -> str:
    missing = missing_extra((*EXTRA_MODULES, "matplotlib"))
    lines = [
        "Needs the Spark extra and Java 17 or later: pip install 'asyncio-purgatory[spark]'.",
    ]
    if missing:
        lines.append(f"Not installed here: {missing.split(' (', 1)[1].split(')', 1)[0]}.")
    return "\n".join(lines)


def _examples(*commands: str) -> str:
    return "examples:\n" + "\n".join(f"  {_PROG} {command}" for command in commands)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master (default local[*]; ignored under spark-submit, which sets it)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="on an error, show the full Python and JVM traces, and keep Spark's warnings",
    )


def _add_w1(parser: argparse.ArgumentParser, operations: int) -> None:
    w = W1_DEFAULTS
    group = parser.add_argument_group("W1 trace (Kafka's TestPurgatoryPerformance model)")
    group.add_argument(
        "--purgatories", type=_positive_int, default=w["purgatories"], help="purgatories"
    )
    group.add_argument(
        "--operations", type=_positive_int, default=operations, help="operations per purgatory"
    )
    group.add_argument("--rate", type=float, default=w["rate"], help="arrivals/s per purgatory")
    group.add_argument("--timeout", type=float, default=w["timeout"], help="seconds")
    group.add_argument("--p50", type=float, default=w["p50"], help="latency median, seconds")
    group.add_argument("--p75", type=float, default=w["p75"], help="latency p75, seconds")
    group.add_argument(
        "--keys", type=_positive_int, default=w["keys"], help="key space per purgatory"
    )
    group.add_argument(
        "--keys-per-op", type=_positive_int, default=w["keys_per_op"], help="keys per operation"
    )
    group.add_argument("--key-skew", type=float, default=w["key_skew"], help="Zipf exponent")
    group.add_argument(
        "--never", type=float, default=w["never"], help="share of operations never completing"
    )
    group.add_argument("--seed", type=int, default=w["seed"], help="seed of every draw")
    group.add_argument(
        "--chunk", type=_positive_int, default=w["chunk"], help="operations per task"
    )


def _add_grid(parser: argparse.ArgumentParser, timeout: str, rate: str) -> None:
    g = GRID_DEFAULTS
    group = parser.add_argument_group("configuration grid (comma lists; the cartesian product)")
    group.add_argument("--tick", type=_floats, default=g["tick"], help="seconds")
    group.add_argument(
        "--wheel-size", type=_ints, default=g["wheel_size"], help="slots per wheel level"
    )
    group.add_argument(
        "--purge-interval", type=_ints, default=g["purge_interval"], help="Kafka's purgeInterval"
    )
    group.add_argument(
        "--timeout-scale", type=_floats, default=timeout, help="every timeout times this"
    )
    group.add_argument(
        "--rate-scale", type=_floats, default=rate, help="arrivals this many times faster"
    )
    group.add_argument(
        "--trigger",
        choices=("key", "force"),
        default="key",
        help="key: check_and_complete on the first key; force: force_complete",
    )
    group.add_argument(
        "--partitions", type=_positive_int, default=None, help="default: four per core"
    )
    group.add_argument(
        "--event-log", default=None, help="directory for the replay's event logs (default: none)"
    )
    group.add_argument(
        "--cost-profile",
        default=None,
        metavar="PROFILE.json",
        help="the load model: serve each group as one core with these costs (made by "
        "'calibrate'); default: none, the purgatory's work costs nothing",
    )
    group.add_argument(
        "--summary-only",
        action="store_true",
        help="write only summary/, not one row per operation in operations/ (the summary is "
        "the same; the job is faster)",
    )


def _w1(args: argparse.Namespace) -> W1:
    from ._generate import W1

    return W1(
        purgatories=args.purgatories,
        operations=args.operations,
        rate=args.rate,
        timeout=args.timeout,
        p50=args.p50,
        p75=args.p75,
        keys=args.keys,
        keys_per_op=args.keys_per_op,
        key_skew=args.key_skew,
        never=args.never,
        seed=args.seed,
        chunk=args.chunk,
    )


def _grid(args: argparse.Namespace) -> list[ReplayConfig]:
    from ._replay import ReplayConfig

    return [
        ReplayConfig(tick, wheel, purge, timeout, rate, args.trigger)
        for tick, wheel, purge, timeout, rate in itertools.product(
            args.tick, args.wheel_size, args.purge_interval, args.timeout_scale, args.rate_scale
        )
    ]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand (imports no part of the Spark extra)."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Record, replay and analyse purgatory workloads on Spark.\n" + _requirements(),
        epilog=_examples(
            "sweep --out sweep/",
            "generate --out trace/ --purgatories 8 --operations 1000000",
            "replay --trace trace/ --out replay/ --tick 0.001,0.01 --timeout-scale 0.5,1",
            "generate --from-log events/ --out night/",
            "analyze --log events/ --out analysis/ --window 60",
        )
        + f"\n\n'{_PROG} COMMAND --help' lists each command's options.",
        formatter_class=_Formatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, *examples: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}.\n{_requirements()}",
            epilog=_examples(*examples),
            formatter_class=_Formatter,
        )

    gen = command(
        "generate",
        "write a seeded W1 trace, or a trace from event logs",
        "generate --out trace/",
        "generate --out trace/ --purgatories 8 --operations 1000000 --timeout 0.5",
        "generate --from-log events/ --out night/",
    )
    gen.add_argument("--out", required=True, help="trace directory (Parquet)")
    gen.add_argument(
        "--from-log", default=None, help="make the trace from the event logs (*.jsonl) here"
    )
    _add_w1(gen, int(W1_DEFAULTS["operations"]))
    _add_common(gen)
    rep = command(
        "replay",
        "replay a trace over a configuration grid",
        "replay --trace trace/ --out replay/",
        "replay --trace trace/ --out replay/ --tick 0.001,0.01 --rate-scale 1,2 "
        "--event-log events/",
    )
    rep.add_argument("--trace", required=True, help="trace: a Parquet file or directory")
    rep.add_argument("--out", required=True, help="output directory: summary/, operations/")
    _add_grid(rep, "1", "1")
    _add_common(rep)
    ana = command(
        "analyze",
        "summaries of recorded event logs",
        "analyze --log events/ --out analysis/",
        "analyze --log events/ --out analysis/ --window 1",
    )
    ana.add_argument("--log", required=True, help="directory of event logs (*.jsonl, *.arrows)")
    ana.add_argument("--out", required=True, help="output: summary/ keys/ windows/ waits/")
    ana.add_argument("--window", type=float, default=60.0, help="seconds per time window")
    for name, edge in (("--since", "from"), ("--until", "before")):
        ana.add_argument(
            name,
            type=_utc,
            default=None,
            help=f"only operations watched {edge} this ISO-8601 time (naive: UTC); "
            "needs logs with a UTC anchor",
        )
    _add_common(ana)
    swp = command(
        "sweep",
        "generate, replay a grid, print the summary, chart it",
        "sweep --out sweep/",
        "sweep --out sweep/ --operations 100000 --timeout-scale 0.5,1,2 --rate-scale 1,2,4",
    )
    swp.add_argument("--out", required=True, help="directory: trace/, replay/, sweep.png")
    _add_w1(swp, 20_000)
    _add_grid(swp, "0.5,1,2", "1,2,4")
    _add_common(swp)
    cal = sub.add_parser(
        "calibrate",
        help="measure a cost profile for the load model (no Spark needed)",
        description="Measure a cost profile for the load model (no Spark needed): the CPU "
        "seconds each kind of event costs the real purgatory on a real event loop here.",
        epilog=_examples("calibrate --out profile.json", "calibrate --out quick.json --quick"),
        formatter_class=_Formatter,
    )
    cal.add_argument("--out", required=True, metavar="PROFILE.json", help="profile file to write")
    cal.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop to measure on (default asyncio)",
    )
    cal.add_argument("--quick", action="store_true", help="a rough profile in a few seconds")
    cal.add_argument("--verbose", action="store_true", help="on an error, show the full trace")
    cal.add_argument(
        "--application-cost",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the application's own CPU seconds per operation, added to every arrival",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; every error is one line on stderr (exit 2 for bad input, else 1).

    With ``--verbose``, errors propagate with their full traces instead.
    """
    args = build_parser().parse_args(argv)
    where = f"{_PROG.split()[-1]} {args.command}: error:"
    try:
        if args.command == "calibrate":
            return _calibrate(args)
        return _run(args)
    except KeyboardInterrupt:
        if args.verbose:
            raise
        print(f"{where} interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.verbose:
            raise
        bad_input = _is_input_error(exc)
        text = one_line(exc)
        if not bad_input:
            text += " (--verbose shows the full trace)"
        print(f"{where} {text}", file=sys.stderr)
        return 2 if bad_input else 1


def _is_input_error(exc: BaseException) -> bool:
    """Bad input or environment (exit 2): our checks' errors, a missing Java, an output clash."""
    if isinstance(exc, ValueError | FileExistsError):
        return not type(exc).__module__.startswith(("pyspark", "py4j"))
    spark = sys.modules.get(f"{__package__}._spark")
    missing_java = getattr(spark, "JavaMissing", None)
    return missing_java is not None and isinstance(exc, missing_java)


_EXCEPTION_LINE: Final = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit)\b.*$")
_LONGEST: Final = 500


def one_line(exc: BaseException) -> str:
    """One line saying what went wrong: our own message, or the gist of a Spark/JVM error.

    A Python error inside a Spark task comes back wrapped in JVM text around the task's
    traceback; its last line (``ValueError: ...``) is the one that says what happened.
    """
    own = not type(exc).__module__.startswith(("pyspark", "py4j"))
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    start = next((i for i, line in enumerate(lines) if "Traceback (most recent call" in line), None)
    if start is not None:
        task = list(
            itertools.takewhile(lambda line: not line.startswith("at "), lines[start + 1 :])
        )
        found = [line for line in task if _EXCEPTION_LINE.match(line)]
        if found:
            return f"in a Spark task: {found[-1]}"[:_LONGEST]
    first = next(
        (line for line in lines if not line.startswith("An error occurred while calling")),
        lines[0],
    ).removeprefix(": ")
    if own and not _is_input_error(exc):
        first = f"{type(exc).__name__}: {first}"
    return first[:_LONGEST]


def _check(
    args: argparse.Namespace,
) -> tuple[W1 | None, list[ReplayConfig], CostProfile | None]:
    """Every check that needs no Spark session: the extra, the settings, the paths, the cost
    profile."""
    command = args.command
    needs = (*EXTRA_MODULES, "matplotlib") if command == "sweep" else EXTRA_MODULES
    missing = missing_extra(needs)
    if missing:
        raise InputError(missing)
    configs = _grid(args) if command in ("replay", "sweep") else []
    from_log = getattr(args, "from_log", None)
    w1 = _w1(args) if command in ("generate", "sweep") and not from_log else None
    check_configs(configs, None if w1 is None else w1.timeout)
    profile = getattr(args, "cost_profile", None)
    costs = load_profile(profile) if profile else None
    event_log = getattr(args, "event_log", None)
    if event_log:
        check_directory(event_log, "event-log directory")
        if command == "replay":
            others = [("input", args.trace), ("output", args.out)]
        else:
            out = args.out.rstrip("/")
            others = [("output", f"{out}/trace"), ("output", f"{out}/replay")]
        check_apart(event_log, "event-log directory", others)
    if command == "generate":
        if from_log:
            check_event_logs(from_log)
        check_output(args.out, overwrite=args.overwrite, inputs=[from_log] if from_log else [])
    elif command == "replay":
        check_trace(args.trace)
        check_output(args.out, overwrite=args.overwrite, inputs=[args.trace])
    elif command == "analyze":
        if not (args.window > 0 and math.isfinite(args.window)):
            raise InputError(
                f"--window must be a finite number of seconds > 0, got {args.window!r}"
            )
        check_event_logs(args.log)
        check_output(args.out, overwrite=args.overwrite, inputs=[args.log])
    else:
        out = args.out.rstrip("/")
        check_directory(out, "output")
        check_output(f"{out}/trace", overwrite=args.overwrite)
        check_output(f"{out}/replay", overwrite=args.overwrite)
    return w1, configs, costs


def _calibrate(args: argparse.Namespace) -> int:
    from ._calibrate import calibrate
    from ._load import save_profile

    # What can fail after half a minute of measuring is checked before it.
    if not (args.application_cost >= 0 and math.isfinite(args.application_cost)):
        raise InputError(
            f"--application-cost must be a finite number of seconds >= 0, "
            f"got {args.application_cost!r}"
        )
    if args.loop == "uvloop" and missing_extra(("uvloop",)):
        raise InputError("--loop uvloop needs uvloop: pip install 'asyncio-purgatory[uvloop]'")
    parent = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(parent):
        raise InputError(f"--out {args.out}: no directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out {args.out}: cannot write in {parent} (permission denied)")
    started = time.perf_counter()
    profile = calibrate(
        args.loop,
        quick=args.quick,
        application=args.application_cost,
        progress=lambda name: print(f"measuring {name} ...", flush=True),
    )
    save_profile(profile, args.out)
    print(f"profile: {profile.describe()}")
    print(f"written to {args.out} ({time.perf_counter() - started:.1f} s)")
    return 0


def print_load_model(costs: CostProfile | None) -> None:
    """Say which load model the replay used: none (zero costs) or the profile's."""
    if costs is None:
        print(
            "load model: none: every event costs 0 s of CPU, so the rate changes nothing "
            "(--cost-profile PROFILE.json, made by 'calibrate', serves each group as one core)"
        )
    else:
        print(f"load model: each group served by one core; {costs.describe()}")


def _run(args: argparse.Namespace) -> int:
    w1, configs, costs = _check(args)
    from . import _spark
    from ._jobs import analyze, generate, replay, trace_from_log

    command = args.command
    spark = _spark.get_session(args.master, f"purgatory-pipeline-{command}")
    if not args.verbose:
        # Spark logs a failed task's traces itself, before the driver sees the error.
        spark.sparkContext.setLogLevel("FATAL")
    started = time.perf_counter()
    if command == "generate":
        if args.from_log:
            rows = trace_from_log(spark, args.from_log, args.out, overwrite=args.overwrite)
        else:
            assert w1 is not None
            rows = generate(spark, w1, args.out, overwrite=args.overwrite)
        print(f"trace: {rows} operations in {args.out} ({time.perf_counter() - started:.1f} s)")
        return 0
    if command == "replay":
        summary = replay(
            spark,
            args.trace,
            args.out,
            configs,
            event_log=args.event_log,
            partitions=args.partitions,
            overwrite=args.overwrite,
            costs=costs,
            operations=not args.summary_only,
        )
        rows_out = [row.asDict() for row in summary.collect()]
        print_replay_summary(rows_out)
        print_load_model(costs)
        _done(args.out, rows_out, started)
        return 0
    if command == "analyze":
        summary = analyze(
            spark,
            args.log,
            args.out,
            window=args.window,
            since=args.since,
            until=args.until,
            overwrite=args.overwrite,
        )
        print_table(
            [row.asDict() for row in summary.collect()],
            [
                ("purgatory", "purgatory", str),
                ("ops", "operations", str),
                ("completed", "completed", str),
                ("expired", "expired", str),
                ("cancelled", "cancelled", str),
                ("open", "open", str),
                ("wait p50 ms", "wait_p50", _ms),
                ("wait p99 ms", "wait_p99", _ms),
                ("wait max ms", "wait_max", _ms),
                ("late p99 ms", "lateness_p99", _ms),
                ("peak delayed", "peak_delayed", str),
            ],
        )
        keys = spark.read.parquet(f"{args.out}/keys").orderBy("peak_waiters", ascending=False)
        print("\nkeys with the most waiters:")
        print_table(
            [row.asDict() for row in keys.limit(10).collect()],
            [
                ("purgatory", "purgatory", str),
                ("key", "key", str),
                ("peak waiters", "peak_waiters", str),
                ("ops", "operations", str),
                ("expired", "expired", str),
                ("wait max ms", "wait_max", _ms),
            ],
        )
        windows = spark.read.parquet(f"{args.out}/windows")
        if windows.where(windows["time_base"] == "clock").limit(1).count():
            print("\nwindows: in seconds of the purgatory's clock for logs without a UTC anchor")
        print(f"\nanalysis in {args.out} ({time.perf_counter() - started:.1f} s)")
        return 0
    # sweep
    assert w1 is not None
    out = args.out.rstrip("/")
    rows = generate(spark, w1, f"{out}/trace", overwrite=args.overwrite)
    print(f"trace: {rows} operations ({time.perf_counter() - started:.1f} s)")
    summary = replay(
        spark,
        f"{out}/trace",
        f"{out}/replay",
        configs,
        event_log=args.event_log,
        partitions=args.partitions,
        overwrite=args.overwrite,
        costs=costs,
        operations=not args.summary_only,
    )
    rows_out = [row.asDict() for row in summary.collect()]
    print_replay_summary(rows_out)
    print_load_model(costs)
    from ._chart import sweep_chart

    sweep_chart(
        rows_out,
        f"{out}/sweep.png" if "://" not in out else "sweep.png",
        f"W1 sweep: {w1.purgatories} purgatories x {w1.operations:,} operations, "
        f"timeout {w1.timeout * 1000:g} ms, latency p50/p75 {w1.p50 * 1000:g}/{w1.p75 * 1000:g} ms",
    )
    print(f"chart: {out}/sweep.png")
    if costs is not None:
        from ._chart import load_chart

        load_chart(
            rows_out,
            f"{out}/load.png" if "://" not in out else "load.png",
            w1.rate,
            f"Load model ({costs.loop} loop): W1, {w1.purgatories} purgatories, one core each",
        )
        print(f"load chart: {out}/load.png")
    _done(f"{out}/replay", rows_out, started)
    return 0


def _done(out: str, rows: Sequence[Mapping[str, Any]], started: float) -> None:
    import purgatory

    seconds = time.perf_counter() - started
    ops = sum(row["operations"] for row in rows)
    print(f"\nreplay in {out}: {ops:,} operations replayed in {seconds:.1f} s")
    # Where the driver found the package: a zip under spark-submit --py-files, for instance.
    print(f"purgatory package: {os.path.dirname(purgatory.__file__)}")


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.2f}"


def print_replay_summary(rows: Sequence[Mapping[str, Any]]) -> None:
    """The replay summary, one line per (purgatory, configuration)."""
    print_table(
        rows,
        [
            ("purgatory", "purgatory", str),
            ("cfg", "config_id", str),
            ("tick ms", "tick", lambda v: f"{v * 1000:g}"),
            ("wheel", "wheel_size", str),
            ("timeout x", "timeout_scale", lambda v: f"{v:g}"),
            ("rate x", "rate_scale", lambda v: f"{v:g}"),
            ("ops", "operations", str),
            ("expired %", "expired_share", lambda v: f"{100 * v:.2f}"),
            ("missed %", "missed_share", lambda v: f"{100 * v:.2f}"),
            ("wait p50 ms", "wait_p50", _ms),
            ("wait p99 ms", "wait_p99", _ms),
            ("late p99 ms", "lateness_p99", _ms),
            ("peak watched", "peak_watched", str),
            ("peak delayed", "peak_delayed", str),
            ("purges", "purges", str),
            ("util %", "utilisation", lambda v: f"{100 * v:.1f}"),
            ("pass late p99 ms", "pass_lateness_p99", _ms),
            ("pass late max ms", "pass_lateness_max", _ms),
        ],
    )


def print_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, Callable[[Any], str]]]
) -> None:
    """Print `rows` as an aligned text table of `columns` (header, field, formatter)."""
    cells = [[fmt(row[field]) for _, field, fmt in columns] for row in rows]
    widths = [
        max([len(header)] + [len(line[i]) for line in cells])
        for i, (header, _, _) in enumerate(columns)
    ]
    print("  ".join(h.rjust(w) for (h, _, _), w in zip(columns, widths, strict=True)))
    for line in cells:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))


def _utc(text: str) -> datetime:
    """An ISO-8601 time for ``--since``/``--until``; naive means UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO-8601 time: {text!r} (for instance 2026-11-24T21:00:00Z)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
