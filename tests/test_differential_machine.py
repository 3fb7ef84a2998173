"""The differential test in one process: a hypothesis state machine drives a purgatory of each
build, the native core and the pure-Python modules, side by side, with the same rules, and
after every rule compares what a user could observe of each.

The two builds stand in one process as the core's tests run both (tests/implementations.py):
the package imported a second time with ``PURGATORY_NO_EXTENSIONS=1``, its modules (and the
test-support modules that import it) kept apart as the *pure world*. The rules are the
subprocess worker's actions (tests/differential_worker.py), imported once in each world, not
copied: a watch of keys, thresholds and timeouts, a trigger with or without a value, a force, a
cancel, the manual clock moved, a timer pass with a budget, a purge, a drain, a shutdown, bad
arguments; and in the hostile machine, keys whose ``__hash__``/``__eq__``, thresholds whose
comparisons, callbacks (an operation's, an awaiting task's done callback) and ``__del__`` that
re-enter the purgatory (trigger, cancel, shut down, force, watch, purge, drain, move the clock),
armed by the worker's traps, and collections in the middle of it all. So the subprocess fuzzer
and this machine run the same code.

After each rule the two steps' traces (what it returned or raised, the callbacks and traps it
caused in order, the loop's error reports, every operation's state and repr, the statistics,
the purgatory's repr, whether the invariants hold) and the event-log records must be equal; at
the end, the shutdown's too. Where no trap is armed, the invariants must hold as well; once one
is, only "no crash and no difference" is asserted (purgatory/_csrc/README.md, "What the rule
does not promise"), and once a trap waits for a ``__del__``, only "no crash": when an object
dies is not the same in both builds (differential_worker.py's "hostile user code"), and in
one process a collection frees both worlds' garbage at once.

A difference fails with hypothesis' shortest program (the rules as code, which replay it in
this machine, and ``@reproduce_failure``'s blob), and the same program as the subprocess
worker's JSON line. What this machine cannot survive is a crash of the native core: the
subprocess test (test_differential.py) runs the same actions in worker processes that may die,
and is what the fuzzer and ``make sanitize`` run; both are kept.

PURGATORY_DIFFERENTIAL_STEPS sets the rules each machine runs in all (`make fuzz`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import differential_worker as worker
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from implementations import Worlds, pure_world

import purgatory

pytestmark = pytest.mark.skipif(
    os.environ.get("PURGATORY_NO_EXTENSIONS", "") not in ("", "0"),
    reason="PURGATORY_NO_EXTENSIONS selects the pure-Python modules alone: nothing to compare",
)

#: The rules each of the two machines runs in all: examples of up to STEPS_PER_EXAMPLE rules
#: (PURGATORY_DIFFERENTIAL_STEPS, as for the subprocess test; `make fuzz STEPS=...`).
STEPS = int(os.environ.get("PURGATORY_DIFFERENTIAL_STEPS", "4000"))
STEPS_PER_EXAMPLE = 40
#: A step that takes this long (s, on the loop's real clock) is held to hang.
TIMEOUT = float(os.environ.get("PURGATORY_DIFFERENTIAL_TIMEOUT", "60"))

#: A file each program is written to before each of its steps (PURGATORY_DIFFERENTIAL_JOURNAL;
#: `make sanitize` sets it): a crash of the native core ends this process with no report from
#: hypothesis, and the file holds the program that crashed it, which ``python
#: tests/test_differential_machine.py FILE`` replays in one process (the worker takes it too).
JOURNAL = os.environ.get("PURGATORY_DIFFERENTIAL_JOURNAL", "")

ARG = st.integers(0, 40)  # a rule's a, b, c: the worker's action [kind, a, b, c]


class Side:
    """One build's run of the program: the worker module of its world, the worker's `Run`
    (world, purgatory, clock, trace), and an event loop of its own."""

    def __init__(
        self,
        module: ModuleType,
        enter: Callable[[], AbstractContextManager[None]],
        parameters: tuple[int, int, bool],
    ) -> None:
        self.module = module
        self.enter = enter
        with enter():
            self.run = module.Run(*parameters)
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self.run.handler)
        self.records = 0  # the event-log records already compared

    def do(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """Run a coroutine of the run's to its end, in this build's world: what it returned,
        made JSON as the worker prints it, or what escaped it."""
        with self.enter():
            try:
                result = self.loop.run_until_complete(asyncio.wait_for(make(), TIMEOUT))
            except Exception as exc:  # noqa: BLE001 - the observation (the worker's "failed")
                result = ["escaped", type(exc).__name__, str(exc)]
        return json.loads(json.dumps(result, default=repr))

    def new_records(self) -> Any:
        records = self.run.world.records[self.records :]
        self.records += len(records)
        return json.loads(json.dumps(records, default=repr))

    def close(self) -> None:
        """Close the world and the loop (as asyncio.run does: the tasks left are cancelled)."""
        world = self.run.world
        world.closed = True
        world.trap = None
        with self.enter():
            tasks = asyncio.all_tasks(self.loop)
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.close()


def _act(draw: tuple[int, ...]) -> Any:
    """The machine's rule: one of the worker's actions, drawn by its name from `draw` (a kind as
    many times as it weighs), run with the drawn a, b, c on both builds.

    One rule rather than one per action: hypothesis enables a random subset of a machine's rules
    in each example (swarm testing), and with an action per rule a trigger seldom found a
    watched operation made ready on its key (over 4,000 plain steps, none of 412 triggers
    completed anything; drawn so, 10 of 695 did). Drawn with the subprocess test's weights, a
    failing program still reads (and replays) as the actions' names:
    ``state.act(action='watch_new', a=0, b=0, c=5)``."""

    @rule(
        action=st.sampled_from([worker.ACTIONS[kind].__name__ for kind in draw]),
        a=ARG,
        b=ARG,
        c=ARG,
    )
    def act(self: DifferentialMachine, action: str, a: int, b: int, c: int) -> None:
        self.step([NAMED[action], a, b, c])

    return act


#: The worker's actions' kinds by name.
NAMED = {action.__name__: kind for kind, action in enumerate(worker.ACTIONS)}


class DifferentialMachine(RuleBasedStateMachine):
    """Both builds run each action the machine's rule draws; their observations are compared."""

    #: The worker module of each world, and the worlds (set by `both_builds`).
    native: ClassVar[ModuleType]
    pure: ClassVar[ModuleType]
    worlds: ClassVar[Worlds]
    #: The program of the last failure (the test of the test reads it).
    failed_program: ClassVar[dict[str, Any] | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.sides: tuple[Side, Side] | None = None
        self.program: dict[str, Any] = {}
        self.trapped = False  # a trap was armed: only "no crash and no difference"
        self.lifetimes = False  # a trap waits for a __del__: only "no crash"
        self.failed = False

    @initialize(
        purge_interval=st.sampled_from([0, 1, 3, 1000]),
        wheel_size=st.sampled_from([2, 3, 4, 8, 1024]),
        log=st.booleans(),
    )
    def start(self, purge_interval: int, wheel_size: int, log: bool) -> None:
        parameters = (purge_interval, wheel_size, log)
        self.program = {
            "actions": [],
            "purge_interval": purge_interval,
            "wheel_size": wheel_size,
            "log": log,
        }
        self.sides = (
            Side(self.native, contextlib.nullcontext, parameters),
            Side(self.pure, self.worlds.entered, parameters),
        )

    def step(self, action: list[int]) -> None:
        assert self.sides is not None
        self.program["actions"].append(action)
        if JOURNAL:
            Path(JOURNAL).write_text(json.dumps(self.program), encoding="utf-8")
        if worker.arms_a_trap(self.program):
            self.trapped = True
            self.lifetimes = worker.lifetime_dependent(self.program)
        native, pure = (self.observe(side, action) for side in self.sides)
        self.compare(native, pure, native.get("invariants"))

    @staticmethod
    def observe(side: Side, action: list[int]) -> dict[str, Any]:
        """One build's step: its trace (or what escaped it), and the records it added."""
        step = side.do(lambda: side.run.step(action))
        observed = step if isinstance(step, dict) else {"escaped": step}
        return {**observed, "records": side.new_records()}

    def compare(self, native: dict[str, Any], pure: dict[str, Any], invariants: Any) -> None:
        """The builds' observations must be equal (but where objects' lifetimes decide them),
        and the invariants hold where no trap was armed (a bug both builds share leaves their
        observations equal)."""
        if self.lifetimes:
            return
        if native != pure:
            self.fail(f"the builds differ: {first_difference(native, pure)}")
        if not self.trapped and invariants not in (None, "ok"):
            self.fail(f"both builds broke an invariant: {json.dumps(invariants)}")

    def fail(self, what: str) -> None:
        self.failed = True
        DifferentialMachine.failed_program = self.program
        raise AssertionError(
            f"{what}\nthe program as the subprocess worker's input (`python "
            f"tests/differential_worker.py < program.json`): {json.dumps(self.program)}"
        )

    def teardown(self) -> None:
        if self.sides is None:
            return
        try:
            if not self.failed:
                native, pure = (side.do(side.run.finish) for side in self.sides)
                last = native[-1] if isinstance(native, list) and native else {}
                final = last.get("final", {}) if isinstance(last, dict) else {}
                self.compare({"end": native}, {"end": pure}, final.get("invariants"))
        finally:
            for side in self.sides:
                side.close()
            gc.collect()  # what the program left: its worlds are closed, no trap fires


class PlainMachine(DifferentialMachine):
    """Every call a user makes, with plain keys, thresholds and callbacks."""

    act = _act(worker.PLAIN_DRAW)


class HostileMachine(DifferentialMachine):
    """The plain actions and the hostile ones: traps armed on keys' __hash__/__eq__/__del__,
    thresholds' comparisons, callbacks, operations' late __hash__ and __del__; hostile keys and
    thresholds watched, triggered and cancelled; collections."""

    act = _act(worker.HOSTILE_DRAW)


def first_difference(native: dict[str, Any], pure: dict[str, Any]) -> str:
    for name in sorted(native.keys() | pure.keys()):
        if native.get(name) != pure.get(name):
            return (
                f"{name!r}:\n native: {json.dumps(native.get(name))}\n"
                f" pure:   {json.dumps(pure.get(name))}"
            )
    return "none"  # pragma: no cover - called on a difference


@contextlib.contextmanager
def both_builds(worlds: Worlds) -> Iterator[None]:
    """Both builds' worker modules on the machines, and the process as the worker runs it: the
    automatic collection off (a __del__ runs in the collections a program makes), no log output
    (reports without a loop go to the logger, not compared)."""
    assert purgatory.IMPLEMENTATION == "native", (
        "the native core is not built in this environment, so there is nothing to compare the "
        "pure-Python modules with: build it (pip install -e .) or set PURGATORY_NO_EXTENSIONS=1"
    )
    pure = worlds.import_module(worker.__name__)
    assert pure.purgatory.IMPLEMENTATION == "python"
    DifferentialMachine.native = worker
    DifferentialMachine.pure = pure
    DifferentialMachine.worlds = worlds
    DifferentialMachine.failed_program = None
    enabled = gc.isenabled()
    gc.disable()
    # What the session holds out of the collections the programs make: a collection of the
    # whole pytest process took 0.1 s, a collection of what the program made takes little.
    gc.freeze()
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        gc.unfreeze()
        if enabled:
            gc.enable()


@pytest.fixture
def builds(request: pytest.FixtureRequest) -> Iterator[None]:
    with both_builds(pure_world(request.config)):
        yield


def machine_settings(
    steps: int = STEPS, per_example: int = STEPS_PER_EXAMPLE, **overrides: Any
) -> settings:
    return settings(
        max_examples=max(1, steps // per_example),
        stateful_step_count=per_example,
        deadline=None,
        print_blob=True,
        # Not the explain phase: it traces the lines of every rerun of the failing program, minutes
        # on top of the shrink, for lines the difference itself names better.
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        **overrides,
    )


def test_both_builds_show_the_same_in_one_process(builds: None) -> None:
    run_state_machine_as_test(PlainMachine, settings=machine_settings())


def test_both_builds_survive_hostile_user_code_alike_in_one_process(builds: None) -> None:
    """Keys, thresholds, callbacks and __del__ that re-enter the purgatory, and collections in
    the middle of its calls: neither build crashes, and both do the same."""
    run_state_machine_as_test(HostileMachine, settings=machine_settings())


def test_a_difference_is_found_and_shrunk(builds: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine can fail, and shows the shortest program: the pure build's trigger made to
    count one operation too many whenever it completes any. The shortest program that shows it
    is a watch, the operation made ready, and a trigger of its key: what is left after the
    shrink is that, or nearly."""
    cls = DifferentialMachine.pure.DelayedOperationPurgatory
    original = cls.check_and_complete

    def one_too_many(self: Any, key: Any, reached: Any = None) -> int:
        completed: int = original(self, key, reached)
        return completed + 1 if completed else completed

    monkeypatch.setattr(cls, "check_and_complete", one_too_many)
    # Short programs: found and shrunk in seconds (the shrink reruns the program many times).
    search = machine_settings(1000, per_example=10, database=None, derandomize=True)
    with pytest.raises(AssertionError, match=r"the builds differ: 'result'") as failure:
        run_state_machine_as_test(PlainMachine, settings=search)
    program = DifferentialMachine.failed_program
    assert program is not None
    names = [worker.ACTIONS[kind].__name__ for kind, _, _, _ in program["actions"]]
    # Shrunk from programs of up to 10 actions to a local minimum: a watch or two, the ready
    # flag, the trigger (hypothesis makes no promise of the global one: here it keeps a second
    # watch where a longer timeout in the first would do).
    assert len(names) <= 4, str(failure.value)
    assert set(names) == {"watch_new", "set_ready", "trigger"}, str(failure.value)
    assert names[-1] == "trigger", str(failure.value)
    # Replayable: the program as the subprocess worker's input, and as hypothesis' rules.
    assert json.dumps(program) in str(failure.value)
    notes = "\n".join(getattr(failure.value, "__notes__", []))
    assert "state.act(" in notes
    assert "action='trigger'" in notes
    assert "@reproduce_failure(" in notes


def replay(path: str) -> None:
    """Run a program (a journal, or a failure's JSON line) in the machine, both builds in this
    process, printing each action before it runs: the last one printed is the one that crashed."""
    program = json.loads(Path(path).read_text(encoding="utf-8"))
    worlds = Worlds()
    worlds.build()
    with both_builds(worlds):
        machine = HostileMachine()
        machine.start(program["purge_interval"], program["wheel_size"], program["log"])
        try:
            for action in program["actions"]:
                print(json.dumps(action), flush=True)
                machine.step(action)
        finally:
            machine.teardown()
    print("no difference")


if __name__ == "__main__":
    replay(sys.argv[1])
