"""The command line's options: value parsers, option groups, and the objects they describe.

Imports neither Spark nor numpy nor pyarrow (``--help`` must work without the Spark extra);
`W1` and `ReplayConfig` are built on first use.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, TypeVar

from ._checks import EXTRA_MODULES, missing_extra

if TYPE_CHECKING:
    from ._generate import W1
    from ._replay import ReplayConfig

__all__ = (
    "GRID_DEFAULTS",
    "PROG",
    "W1_DEFAULTS",
    "Formatter",
    "add_common",
    "add_grid",
    "add_w1",
    "examples",
    "grid_of",
    "positive_int",
    "requirements",
    "setting",
    "utc_time",
    "w1_of",
)

PROG: Final = "python -m purgatory.pipeline"
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

_T = TypeVar("_T", int, float)


def comma_list(kind: Callable[[str], _T], what: str) -> Callable[[str], list[_T]]:
    """A parser of comma-separated values of `kind` (at least one), named `what` in errors."""

    def parse(text: str) -> list[_T]:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {what} separated by commas, got {text!r}"
            ) from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one of {what}, got {text!r}")
        return values

    return parse


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def setting(text: str) -> tuple[str, str]:
    """A ``KEY=VALUE`` Spark setting."""
    key, equals, value = text.partition("=")
    if not (equals and key.strip()):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def utc_time(text: str) -> datetime:
    """An ISO-8601 time for ``--since``/``--until``; naive means UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO-8601 time: {text!r} (for instance 2026-11-24T21:00:00Z)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class Formatter(argparse.RawDescriptionHelpFormatter):
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


def requirements() -> str:
    """What the Spark commands need, and what of it this environment lacks."""
    missing = missing_extra((*EXTRA_MODULES, "matplotlib"))
    lines = [
        "Needs the Spark extra and Java 17 or later (or a Spark Connect server): "
        "pip install 'asyncio-purgatory[spark]'.",
    ]
    if missing:
        lines.append(f"Not installed here: {missing.split(' (', 1)[1].split(')', 1)[0]}.")
    return "\n".join(lines)


def examples(*commands: str) -> str:
    """The epilog of a parser: each command line as it is typed."""
    return "examples:\n" + "\n".join(f"  {PROG} {command}" for command in commands)


def add_common(parser: argparse.ArgumentParser) -> None:
    """The options every Spark command has: where it runs, outputs, errors, the web UI."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--master",
        default=None,
        help="Spark master: local[N], spark://HOST:PORT, yarn, k8s://..., or a Spark Connect "
        "server sc://HOST:PORT (default: SPARK_REMOTE if set, else local[*]; ignored under "
        "spark-submit, which sets it)",
    )
    where.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="run on Spark Connect, as pyspark's --remote: a server sc://HOST:PORT, or "
        "local / local[N] to start one in this process",
    )
    parser.add_argument(
        "--conf",
        action="append",
        type=setting,
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session (repeatable), e.g. spark.executor.memory=4g",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    parser.add_argument(
        "--ui", action="store_true", help="start Spark's web UI (off unless asked for)"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="on an error, show the full Python and JVM traces, and keep Spark's warnings",
    )


def add_w1(parser: argparse.ArgumentParser, operations: int) -> None:
    """The W1 trace model's options (`purgatory.pipeline.W1`)."""
    w = W1_DEFAULTS
    group = parser.add_argument_group("W1 trace (Kafka's TestPurgatoryPerformance model)")
    group.add_argument(
        "--purgatories", type=positive_int, default=w["purgatories"], help="purgatories"
    )
    group.add_argument(
        "--operations", type=positive_int, default=operations, help="operations per purgatory"
    )
    group.add_argument("--rate", type=float, default=w["rate"], help="arrivals/s per purgatory")
    group.add_argument("--timeout", type=float, default=w["timeout"], help="seconds")
    group.add_argument("--p50", type=float, default=w["p50"], help="latency median, seconds")
    group.add_argument("--p75", type=float, default=w["p75"], help="latency p75, seconds")
    group.add_argument(
        "--keys", type=positive_int, default=w["keys"], help="key space per purgatory"
    )
    group.add_argument(
        "--keys-per-op", type=positive_int, default=w["keys_per_op"], help="keys per operation"
    )
    group.add_argument("--key-skew", type=float, default=w["key_skew"], help="Zipf exponent")
    group.add_argument(
        "--never", type=float, default=w["never"], help="share of operations never completing"
    )
    group.add_argument("--seed", type=int, default=w["seed"], help="seed of every draw")
    group.add_argument("--chunk", type=positive_int, default=w["chunk"], help="operations per task")


def add_grid(parser: argparse.ArgumentParser, timeout: str, rate: str) -> None:
    """The configuration grid's options, and the replay's."""
    g = GRID_DEFAULTS
    floats, ints = comma_list(float, "numbers"), comma_list(int, "integers")
    group = parser.add_argument_group("configuration grid (comma lists; the cartesian product)")
    group.add_argument("--tick", type=floats, default=g["tick"], help="seconds")
    group.add_argument(
        "--wheel-size", type=ints, default=g["wheel_size"], help="slots per wheel level"
    )
    group.add_argument(
        "--purge-interval", type=ints, default=g["purge_interval"], help="Kafka's purgeInterval"
    )
    group.add_argument(
        "--timeout-scale", type=floats, default=timeout, help="every timeout times this"
    )
    group.add_argument(
        "--rate-scale", type=floats, default=rate, help="arrivals this many times faster"
    )
    group.add_argument(
        "--trigger",
        choices=("key", "force"),
        default="key",
        help="key: check_and_complete on the first key; force: force_complete",
    )
    group.add_argument(
        "--partitions",
        type=positive_int,
        default=None,
        help="tasks of the replay, the groups balanced over them by operation count "
        "(default: the session's cores, at most one per group)",
    )
    group.add_argument(
        "--shards",
        type=positive_int,
        default=1,
        help="split each group into this many time shards replayed by separate tasks, with "
        "the same result (each boundary checked; one that fails is replayed sequentially and "
        "said); 1: a group is one task",
    )
    group.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --shards: replay seconds added to each shard's warm-up beyond the longest "
        "timeout (a loaded core's backlog)",
    )
    group.add_argument(
        "--read",
        choices=("auto", "direct", "spark"),
        default="auto",
        help="how the tasks get the trace's rows. direct: each task reads its groups' rows from "
        "the Parquet files itself (the executors must see them at the same path); spark: Spark "
        "reads, checks, shuffles and sorts them; auto: direct, else Spark's read where the tasks "
        "cannot read the files themselves (said on stderr)",
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


def w1_of(args: argparse.Namespace) -> W1:
    """The trace model the options describe."""
    from ._generate import W1

    return W1(**{name: getattr(args, name) for name in W1_DEFAULTS})


def grid_of(args: argparse.Namespace) -> list[ReplayConfig]:
    """Every configuration of the grid the options describe (their cartesian product)."""
    from ._replay import ReplayConfig

    return [
        ReplayConfig(tick, wheel, purge, timeout, rate, args.trigger)
        for tick, wheel, purge, timeout, rate in itertools.product(
            args.tick, args.wheel_size, args.purge_interval, args.timeout_scale, args.rate_scale
        )
    ]
