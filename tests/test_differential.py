"""One behaviour: the native core and the pure-Python modules, driven by the same programs, must
be indistinguishable to a user, and no program may crash either.

Hypothesis draws programs (watches of operations of every shape users write: plain, raising in
any callback, re-entrant, falsely claiming, async; triggers with and without a value, forces,
cancels, timer passes with and without a budget, drains, purges, shutdowns, bad arguments), and
two worker processes (tests/differential_worker.py), one per implementation, run each and
print everything observable: results and exceptions with their messages, callbacks in order,
error reports, event-log records, statistics, reprs, invariants. The traces must be equal.

The hostile programs add user code that re-enters the purgatory from inside its own calls:
keys whose __hash__ or __eq__, thresholds whose comparisons, callbacks (an operation's, an
awaiting task's done callback) and __del__ that trigger, cancel, shut down, force, watch, purge,
drain or move the clock, and collections in the middle of it all (the worker's "hostile user
code" says how). A worker that dies (a segfault, an AddressSanitizer report under `make
sanitize`) or hangs fails the program, which is printed as one JSON line (``python
tests/differential_worker.py < program.json`` replays it), and is replaced for the next one.
The workers run with PYTHONMALLOC=debug, unless set, so that an object used after it was freed
crashes rather than reads stale memory.

PURGATORY_DIFFERENTIAL_STEPS sets the length of each test (`make fuzz STEPS=1000000`).

test_differential_machine.py runs the same actions in one process, as a hypothesis state
machine; this test is kept for what that one cannot do: survive a crash of the native core
(and report it with the program), as the fuzzer and `make sanitize` need.

Runs where the native core is built; with PURGATORY_NO_EXTENSIONS set there is nothing to
compare with.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from differential_worker import HOSTILE_DRAW, PLAIN_DRAW, arms_a_trap, lifetime_dependent
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import purgatory

WORKER = Path(__file__).with_name("differential_worker.py")
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    os.environ.get("PURGATORY_NO_EXTENSIONS", "") not in ("", "0"),
    reason="PURGATORY_NO_EXTENSIONS selects the pure-Python modules alone: nothing to compare",
)


#: How long a worker may take over one program before it is held to hang (a program the
#: differential test draws runs in milliseconds; an AddressSanitizer build is slower).
TIMEOUT = float(os.environ.get("PURGATORY_DIFFERENTIAL_TIMEOUT", "60"))


class WorkerFailed(AssertionError):
    """A worker died (a crash: a signal, an AddressSanitizer report) or hung over a program."""


class Worker:
    """A worker process of one implementation, fed programs one at a time.

    A worker that dies or hangs over a program fails that program, with its exit status and the
    end of its stderr (a fault's traceback, an AddressSanitizer report), and is started again
    for the next one, so that hypothesis can go on shrinking the program that crashed it.
    """

    def __init__(self, pure: bool) -> None:
        self.pure = pure
        self.implementation = "python" if pure else "native"
        self.start()

    def start(self) -> None:
        env = dict(os.environ, PYTHONHASHSEED="0")
        # A fault's Python traceback on stderr (`make sanitize` turns it off: AddressSanitizer's
        # report of the same fault says more, and two handlers of one signal nest).
        env.setdefault("PYTHONFAULTHANDLER", "1")
        # Freed memory filled with a dead byte: an object used after it was freed crashes the
        # worker rather than reading what happens to be left there (`make sanitize` sets
        # PYTHONMALLOC=malloc for AddressSanitizer, which fills it itself).
        env.setdefault("PYTHONMALLOC", "debug")
        env.pop("PURGATORY_NO_EXTENSIONS", None)
        if self.pure:
            env["PURGATORY_NO_EXTENSIONS"] = "1"
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives with the process
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.implementation = json.loads(self.read(TIMEOUT))["implementation"]

    def read(self, timeout: float) -> str:
        stdout = self.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout)
        line = stdout.readline() if ready else ""
        if line:
            return line
        if not ready:
            self.process.kill()
        code = self.process.wait()
        self.stderr.seek(0)
        tail = self.stderr.read()[-6000:]
        what = "hung" if not ready else f"died ({describe_exit(code)})"
        raise WorkerFailed(f"the {self.implementation!r} worker {what}; its stderr:\n{tail}")

    def run(self, program: dict[str, Any]) -> Any:
        if self.process.poll() is not None:
            self.close()
            self.start()
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(program) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it died: read says how
        return json.loads(self.read(TIMEOUT))

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.stderr.close()


def describe_exit(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"


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


# Watches, triggers and time moves are what programs are mostly made of (the worker's PLAIN_DRAW).
_ACTION = st.tuples(st.sampled_from(PLAIN_DRAW), *[st.integers(0, 40)] * 3)
_PROGRAM = st.fixed_dictionaries(
    {
        "actions": st.lists(_ACTION.map(list), min_size=1, max_size=60),
        "purge_interval": st.sampled_from([0, 1, 3, 1000]),
        "wheel_size": st.sampled_from([2, 3, 4, 8, 1024]),
        "log": st.booleans(),
    }
)

# Hostile programs: traps armed often (differential_worker.py's `arm`), hostile keys and
# thresholds watched, triggered and cancelled, collections; among the plain actions (the
# worker's HOSTILE_DRAW).
_HOSTILE_KIND = st.sampled_from(HOSTILE_DRAW)
_HOSTILE_PROGRAM = st.fixed_dictionaries(
    {
        "actions": st.lists(
            st.tuples(_HOSTILE_KIND, *[st.integers(0, 40)] * 3).map(list),
            min_size=4,
            max_size=60,
        ),
        "purge_interval": st.sampled_from([0, 1, 3, 1000]),
        "wheel_size": st.sampled_from([2, 3, 4, 8, 1024]),
        "log": st.booleans(),
    }
)

#: The actions each of the two random tests runs, as programs of a few to 60 actions
#: (PURGATORY_DIFFERENTIAL_STEPS; the default keeps the module under a minute; `make fuzz
#: STEPS=1000000` for a long run). Hypothesis draws programs of 6.4 actions on average from
#: _PROGRAM and of 9.4 from _HOSTILE_PROGRAM (measured over 1,000 draws each): the examples are
#: the steps over these.
STEPS = int(os.environ.get("PURGATORY_DIFFERENTIAL_STEPS", "4000"))


def _settings(mean_actions: float) -> settings:
    return settings(
        max_examples=max(1, round(STEPS / mean_actions)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def first_difference(a: Any, b: Any) -> str:
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return f"step {i}:\n native: {json.dumps(x)}\n pure:   {json.dumps(y)}"
        return f"lengths {len(a)} and {len(b)}"
    return f"native: {a!r}\npure: {b!r}"


def compare(workers: tuple[Worker, Worker], program: dict[str, Any]) -> None:
    """Run `program` on both workers: a crash of either, or a difference, fails with the program
    (one JSON line: ``python tests/differential_worker.py < program.json`` runs it again)."""
    native, pure = workers
    replay = f"the program: {json.dumps(program)}"
    try:
        a = native.run(program)
        b = pure.run(program)
    except WorkerFailed as exc:
        raise WorkerFailed(f"{exc}\n{replay}") from None
    snapshots = [step.get("final", step) for step in a if isinstance(step, dict)]
    broken = [shot for shot in snapshots if shot.get("invariants", "ok") != "ok"]
    if lifetime_dependent(program):
        return  # run for crashes only (see differential_worker.py's "hostile user code")
    assert a == b, f"{first_difference(a, b)}\n{replay}"
    # Without re-entering user code, both builds must also keep the invariants (a bug they
    # share leaves their traces equal). With it, they promise memory safety and one behaviour,
    # not consistency: user code that shuts down, drains or cancels from inside an operation's
    # __hash__, a key's __eq__ or a threshold's comparison can leave the counts off on both alike
    # (purgatory/_csrc/README.md, "Known limit"; tests/test_reentrancy.py pins the cases fixed).
    if broken and not arms_a_trap(program):
        raise AssertionError(f"both builds broke an invariant: {json.dumps(broken[0])}\n{replay}")


@_settings(6.4)
@given(program=_PROGRAM)
def test_both_implementations_behave_the_same(
    workers: tuple[Worker, Worker], program: dict[str, Any]
) -> None:
    compare(workers, program)


def _program(*actions: list[int]) -> dict[str, Any]:
    return {"actions": list(actions), "purge_interval": 0, "wheel_size": 8, "log": False}


@_settings(9.4)
@given(program=_HOSTILE_PROGRAM)
# Programs this vocabulary found crashing the native core (issue 33's rows), run every time.
# Row 1: a threshold watch by an operation the purgatory alone holds, released by a trigger
# (its marks a dict now); a key's second __eq__ (the lookup in those marks, as another
# operation watches the key) cancels the key.
@example(program=_program([15, 0, 8, 3], [16, 0, 4, 0], [14, 19, 3, 0], [15, 0, 0, 5]))
# Row 2: a watch of {h0: 5, h1: 7}; a trigger of h0 at 5, whose second __eq__ (the lone
# watcher's marks) triggers h1 at 7.
@example(program=_program([15, 0, 3, 3], [14, 19, 1, 13], [16, 0, 2, 0]))
# Found by a random search over this vocabulary (then shrunk): a watch of {h0: T(0), h1: T(7)}
# (hostile thresholds); a plain watch of h1 by another operation, whose lookup in the lone
# watcher's marks runs a third __eq__ that triggers h1 at 7 (the marks replaced mid-lookup).
@example(program=_program([15, 0, 22, 15], [14, 28, 33, 13], [15, 4, 39, 13]) | {"log": True})
# Found so too. Row 3: the program's operation class watched (a generator of keys, a hostile
# threshold), its __hash__ then assigned, which shuts the purgatory down and collects as the
# next operation's watch hashes it.
@example(program=_program([15, 2, 15, 37], [14, 7, 7, 15], [15, 30, 16, 20]))
# Row 2 by __hash__: a watch of {h2: None, h1: 2}; a plain watch of h2 by another operation,
# whose second __hash__ (the lookup in the lone watcher's marks) triggers h1 at 7.
@example(program=_program([15, 20, 13, 30], [14, 18, 33, 13], [15, 26, 16, 30]))
# Both builds alike: an operation's late __hash__ triggers its key as force_complete queues it
# for the purge, taking it off its last list (the queue kept it, against the invariants).
@example(
    program=_program([15, 0, 0, 0], [14, 34, 0, 0], [0, 0, 0, 0], [3, 0, 0, 0]) | {"wheel_size": 2}
)
def test_both_implementations_survive_hostile_user_code_alike(
    workers: tuple[Worker, Worker], program: dict[str, Any]
) -> None:
    """Keys, thresholds, callbacks and __del__ that re-enter the purgatory, and collections in
    the middle of its calls: neither build crashes, and both do the same."""
    compare(workers, program)


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


def test_a_worker_that_dies_fails_the_program_and_is_replaced(
    workers: tuple[Worker, Worker],
) -> None:
    """A crash fails the comparison with the program printed (a worker killed by a signal here,
    as a segfault kills it; AddressSanitizer makes it exit with status 1), and the next program
    runs on a new worker."""
    program = {"actions": [[0, 0, 0, 5]], "purge_interval": 0, "wheel_size": 8, "log": False}
    with pytest.raises(
        WorkerFailed, match=r"(?s)'native' worker died \(signal SIGKILL\).*the program: "
    ):
        compare(workers, {**program, "die": "native"})
    compare(workers, program)
