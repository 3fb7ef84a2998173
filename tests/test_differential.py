"""One behaviour: the native core and the pure-Python modules, driven by the same programs, must
be indistinguishable to a user.

Hypothesis draws programs (watches of operations of every shape users write: plain, raising in
any callback, re-entrant, falsely claiming, async; triggers with and without a value, forces,
cancels, timer passes with and without a budget, drains, purges, shutdowns, bad arguments), and
two worker processes (tests/differential_worker.py), one per implementation, run each and
print everything observable: results and exceptions with their messages, callbacks in order,
error reports, event-log records, statistics, reprs, invariants. The traces must be equal.

Runs where the native core is built; with PURGATORY_NO_EXTENSIONS set there is nothing to
compare with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import purgatory

WORKER = Path(__file__).with_name("differential_worker.py")
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    os.environ.get("PURGATORY_NO_EXTENSIONS", "") not in ("", "0"),
    reason="PURGATORY_NO_EXTENSIONS selects the pure-Python modules alone: nothing to compare",
)


class Worker:
    """A worker process of one implementation, fed programs one at a time."""

    def __init__(self, pure: bool) -> None:
        env = dict(os.environ, PYTHONHASHSEED="0")
        env.pop("PURGATORY_NO_EXTENSIONS", None)
        if pure:
            env["PURGATORY_NO_EXTENSIONS"] = "1"
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.implementation = json.loads(self.read())["implementation"]

    def read(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise AssertionError(f"the {self.implementation!r} worker died (exit {code})")
        return line

    def run(self, program: dict[str, Any]) -> Any:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(program) + "\n")
        self.process.stdin.flush()
        return json.loads(self.read())

    def close(self) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.process.stdout.close()


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[Worker, Worker]]:
    native, pure = Worker(pure=False), Worker(pure=True)
    try:
        assert native.implementation == "native", (
            "the native core is not built in this environment, so there is nothing to compare "
            "the pure-Python modules with: build it (pip install -e .) or set "
            "PURGATORY_NO_EXTENSIONS=1"
        )
        assert pure.implementation == "python"
        yield native, pure
    finally:
        native.close()
        pure.close()


# Watches, triggers and time moves are what programs are mostly made of.
_KIND = st.sampled_from([0] * 8 + [1] * 4 + [2] * 5 + [3] * 2 + [5] * 3 + [6] * 2 + list(range(14)))
_ACTION = st.tuples(_KIND, st.integers(0, 40), st.integers(0, 40), st.integers(0, 40))
_PROGRAM = st.fixed_dictionaries(
    {
        "actions": st.lists(_ACTION.map(list), min_size=1, max_size=60),
        "purge_interval": st.sampled_from([0, 1, 3, 1000]),
        "wheel_size": st.sampled_from([2, 3, 4, 8, 1024]),
        "log": st.booleans(),
    }
)


def first_difference(a: Any, b: Any) -> str:
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return f"step {i}:\n native: {json.dumps(x)}\n pure:   {json.dumps(y)}"
        return f"lengths {len(a)} and {len(b)}"
    return f"native: {a!r}\npure: {b!r}"


@settings(
    max_examples=int(os.environ.get("PURGATORY_DIFFERENTIAL_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(program=_PROGRAM)
def test_both_implementations_behave_the_same(
    workers: tuple[Worker, Worker], program: dict[str, Any]
) -> None:
    native, pure = workers
    a, b = native.run(program), pure.run(program)
    assert a == b, first_difference(a, b)


def test_the_worker_observes_enough() -> None:
    """The comparison can fail: a program that completes, expires, raises and records shows all
    of it in the trace (a worker that printed nothing would make every program agree)."""
    env = dict(os.environ)
    program = {
        "actions": [[0, 0, 0, 5], [0, 2, 1, 4], [1, 0, 0, 0], [2, 0, 0, 0], [5, 8, 0, 0]],
        "purge_interval": 1,
        "wheel_size": 8,
        "log": True,
    }
    done = subprocess.run(
        [sys.executable, str(WORKER)],
        input=json.dumps(program) + "\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=True,
    )
    header, line = done.stdout.splitlines()
    assert json.loads(header)["implementation"] == purgatory.IMPLEMENTATION
    trace = json.loads(line)
    events = [event[0] for step in trace[:-1] for event in step["log"]]
    assert {"try", "complete", "expire"} <= set(events)
    assert any(step["result"] == ["returned", 1] for step in trace[:-1])
    records = trace[-1]["records"]
    assert ["end", "diff", 0, "completed", 0.0] in records
    assert any(record[:4] == ["end", "diff", 1, "expired"] for record in records)
