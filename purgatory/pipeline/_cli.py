"""The command line: ``python -m purgatory.pipeline generate | replay | analyze | sweep``, and
``calibrate``, which measures a cost profile for the load model without Spark.

The parser is built from the table of commands (`purgatory.pipeline._commands.COMMANDS`).
Parsing imports neither Spark nor numpy nor pyarrow, so ``--help`` works (and says what to
install) without the Spark extra. Any error ends in one line on stderr: exit status 2 for bad
input, 1 for anything else; ``--verbose`` shows the full trace.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
from collections.abc import Sequence
from typing import Final

from ._commands import COMMANDS
from ._options import PROG, Formatter, examples, requirements

__all__ = ("build_parser", "main", "one_line")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand (imports no part of the Spark extra)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Record, replay and analyse purgatory workloads on Spark.\n" + requirements(),
        epilog=examples(
            "sweep --out sweep/",
            "generate --out trace/ --purgatories 8 --operations 1000000",
            "replay --trace trace/ --out replay/ --tick 0.001,0.01 --timeout-scale 0.5,1",
            "generate --from-log events/ --out night/",
            "analyze --log events/ --out analysis/ --window 60",
        )
        + f"\n\n'{PROG} COMMAND --help' lists each command's options.",
        formatter_class=Formatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        summary = f"{command.summary[0].upper()}{command.summary[1:]}."
        command.options(
            sub.add_parser(
                command.name,
                help=command.summary,
                description=f"{summary}\n{requirements()}" if command.spark else summary,
                epilog=examples(*command.examples),
                formatter_class=Formatter,
            )
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; every error is one line on stderr (exit 2 for bad input, else 1).

    With ``--verbose``, errors propagate with their full traces instead.
    """
    args = build_parser().parse_args(argv)
    where = f"{PROG.split()[-1]} {args.command}: error:"
    run = next(command.run for command in COMMANDS if command.name == args.command)
    try:
        code = run(args)
    except KeyboardInterrupt:
        _ended()
        if args.verbose:
            raise
        print(f"{where} interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        _ended()
        if args.verbose:
            raise
        if _interrupted():  # a job cancelled by Ctrl-C fails with Spark's "cancelled" error
            print(f"{where} interrupted", file=sys.stderr)
            return 130
        bad_input = _is_input_error(exc)
        text = one_line(exc)
        if not bad_input:
            text += " (--verbose shows the full trace)"
        print(f"{where} {text}", file=sys.stderr)
        return 2 if bad_input else 1
    _ended()
    return code


def _ended() -> None:
    """A Ctrl-C held back during a Spark Connect call is not raised past this point."""
    spark = sys.modules.get(f"{__package__}._spark")
    if spark is not None:
        spark.command_ended()


def _interrupted() -> bool:
    spark = sys.modules.get(f"{__package__}._spark")
    return bool(spark is not None and spark.interrupted())


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
