"""A long random run of the differential test's hostile programs: `make fuzz-random`.

Where the test (tests/test_differential.py) draws programs with hypothesis and stops at the
first failure to shrink it, this draws them from a seeded random generator, counts the steps
exactly, goes on past a failure and prints every failing program (one JSON line each, which
``python tests/differential_worker.py < program.json`` replays; the test's ``@example`` takes
it too). Crashes and differences are counted apart. Its programs, run on the native worker
alone before the re-entrancy fixes, crashed it three times in 330,714 steps (seed 2: rows 2 and 3,
the test's examples), where hypothesis' runs of up to 30,000 steps had found no crash.

Usage: python tools/fuzz_differential.py STEPS [SEED]
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from differential_worker import ACTIONS, HOSTILE_DRAW
from test_differential import Worker, WorkerFailed, compare

#: The hostile test's weights.
KINDS = HOSTILE_DRAW


def program(rng: random.Random) -> dict[str, Any]:
    assert max(KINDS) < len(ACTIONS)
    return {
        "actions": [
            [rng.choice(KINDS), rng.randrange(41), rng.randrange(41), rng.randrange(41)]
            for _ in range(rng.randrange(4, 30))
        ],
        "purge_interval": rng.choice([0, 1, 3, 1000]),
        "wheel_size": rng.choice([2, 3, 4, 8, 1024]),
        "log": rng.random() < 0.5,
    }


def main() -> int:
    steps = int(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    rng = random.Random(seed)
    workers = Worker(pure=False), Worker(pure=True)
    assert workers[0].implementation == "native", "the native core is not built here"
    done = programs = crashes = differences = 0

    def report(what: str) -> None:
        print(
            f"{what}: {programs} programs, {done} steps, {crashes} crashes, "
            f"{differences} differences",
            flush=True,
        )

    try:
        while done < steps:
            drawn = program(rng)
            programs += 1
            try:
                compare(workers, drawn)
            except WorkerFailed as exc:
                crashes += 1
                print(f"CRASH (program {programs}): {exc}", flush=True)
            except AssertionError as exc:
                differences += 1
                print(f"DIFFERENCE (program {programs}): {exc}", flush=True)
            done += len(drawn["actions"])  # (counted once run: an interrupted one is not)
            if programs % 500 == 0:  # a long run stopped early still says how far it got
                report(f"progress, seed {seed}")
    finally:
        for worker in workers:
            worker.close()
        report(f"seed {seed}")
    return 1 if crashes or differences else 0


if __name__ == "__main__":
    sys.exit(main())
