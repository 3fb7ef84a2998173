"""Would a compiled core close the gaps? Build one with mypyc and measure it beside the reference.

``python -m benchmarks.compiled [--n 100000] [--repeat 3]`` copies the package to a temporary
directory, compiles ``_wheel.py`` and ``_purgatory.py`` there with mypyc (the same typed sources;
``Bucket`` subclasses ``dict`` and so stays an interpreted class inside the compiled module),
then runs, in one subprocess per build and per repetition: a W2 repetition of ours at `--n`
(schedule / complete / expire CPU us per operation) and two micro-benchmarks (one watch on a
fresh key; one re-try of an operation by ``check_and_complete`` on a 100-operation key).

It needs what ``pip install -e .[test]`` installs (mypy brings mypyc) and a C compiler. Nothing
here is shipped: the package stays pure Python (see benchmarks/ANALYSIS.md for the verdict).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ("main",)

ROOT = Path(__file__).resolve().parent.parent
COMPILED = ("_wheel.py", "_purgatory.py")

# Runs in a subprocess whose sys.path starts with the build under test.
PROBE = """
import asyncio, json, sys, time
import purgatory._purgatory as core
from benchmarks.contenders import w2_contenders
from benchmarks.ours import BenchOp
from benchmarks.w2 import Workload, run_once

n = int(sys.argv[1])
ours = next(c for c in w2_contenders(False) if c.name == "ours")
w2 = run_once(ours, Workload.make(n, 1), 0.05 + 15e-6 * n, memory=False)

async def micro():
    p = core.DelayedOperationPurgatory("retry")
    for _ in range(100):
        p.try_complete_else_watch(BenchOp(30.0, 0.0), ("k",))
    start = time.process_time()
    for _ in range(5000):
        p.check_and_complete("k")
    retry = (time.process_time() - start) / 500_000
    q = core.DelayedOperationPurgatory("watch")
    ops = [BenchOp(30.0, 0.0) for _ in range(100_000)]
    start = time.process_time()
    for i, op in enumerate(ops):
        q.try_complete_else_watch(op, (i,))
    watch = (time.process_time() - start) / 100_000
    await p.shutdown()
    await q.shutdown()
    return retry, watch

retry, watch = asyncio.run(micro())
print(json.dumps({
    "compiled": not core.__file__.endswith(".py"),
    "schedule_us": w2["schedule_us"], "complete_us": w2["complete_us"],
    "expire_us": w2["expire_us"], "retry_ns": retry * 1e9, "watch_ns": watch * 1e9,
}))
"""


def build(target: Path) -> Path:
    """Copy the package into `target` and compile the core there; return the import root."""
    package = target / "purgatory"
    shutil.copytree(ROOT / "purgatory", package)
    wheel = package / "_wheel.py"
    source = wheel.read_text()
    typing_line = "from typing import Any, Final, Protocol, final\n"
    source = source.replace(
        typing_line, typing_line + "\nfrom mypy_extensions import mypyc_attr\n"
    ).replace("@final\nclass Bucket(", "@final\n@mypyc_attr(native_class=False)\nclass Bucket(")
    wheel.write_text(source)
    mypyc = Path(sys.executable).with_name("mypyc")
    subprocess.run(
        [str(mypyc), *(f"purgatory/{name}" for name in COMPILED)],
        cwd=target,
        check=True,
        capture_output=True,
    )
    return target


def probe(import_root: Path, n: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(import_root), str(ROOT)]))
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(n)],
        cwd=tempfile.gettempdir(),
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compiled", description=__doc__)
    parser.add_argument("--n", type=int, default=100_000, help="W2 pending operations")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per build")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="purgatory-mypyc-") as scratch:
        compiled_root = build(Path(scratch))
        runs: dict[str, list[dict[str, Any]]] = {"pure Python": [], "mypyc": []}
        for _ in range(args.repeat):  # interleaved, so drift hits both builds alike
            runs["pure Python"].append(probe(ROOT, args.n))
            runs["mypyc"].append(probe(compiled_root, args.n))
    if runs["pure Python"][0]["compiled"] or not runs["mypyc"][0]["compiled"]:
        raise SystemExit("the builds were not the ones intended (check PYTHONPATH handling)")
    fields = ("schedule_us", "complete_us", "expire_us", "retry_ns", "watch_ns")
    medians = {
        build_name: {f: statistics.median(r[f] for r in results) for f in fields}
        for build_name, results in runs.items()
    }
    print(
        f"W2 N={args.n:,} (CPU us per op) and micro-benchmarks (CPU ns), medians of {args.repeat}:"
    )
    print("| build | " + " | ".join(fields) + " |")
    print("|---|" + "---|" * len(fields))
    for build_name, row in medians.items():
        print(f"| {build_name} | " + " | ".join(f"{row[f]:.2f}" for f in fields) + " |")
    pure, fast = medians["pure Python"], medians["mypyc"]
    print("| pure / mypyc | " + " | ".join(f"{pure[f] / fast[f]:.2f}x" for f in fields) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
