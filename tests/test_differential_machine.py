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
comparisons, callbacks and ``__del__`` that re-enter the purgatory (trigger, cancel, shut down,
force, watch, purge, drain, move the clock), armed by the worker's traps, and collections in
the middle of it all. So the subprocess fuzzer and this machine run the same code.

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
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any, ClassVar

import differential_worker as worker
import pytest
from hypothesis import HealthCheck, settings
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
STEPS = int(os.environ.get("PURGATORY_DIFFERENTIAL_STEPS", "3000"))
STEPS_PER_EXAMPLE = 40
#: A step that takes this long (s, on the loop's real clock) is held to hang.
TIMEOUT = float(os.environ.get("PURGATORY_DIFFERENTIAL_TIMEOUT", "60"))

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


def _rule(action: Callable[..., Any], name: str | None = None) -> Any:
    """A rule that runs the worker's `action` with the drawn a, b, c on both builds.

    Hypothesis picks rules uniformly: a second rule of the same action (`name`) weighs it up, and
    prints as the first, so that a failing program reads (and replays) as the action's name."""
    kind = worker.ACTIONS.index(action)

    def run(self: DifferentialMachine, a: int, b: int, c: int) -> None:
        self.step([kind, a, b, c])

    run.__name__ = run.__qualname__ = name or action.__name__
    return rule(a=ARG, b=ARG, c=ARG)(run)


class DifferentialMachine(RuleBasedStateMachine):
    """The plain rules: every call a user makes, with plain keys, thresholds and callbacks."""

    #: The worker module of each world, and how to enter the pure one (set by the fixture).
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
        type(self).failed_program = self.program
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

    watch_new = _rule(worker.watch_new)
    watch_more = _rule(worker.watch_new, "watch_new")
    set_ready = _rule(worker.set_ready)
    trigger = _rule(worker.trigger)
    trigger_more = _rule(worker.trigger, "trigger")
    force = _rule(worker.force)
    cancel_key = _rule(worker.cancel_key)
    advance = _rule(worker.advance)
    advance_to = _rule(worker.advance_to)
    purge = _rule(worker.purge)
    drain = _rule(worker.drain)
    run_pass = _rule(worker.run_pass)
    watch_again = _rule(worker.watch_again)
    shutdown = _rule(worker.shutdown)
    let_the_loop_run = _rule(worker.let_the_loop_run)
    bad_timeout = _rule(worker.bad_timeout)


class HostileMachine(DifferentialMachine):
    """The plain rules and the hostile ones: traps armed on keys' __hash__/__eq__/__del__,
    thresholds' comparisons, callbacks, operations' late __hash__ and __del__; hostile keys and
    thresholds watched, triggered and cancelled; collections."""

    arm = _rule(worker.arm)
    arm_more = _rule(worker.arm, "arm")
    watch_hostile = _rule(worker.watch_hostile)
    watch_hostile_more = _rule(worker.watch_hostile, "watch_hostile")
    trigger_hostile = _rule(worker.trigger_hostile)
    cancel_hostile = _rule(worker.cancel_hostile)
    collect = _rule(worker.collect)


def first_difference(native: dict[str, Any], pure: dict[str, Any]) -> str:
    for name in sorted(native.keys() | pure.keys()):
        if native.get(name) != pure.get(name):
            return (
                f"{name!r}:\n native: {json.dumps(native.get(name))}\n"
                f" pure:   {json.dumps(pure.get(name))}"
            )
    return "none"  # pragma: no cover - called on a difference


@pytest.fixture
def builds(request: pytest.FixtureRequest) -> Iterator[None]:
    """Both builds' worker modules on the machines; the process as the worker runs it: the
    automatic collection off (a __del__ runs in the collections a program makes), no log output
    (reports without a loop go to the logger, not compared)."""
    assert purgatory.IMPLEMENTATION == "native", (
        "the native core is not built in this environment, so there is nothing to compare the "
        "pure-Python modules with: build it (pip install -e .) or set PURGATORY_NO_EXTENSIONS=1"
    )
    worlds = pure_world(request.config)
    pure = worlds.import_module(worker.__name__)
    assert pure.purgatory.IMPLEMENTATION == "python"
    DifferentialMachine.native = worker
    DifferentialMachine.pure = pure
    DifferentialMachine.worlds = worlds
    DifferentialMachine.failed_program = None
    enabled = gc.isenabled()
    gc.disable()
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        if enabled:
            gc.enable()


def machine_settings(steps: int = STEPS, **overrides: Any) -> settings:
    return settings(
        max_examples=max(1, steps // STEPS_PER_EXAMPLE),
        stateful_step_count=STEPS_PER_EXAMPLE,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        **overrides,
    )


def test_both_builds_show_the_same_in_one_process(builds: None) -> None:
    run_state_machine_as_test(DifferentialMachine, settings=machine_settings())


def test_both_builds_survive_hostile_user_code_alike_in_one_process(builds: None) -> None:
    """Keys, thresholds, callbacks and __del__ that re-enter the purgatory, and collections in
    the middle of its calls: neither build crashes, and both do the same."""
    run_state_machine_as_test(HostileMachine, settings=machine_settings())
