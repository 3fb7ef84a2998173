"""Instructions per operation on the core's hot paths, under ``valgrind --tool=callgrind``.

``python -m benchmarks.instructions [--paths ...] [--against DIR --label NAME] [--write]``
runs each path below in a child Python under callgrind twice, with ``--short`` and ``--long``
operations after the same set-up, and prints the difference divided by the difference in
operations: start-up, imports and set-up cancel, and what is left is the path's own cost. The
count does not depend on the machine's load (the same binary, inputs and ``PYTHONHASHSEED=0``
give the same total), which is why hot-path changes are decided and guarded with it, and
wall-clock figures are kept for the user-facing tables.

Every path runs on a `purgatory.testing.ManualClock` purgatory that already delays 10,000
operations (each on a key of its own, an hour away), through the public API only, so the same
script measures any version of the core (``--against`` a checkout's directory).

The Floor is the user's own work per operation, which no design can go below: create the
operation (a plain slotted class with the same fields), call its ``try_complete`` twice (the
watch's two tries) and its ``on_complete``, and keep it in a dict for its key meanwhile (the
benchmarks' Floor everywhere: "create the operation object and insert it into one dict per
key"), in the same loop as ``watch_force`` (the same key per operation, the same test every 100
operations). Targets are ratios to it.

Paths:
    floor: the Floor.
    plain_create: create the plain slotted class (``timeout`` and the user's two fields).
    subclass_create: create a `DelayedOperation` subclass with the same two fields.
    watch_force: create with a 30 s timeout (a request timeout: the wheel's second level),
        ``try_complete_else_watch`` on a key of its own, ``force_complete``; a timer pass every
        100 operations (the purges are paid here).
    watch_expire: create, watch on a key of its own with a 50 ms timeout; a timer pass every
        100 operations expires them (``on_complete`` and ``on_expiration`` run).
    threshold: 100 keys, each with 100 watchers at increasing offsets; per operation, one
        watch at the key's next offset and one ``check_and_complete(key, reached)`` that
        completes the key's oldest watcher.
    threshold_shuffled: the same with the offsets of each key watched out of order.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ("PATHS", "main", "measure")

PENDING = 10_000
KEYS = 100
PATHS = (
    "floor",
    "plain_create",
    "subclass_create",
    "watch_force",
    "watch_expire",
    "threshold",
    "threshold_shuffled",
)
RESULTS_JSON = Path(__file__).with_name("instructions.json")
RESULTS_MD = Path(__file__).with_name("RESULTS.md")
BEGIN = "<!-- instructions:begin -->"
END = "<!-- instructions:end -->"


# -- the paths (run in the child) ----------------------------------------------------------------


Run = Callable[[int], None]


class _Paths:
    """The set-up every path shares, and one method per path that returns its loop."""

    def __init__(self) -> None:
        from purgatory import DelayedOperation, DelayedOperationPurgatory
        from purgatory.testing import ManualClock

        class Plain:
            __slots__ = ("deadline", "ready", "timeout")

            def __init__(self, timeout: float, deadline: float) -> None:
                self.timeout = timeout
                self.deadline = deadline
                self.ready = False

            def try_complete(self) -> bool:
                return self.ready

            def on_complete(self) -> None:
                return None

        class Op(DelayedOperation[None]):
            __slots__ = ("deadline", "ready")

            def __init__(self, timeout: float, deadline: float) -> None:
                super().__init__(timeout)
                self.deadline = deadline
                self.ready = False

            def try_complete(self) -> bool:
                if self.ready:
                    return self.force_complete()
                return False

            def on_complete(self) -> None:
                return None

            def on_expiration(self) -> None:
                return None

        reached: dict[int, int] = {}

        class AtOffset(DelayedOperation[None]):
            __slots__ = ("key", "offset")

            def __init__(self, timeout: float, key: int, offset: int) -> None:
                super().__init__(timeout)
                self.key = key
                self.offset = offset

            def try_complete(self) -> bool:
                if reached[self.key] >= self.offset:
                    return self.force_complete()
                return False

            def on_complete(self) -> None:
                return None

            def on_expiration(self) -> None:
                return None

        self.Plain = Plain
        self.Op = Op
        self.AtOffset = AtOffset
        self.reached = reached
        self.clock = ManualClock()
        self.purgatory: Any = DelayedOperationPurgatory("bench", clock=self.clock)
        watch = self.purgatory.try_complete_else_watch
        for key in range(PENDING):
            watch(Op(3600.0, 0.0), (("pending", key),))

    def floor(self) -> Run:
        plain = self.Plain

        def run(n: int) -> None:
            watchers: dict[Any, dict[Any, None]] = {}
            for i in range(n):
                op = plain(30.0, 0.0)
                key = (i,)
                op.try_complete()
                watchers[key] = {op: None}
                op.try_complete()
                op.on_complete()
                del watchers[key]
                if i % 100 == 99:
                    pass

        return run

    def plain_create(self) -> Run:
        plain = self.Plain

        def run(n: int) -> None:
            for _ in range(n):
                plain(30.0, 0.0)

        return run

    def subclass_create(self) -> Run:
        new = self.Op

        def run(n: int) -> None:
            for _ in range(n):
                new(30.0, 0.0)

        return run

    def watch_force(self) -> Run:
        new = self.Op
        watch = self.purgatory.try_complete_else_watch
        advance = self.clock.advance

        def run(n: int) -> None:
            for i in range(n):
                op = new(30.0, 0.0)
                watch(op, (i,))
                op.force_complete()
                if i % 100 == 99:
                    advance(0.0)

        return run

    def watch_expire(self) -> Run:
        new = self.Op
        watch = self.purgatory.try_complete_else_watch
        advance = self.clock.advance

        def run(n: int) -> None:
            for i in range(n):
                watch(new(0.05, 0.0), (i,))
                if i % 100 == 99:
                    advance(0.1)

        return run

    def threshold(self, shuffled: bool = False) -> Run:
        new = self.AtOffset
        reached = self.reached
        watch = self.purgatory.try_complete_else_watch
        check = self.purgatory.check_and_complete
        rng = random.Random(1)
        order = list(range(100))
        next_offset = dict.fromkeys(range(KEYS), 100)
        for key in range(KEYS):
            reached[key] = -1
            if shuffled:
                rng.shuffle(order)
            for offset in order:
                watch(new(3600.0, key, offset), {key: offset})

        def run(n: int) -> None:
            for i in range(n):
                key = i % KEYS
                offset = next_offset[key]
                if shuffled:
                    offset += i * 37 % 50  # out of order, always ahead of what is reached
                watch(new(3600.0, key, offset), {key: offset})
                next_offset[key] += 1
                reached[key] += 1
                check(key, reached[key])

        return run

    def threshold_shuffled(self) -> Run:
        return self.threshold(shuffled=True)


def _build(path: str) -> Run:
    """Set `path` up (the part both run lengths share) and return its loop over `n` operations."""
    if path not in PATHS:
        raise SystemExit(f"unknown path {path!r}; choose from {', '.join(PATHS)}")
    run: Run = getattr(_Paths(), path)()
    return run


def _child(path: str, n: int) -> None:
    run = _build(path)
    run(n)


# -- the parent ------------------------------------------------------------------------------


def _instructions(path: str, n: int, pythonpath: str | None) -> int:
    """Total instructions of one child run under callgrind."""
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONHASHSEED="0")
    env["PYTHONPATH"] = root if pythonpath is None else pythonpath
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--child",
                path,
                str(n),
            ],
            env=env,
            check=True,
            capture_output=True,
            cwd=tmp,
        )
        match = re.search(r"^(?:summary|totals):\s*(\d+)", out.read_text(), re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no instruction total in callgrind's output for {path}")
        return int(match.group(1))


def measure(path: str, short: int, long: int, pythonpath: str | None = None) -> int:
    """Instructions per operation of `path`: the two run lengths subtracted."""
    return round(
        (_instructions(path, long, pythonpath) - _instructions(path, short, pythonpath))
        / (long - short)
    )


def _table(results: dict[str, dict[str, int]]) -> str:
    labels = list(results)
    floor = {label: results[label].get("floor") for label in labels}
    head = "| path | " + " | ".join(labels) + " | vs the Floor (" + labels[-1] + ") |"
    rule = "|---|" + "---:|" * len(labels) + "---:|"
    rows = [head, rule]
    for path in PATHS:
        cells = [f"{results[label][path]:,}" if path in results[label] else "-" for label in labels]
        last = results[labels[-1]].get(path)
        base = floor[labels[-1]]
        ratio = f"{last / base:.2f}x" if last is not None and base and path != "floor" else ""
        rows.append(f"| {path} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(rows)


def _write_markdown(table: str) -> None:
    text = RESULTS_MD.read_text()
    block = f"{BEGIN}\n{table}\n{END}"
    if BEGIN in text:
        start = text.index(BEGIN)
        end = text.index(END) + len(END)
        text = text[:start] + block + text[end:]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    RESULTS_MD.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.instructions",
        description="Instructions per operation on the core's hot paths (callgrind).",
    )
    parser.add_argument("--child", nargs=2, metavar=("PATH", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--short", type=int, default=2_000, help="operations of the short run")
    parser.add_argument("--long", type=int, default=6_000, help="operations of the long run")
    parser.add_argument(
        "--against", metavar="DIR", help="measure the purgatory package found in DIR instead"
    )
    parser.add_argument("--label", default="now", help="the column these figures go to")
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"keep the figures in {RESULTS_JSON.name} and the table in {RESULTS_MD.name}",
    )
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return 0
    if not args.short < args.long:
        parser.error("--short must be smaller than --long")
    figures: dict[str, int] = {}
    for path in args.paths:
        figures[path] = measure(path, args.short, args.long, args.against)
        print(f"{path:20} {figures[path]:>8,} instructions per operation", flush=True)
    if args.write:
        results: dict[str, dict[str, int]] = (
            json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
        )
        results.setdefault(args.label, {}).update(figures)
        RESULTS_JSON.write_text(json.dumps(results, indent=2) + "\n")
        _write_markdown(_table(results))
        print(_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
