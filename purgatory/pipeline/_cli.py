"""The command line: ``python -m purgatory.pipeline generate | replay | analyze | sweep``, and
``calibrate`` (no Spark)."""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._generate import W1
from ._load import CostProfile, load_profile
from ._replay import ReplayConfig

__all__ = ("main",)

_DEFAULT_W1 = W1()


def _floats(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}"
        ) from None


def _ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master (default local[*]; ignored under spark-submit, which sets it)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace existing outputs")


def _add_w1(parser: argparse.ArgumentParser, operations: int) -> None:
    w = _DEFAULT_W1
    group = parser.add_argument_group("W1 trace (Kafka's TestPurgatoryPerformance model)")
    group.add_argument("--purgatories", type=int, default=w.purgatories)
    group.add_argument("--operations", type=int, default=operations, help="per purgatory")
    group.add_argument("--rate", type=float, default=w.rate, help="arrivals/s per purgatory")
    group.add_argument("--timeout", type=float, default=w.timeout, help="seconds")
    group.add_argument("--p50", type=float, default=w.p50, help="latency median, seconds")
    group.add_argument("--p75", type=float, default=w.p75, help="latency p75, seconds")
    group.add_argument("--keys", type=int, default=w.keys, help="key space per purgatory")
    group.add_argument("--keys-per-op", type=int, default=w.keys_per_op)
    group.add_argument("--key-skew", type=float, default=w.key_skew, help="Zipf exponent")
    group.add_argument("--never", type=float, default=w.never, help="share never completing")
    group.add_argument("--seed", type=int, default=w.seed)
    group.add_argument("--chunk", type=int, default=w.chunk, help="operations per task")


def _add_grid(parser: argparse.ArgumentParser, timeout: str, rate: str) -> None:
    group = parser.add_argument_group("configuration grid (comma lists; the cartesian product)")
    group.add_argument("--tick", type=_floats, default=[0.001], help="seconds")
    group.add_argument("--wheel-size", type=_ints, default=[1024])
    group.add_argument("--purge-interval", type=_ints, default=[1000])
    group.add_argument("--timeout-scale", type=_floats, default=_floats(timeout))
    group.add_argument("--rate-scale", type=_floats, default=_floats(rate))
    group.add_argument("--trigger", choices=("key", "force"), default="key")
    group.add_argument("--partitions", type=int, default=None, help="default: one per group")
    group.add_argument("--event-log", default=None, help="directory for the replay's event logs")
    group.add_argument(
        "--cost-profile",
        default=None,
        metavar="PROFILE.json",
        help="the load model: serve each group as one core with these costs (made by "
        "'calibrate'); default: the purgatory's work costs nothing",
    )


def _w1(args: argparse.Namespace) -> W1:
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
    return [
        ReplayConfig(tick, wheel, purge, timeout, rate, args.trigger)
        for tick, wheel, purge, timeout, rate in itertools.product(
            args.tick, args.wheel_size, args.purge_interval, args.timeout_scale, args.rate_scale
        )
    ]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="python -m purgatory.pipeline",
        description="Record, replay and analyse purgatory workloads on Spark.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write a seeded W1 trace, or a trace from event logs")
    gen.add_argument("--out", required=True, help="trace directory (Parquet)")
    gen.add_argument("--from-log", default=None, help="make the trace from these event logs")
    _add_w1(gen, _DEFAULT_W1.operations)
    _add_common(gen)
    rep = sub.add_parser("replay", help="replay a trace over a configuration grid")
    rep.add_argument("--trace", required=True)
    rep.add_argument("--out", required=True, help="output directory: operations/, summary/")
    _add_grid(rep, "1", "1")
    _add_common(rep)
    ana = sub.add_parser("analyze", help="summaries of recorded event logs")
    ana.add_argument("--log", required=True, help="directory of *.jsonl event logs")
    ana.add_argument("--out", required=True, help="output: summary/ keys/ windows/ waits/")
    ana.add_argument("--window", type=float, default=60.0, help="seconds per time window")
    _add_common(ana)
    swp = sub.add_parser("sweep", help="generate, replay a grid, print the summary, chart it")
    swp.add_argument("--out", required=True, help="directory: trace/, replay/, sweep.png")
    _add_w1(swp, 20_000)
    _add_grid(swp, "0.5,1,2", "1,2,4")
    _add_common(swp)
    cal = sub.add_parser(
        "calibrate", help="measure a cost profile for the load model (no Spark needed)"
    )
    cal.add_argument("--out", required=True, metavar="PROFILE.json", help="profile file to write")
    cal.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop to measure on (default asyncio)",
    )
    cal.add_argument("--quick", action="store_true", help="a rough profile in a few seconds")
    cal.add_argument(
        "--application-cost",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the application's own CPU seconds per operation, added to every arrival",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; errors in the input are one line on stderr and exit status 2."""
    args = build_parser().parse_args(argv)
    from ._jobs import TraceError
    from ._spark import JavaMissing

    try:
        if args.command == "calibrate":
            return _calibrate(args)
        return _run(args)
    except (TraceError, JavaMissing, FileExistsError, ValueError) as exc:
        print(f"purgatory.pipeline {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _calibrate(args: argparse.Namespace) -> int:
    from ._calibrate import calibrate
    from ._load import save_profile

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
    from ._jobs import analyze, generate, replay, trace_from_log
    from ._spark import get_session

    command = args.command
    configs = _grid(args) if command in ("replay", "sweep") else []
    costs = (
        load_profile(args.cost_profile)
        if command in ("replay", "sweep") and args.cost_profile
        else None
    )
    w1 = (
        _w1(args)
        if command in ("generate", "sweep") and not getattr(args, "from_log", None)
        else None
    )
    spark = get_session(args.master, f"purgatory-pipeline-{command}")
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
        )
        rows_out = [row.asDict() for row in summary.collect()]
        print_replay_summary(rows_out)
        print_load_model(costs)
        _done(args.out, rows_out, started)
        return 0
    if command == "analyze":
        summary = analyze(spark, args.log, args.out, window=args.window, overwrite=args.overwrite)
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
