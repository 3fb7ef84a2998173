"""Nothing leaks: the same programs, run over and over, leave the interpreter's memory where it was.

A native core that forgets one reference in a rare path leaks an object (or a whole cycle) every
time the path runs; the pure-Python modules cannot, so this test runs on both and guards the
native one. The programs are the differential test's (tests/differential_worker.py: every kind
of operation, raising and re-entrant callbacks, async attempts, drains, shutdowns, bad
arguments), drawn from fixed seeds; memory is counted in allocated blocks
(``sys.getallocatedblocks``), which sees every object, not only those the collector tracks.
"""

from __future__ import annotations

import asyncio
import gc
import random
import sys
from typing import Any

from differential_worker import ACTIONS, run_program

#: Programs per round; rounds after the warm-up that must not grow.
PROGRAMS = 60
ROUNDS = 4


def program(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    kinds = [0] * 8 + [1] * 4 + [2] * 5 + [3] * 2 + [5] * 3 + [6] * 2 + list(range(len(ACTIONS)))
    return {
        "actions": [
            [rng.choice(kinds), rng.randrange(41), rng.randrange(41), rng.randrange(41)]
            for _ in range(rng.randrange(1, 50))
        ],
        "purge_interval": rng.choice([0, 1, 3, 1000]),
        "wheel_size": rng.choice([2, 3, 4, 8, 1024]),
        "log": rng.random() < 0.5,
    }


def run_round(seeds: range) -> None:
    for seed in seeds:
        asyncio.run(run_program(program(seed)))


def blocks() -> int:
    for _ in range(3):
        gc.collect()
    return sys.getallocatedblocks()


def test_programs_run_again_and_again_leave_memory_as_it_was() -> None:
    seeds = range(PROGRAMS)
    run_round(seeds)  # warm-up: caches, interned names, freelists, the method cache
    run_round(seeds)
    before = blocks()
    for _ in range(ROUNDS):
        run_round(seeds)
    grown = blocks() - before
    # A leak of one object per program would be PROGRAMS * ROUNDS blocks at least.
    assert grown < PROGRAMS * ROUNDS // 4, f"{grown} blocks more after {ROUNDS} rounds"
