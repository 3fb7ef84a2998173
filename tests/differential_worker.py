"""Runs programs of purgatory calls and prints what a user could observe of each: the worker of
the differential test (test_differential.py), started once per implementation.

A program is a list of actions, each a list of four small ints ``[kind, a, b, c]`` (the test's
hypothesis strategy draws them, so that a failing program shrinks). The worker reads one
program (JSON) per line on stdin and writes one trace (JSON) per line on stdout: for every
action, what it returned or raised (type and message), the callbacks it caused in order, the
loop's error reports, the event log's records, every operation's state and repr, the
statistics, and whether the invariant checks hold. Nothing in a trace depends on addresses or
on the wall clock, so the traces of the two implementations must be equal.

Run: ``python tests/differential_worker.py`` (the implementation is the one the environment
selects: ``PURGATORY_NO_EXTENSIONS=1`` for the pure-Python modules).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Hashable
from typing import Any

import purgatory
from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory.testing import ManualClock, check_invariants

KEYS: tuple[Hashable, ...] = ("k0", "k1", ("k", 2), 3, "k4")
TIMEOUTS = (0.0, 0.0005, 0.001, 0.0105, 0.05, 0.2, 1.0, 30.0, 3600.0)
STEPS = (0.0, 0.0004, 0.001, 0.002, 0.0105, 0.05, 0.3, 1.0, 40.0)
REACHED = (None, 0, 1, 2, 5, 10, 2.5, 100)
BUDGETS = (None, 0, 1, 3, 64)


class World:
    """One program's purgatory, clock, operations and trace."""

    def __init__(self, purge_interval: int, wheel_size: int, with_log: bool) -> None:
        self.clock = ManualClock()
        self.log: list[Any] = []  # what the current action caused, in order
        self.records: list[Any] = []
        self.ops: list[Operation] = []
        self.trap: Trap | None = None  # the hostile user code armed, if any (see Trap)
        self.quiet = False  # no trap fires while the snapshot reads the purgatory
        self.closed = False  # the program ended: what its keys' __del__ runs later is not its
        self.mortals = 0  # operations of `MortalOperation` created (they are not in `ops`)
        self.tasks: list[asyncio.Future[Any]] = []  # the awaiting tasks (`await_op`) kept
        # A class of the program's own, so that a program that assigns its __hash__ changes no
        # other program's operations.
        self.op_class: type[Operation] = type("Operation", (Operation,), {"__slots__": ()})
        self.purgatory = DelayedOperationPurgatory[Any](
            "diff",
            clock=self.clock,
            purge_interval=purge_interval,
            wheel_size=wheel_size,
            tick=0.001,
            event_log=Recorder(self) if with_log else None,
        )

    def op_id(self, op: object) -> int:
        return getattr(op, "ident", -1)


class Recorder:
    """An event log (the protocol's calls) that writes into the trace."""

    def __init__(self, world: World) -> None:
        self.world = world

    def record_watch(  # noqa: PLR0917 - the EventLog protocol's signature
        self,
        purgatory: str,
        op: Any,
        keys: tuple[Hashable, ...],
        thresholds: tuple[Any, ...] | None,
        watched_at: float,
        deadline: float,
    ) -> None:
        self.world.records.append(
            ["watch", purgatory, op.ident, repr(keys), repr(thresholds), watched_at, deadline]
        )

    def record_end(self, purgatory: str, op: Any, outcome: str, ended_at: float) -> None:
        self.world.records.append(["end", purgatory, op.ident, outcome, ended_at])

    def flush(self) -> None:
        self.world.records.append(["flush"])


class Operation(DelayedOperation[Any]):
    """Completes once `ready`; its behaviour (`kind`) is one of the shapes users write."""

    __slots__ = ("__weakref__", "ident", "kind", "ready", "world")

    def __init__(self, world: World, kind: int, timeout: float, keep: bool = True) -> None:
        super().__init__(timeout)
        self.world = world
        self.kind = kind
        self.ready = False
        if keep:
            self.ident = len(world.ops)
            world.ops.append(self)
        else:  # held by the purgatory alone (MortalOperation)
            self.ident = 1000 + world.mortals
            world.mortals += 1

    def try_complete(self) -> bool:
        self.world.log.append(["try", self.ident])
        fire(self.world, "try")
        if self.kind == 1 and self.ready:
            raise ValueError(f"try_complete of {self.ident} failed")
        if self.kind == 5 and not self.ready:
            return True  # a false claim
        if self.ready:
            return self.force_complete()
        return False

    def on_complete(self) -> Any:
        self.world.log.append(["complete", self.ident, self.is_expired])
        fire(self.world, "complete")
        if self.kind == 2:
            raise RuntimeError(f"on_complete of {self.ident} failed")
        if self.kind == 4:  # re-entrant: a trigger, and a force of the previous operation
            self.world.log.append(["reenter", self.world.purgatory.check_and_complete(KEYS[0])])
            if self.ident > 0:
                self.world.log.append(["reforce", self.world.ops[self.ident - 1].force_complete()])
        return ["result", self.ident]

    def on_expiration(self) -> None:
        self.world.log.append(["expire", self.ident])
        fire(self.world, "expire")
        if self.kind == 3:
            raise LookupError(f"on_expiration of {self.ident} failed")


class AsyncOperation(Operation):
    """An ``async def try_complete``: attempts run as tasks, one at a time per operation."""

    __slots__ = ()

    async def try_complete(self) -> bool:  # type: ignore[override]
        self.world.log.append(["atry", self.ident])
        await asyncio.sleep(0)
        return self.force_complete() if self.ready else False


def outcome(call: Any) -> Any:
    """What a call returned (made JSON-safe) or raised (its type and message)."""
    try:
        result = call()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return ["raised", type(exc).__name__, str(exc)]
    return ["returned", safe(result)]


def safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, list | tuple):
        return [safe(item) for item in value]
    if isinstance(value, Operation):
        return ["op", value.ident]
    return repr(value)


def keys_for(pattern: int, first: int) -> Any:
    """The keys argument of a watch: a tuple, a list, a mapping to thresholds, or bad ones."""
    a, b = KEYS[first % len(KEYS)], KEYS[(first + 1) % len(KEYS)]
    shapes: list[Any] = [
        (a,),
        (a, b),
        [a, b, a],
        {a: 2},
        {a: 1, b: 5},
        {a: None, b: 3},
        {a: 2.5, b: 2.5},
        (),  # empty: refused
        "k0",  # a string: refused
        {a: math.nan},  # NaN threshold: refused
        {a: (1, 2)},  # a tuple threshold
    ]
    return shapes[pattern % len(shapes)]


def pick(world: World, index: int) -> Operation | None:
    return world.ops[index % len(world.ops)] if world.ops else None


async def watch_new(world: World, a: int, b: int, c: int) -> Any:
    p = world.purgatory
    cls = AsyncOperation if a % 7 == 6 else world.op_class
    op = cls(world, a % 7, TIMEOUTS[c % len(TIMEOUTS)])
    if b % 13 == 12:
        return outcome(lambda: p.try_complete_else_watch(op, keys_for(0, a), threshold=b % 4))
    keys = keys_for(b, a + c)
    return outcome(lambda: p.try_complete_else_watch(op, keys))


async def set_ready(world: World, a: int, b: int, c: int) -> Any:
    chosen = pick(world, a)
    if chosen is not None:
        chosen.ready = True


async def trigger(world: World, a: int, b: int, c: int) -> Any:
    key, reached = KEYS[a % len(KEYS)], REACHED[b % len(REACHED)]
    return outcome(lambda: world.purgatory.check_and_complete(key, reached))


async def force(world: World, a: int, b: int, c: int) -> Any:
    forced = pick(world, a)
    return None if forced is None else outcome(forced.force_complete)


async def cancel_key(world: World, a: int, b: int, c: int) -> Any:
    return outcome(lambda: world.purgatory.cancel_for_key(KEYS[a % len(KEYS)]))


async def advance(world: World, a: int, b: int, c: int) -> Any:
    return outcome(lambda: world.clock.advance(STEPS[a % len(STEPS)]))


async def advance_to(world: World, a: int, b: int, c: int) -> Any:
    return outcome(lambda: world.clock.advance_to(world.clock.now() + STEPS[a % len(STEPS)]))


async def purge(world: World, a: int, b: int, c: int) -> Any:
    return outcome(world.purgatory.purge)


async def drain(world: World, a: int, b: int, c: int) -> Any:
    answers: list[Any] = [None, lambda op: op.force_complete(), lambda op: None]
    return outcome(lambda: world.purgatory.drain(answers[a % len(answers)]))


async def run_pass(world: World, a: int, b: int, c: int) -> Any:
    """A driver's pass with a budget (the Timer protocol)."""
    timer = world.purgatory._timer
    return outcome(lambda: timer.run_pass(world.clock.now(), BUDGETS[a % len(BUDGETS)]))


async def watch_again(world: World, a: int, b: int, c: int) -> Any:
    again = pick(world, a)
    if again is None:
        return None
    return outcome(lambda: world.purgatory.try_complete_else_watch(again, keys_for(b, c)))


async def shutdown(world: World, a: int, b: int, c: int) -> Any:
    try:
        await world.purgatory.shutdown()
    except Exception as exc:  # noqa: BLE001 - the observation
        return ["raised", type(exc).__name__, str(exc)]
    return ["returned", None]


async def let_the_loop_run(world: World, a: int, b: int, c: int) -> Any:
    for _ in range(1 + a % 3):
        await asyncio.sleep(0)


async def bad_timeout(world: World, a: int, b: int, c: int) -> Any:
    timeout: Any = [math.inf, -1.0, "1", True, 10**400][a % 5]
    return outcome(lambda: Operation(world, 0, timeout))


# -- hostile user code --------------------------------------------------------------------------
#
# What a C core must survive: user code that runs inside the purgatory's own calls and calls the
# purgatory again. A program arms a *trap* (`arm`): the next time, or the next but one or two,
# that user code of one kind runs (a hostile key's __hash__, __eq__ or __del__, a hostile
# threshold's comparison, an operation's try_complete, on_complete or on_expiration, an
# operation's __hash__ assigned to its class after its first watch, a dying operation's
# __del__), the trap goes off, once or a few times (nested in its own reaction too), and runs a
# *reaction*: a trigger, with or without a value, a cancel_for_key (of the key whose code runs,
# or another), a shutdown, a force, a new watch, a collection, a purge, a drain, a move of the
# clock; most reactions are followed by a collection. What a reaction returned or raised goes
# into the trace where it ran. Hostile keys are made anew for every use, so that a lookup
# compares them (__eq__) with the one the purgatory holds, and two of them share a hash.
# Mortal operations are held by the purgatory alone, so that they die the moment it lets them
# go, while the C may still hold them. A task may await an operation (`await_op`): its done
# callback, which the loop runs once the outcome is known, makes a reaction too.
#
# __del__ runs when an object dies, and when the purgatory lets go of an object is not the same
# in both builds (a traceback's frames in the pure one hold what the C holds in no frame). So
# that both run a __del__ at the same point, the objects with one (`DyingKey`,
# `DyingOperation`) are each in a reference cycle (with themselves), and the worker runs with
# the automatic collection off: they die in the collections a program makes (`collect`, and
# the reactions' from inside the purgatory's calls), which free every unreachable object at
# once, whatever held it. That is not enough: the pure build keeps some objects alive longer
# (an exception that on_complete raised is kept with the operation, and its traceback's frames
# hold the timer pass's list of the operations it expired), so a trap on a __del__ may go off
# at another step in each build. A program that arms one (`lifetime_dependent`) is run for
# crashes, the traces not compared.

HOOKS = ("hash", "eq", "del", "cmp", "try", "complete", "expire", "ophash", "opdel")
HOSTILE_NAMES = ("h0", "h1", "h2")
HOSTILE_HASHES = {"h0": 1, "h1": 1, "h2": 2}  # h0 and h1 collide: a lookup of one compares both


class Trap:
    """User code armed to re-enter the purgatory `shots` times: at the `countdown`-th run of
    `hook`, and at the next runs (within its own reaction too, nested)."""

    __slots__ = ("countdown", "hook", "param", "reaction", "shots")

    def __init__(self, hook: str, countdown: int, shots: int, reaction: int, param: int) -> None:
        self.hook = hook
        self.countdown = countdown
        self.shots = shots
        self.reaction = reaction
        self.param = param


def fire(world: World, hook: str, own: Hashable | None = None) -> None:
    """User code of kind `hook` runs: the armed trap goes off if it waits for it (`own` is the
    hostile key whose code runs, for a reaction on "the same key")."""
    trap = world.trap
    if trap is None or trap.hook != hook or world.quiet:
        return
    if trap.countdown > 0:
        trap.countdown -= 1
        return
    trap.shots -= 1
    if trap.shots == 0:
        world.trap = None
    name, call = reaction(world, trap.reaction, trap.param, own)
    world.log.append(["trap", hook, name, outcome(call)])


class HostileKey:
    """A key whose __hash__ and __eq__ are user code that may re-enter the purgatory."""

    __slots__ = ("name", "world")

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name

    def __hash__(self) -> int:
        fire(self.world, "hash", self.name)
        return HOSTILE_HASHES[self.name]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HostileKey):
            return NotImplemented
        fire(self.world, "eq", self.name)
        return self.name == other.name

    def __repr__(self) -> str:
        return f"HostileKey({self.name!r})"


class DyingKey(HostileKey):
    """A hostile key with a __del__ too, which dies in a collection (see above)."""

    __slots__ = ("cycle",)

    def __init__(self, world: World, name: str) -> None:
        super().__init__(world, name)
        self.cycle = self

    def __del__(self) -> None:
        if not self.world.closed:
            fire(self.world, "del", self.name)


class HostileThreshold:
    """A threshold whose comparisons are user code that may re-enter the purgatory."""

    __slots__ = ("value", "world")

    def __init__(self, world: World, value: int) -> None:
        self.world = world
        self.value = value

    def _other(self, other: object) -> Any:
        fire(self.world, "cmp")
        return other.value if isinstance(other, HostileThreshold) else other

    def __lt__(self, other: object) -> bool:
        return bool(self.value < self._other(other))

    def __le__(self, other: object) -> bool:
        return bool(self.value <= self._other(other))

    def __gt__(self, other: object) -> bool:
        return bool(self.value > self._other(other))

    def __ge__(self, other: object) -> bool:
        return bool(self.value >= self._other(other))

    def __eq__(self, other: object) -> bool:
        return bool(self.value == self._other(other))

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"HostileThreshold({self.value!r})"


class MortalOperation(Operation):
    """An operation only the purgatory holds: it dies as soon as the purgatory lets it go (while
    the C may still hold it), unseen by the trace."""

    __slots__ = ()

    def __init__(self, world: World, timeout: float) -> None:
        super().__init__(world, 0, timeout, keep=False)


class DyingOperation(MortalOperation):
    """A mortal operation with a __del__, which dies in a collection (see above)."""

    __slots__ = ("cycle",)

    def __init__(self, world: World, timeout: float) -> None:
        super().__init__(world, timeout)
        self.cycle = self

    def __del__(self) -> None:
        if not self.world.closed:
            fire(self.world, "opdel")


def hostile_key(world: World, index: int) -> Hashable:
    """A key for a hostile action: a new hostile key (three times in four) or a plain one."""
    if index % 4 == 3:
        return KEYS[index // 4 % len(KEYS)]
    cls = DyingKey if index % 8 == 1 else HostileKey
    return cls(world, HOSTILE_NAMES[index % len(HOSTILE_NAMES)])


def hostile_value(world: World, index: int) -> Any:
    """A threshold or a reached value: a hostile threshold (two times in three), or an int."""
    value = (0, 2, 5, 7, 100)[index % 5]
    return value if index % 3 == 2 else HostileThreshold(world, value)


def reaction(
    world: World, kind: int, param: int, own: Hashable | None
) -> tuple[str, Callable[[], Any]]:
    """The re-entrant call a trap makes: its name and the call."""
    same = own is not None and param % 2 == 0
    key = HostileKey(world, str(own)) if same else hostile_key(world, param)
    name, make = REACTIONS[WEIGHTED[kind % len(WEIGHTED)]]
    call = make(world, param, key)
    if param % 8 < 3:
        return name, call
    return f"{name}, collect", lambda: [safe(call()), gc.collect() >= 0]  # frees the dying


def _force(world: World, param: int, key: Hashable) -> Callable[[], Any]:
    chosen = pick(world, param)
    return (lambda: None) if chosen is None else chosen.force_complete


def _watch(world: World, param: int, key: Hashable) -> Callable[[], Any]:
    op = world.op_class(world, 0, TIMEOUTS[param % len(TIMEOUTS)])
    return lambda: world.purgatory.try_complete_else_watch(op, (key,))


_Make = Callable[[World, int, Hashable], Callable[[], Any]]

#: The reactions of a trap, by their index: a name and what makes the call.
REACTIONS: tuple[tuple[str, _Make], ...] = (
    ("trigger", lambda w, n, k: lambda: w.purgatory.check_and_complete(k)),
    ("trigger at", lambda w, n, k: lambda: w.purgatory.check_and_complete(k, hostile_value(w, n))),
    ("cancel", lambda w, n, k: lambda: [safe(op) for op in w.purgatory.cancel_for_key(k)]),
    ("shutdown", lambda w, n, k: lambda: shutdown_now(w.purgatory)),
    ("force", _force),
    ("watch", _watch),
    ("collect", lambda w, n, k: lambda: gc.collect() >= 0),
    ("purge", lambda w, n, k: w.purgatory.purge),
    ("drain", lambda w, n, k: lambda: w.purgatory.drain(None)),
    ("advance", lambda w, n, k: lambda: w.clock.advance(STEPS[n % len(STEPS)])),
    ("set ready", lambda w, n, k: lambda: set_all_ready(w)),
)
#: A trap's reaction by its draw: what frees or moves what the C holds, more often.
WEIGHTED = (0, 1, 1, 2, 2, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 1)


def shutdown_now(p: DelayedOperationPurgatory[Any]) -> None:
    """A shutdown from synchronous user code: with a driven clock it never suspends."""
    try:
        p.shutdown().send(None)
    except StopIteration:
        return
    raise AssertionError("a shutdown with a driven clock suspended")


def set_all_ready(world: World) -> int:
    for op in world.ops:
        op.ready = True
    return len(world.ops)


def hostile_hash(op: object) -> int:
    world = getattr(op, "world", None)
    if world is not None:
        fire(world, "ophash")
    return object.__hash__(op)


async def arm(world: World, a: int, b: int, c: int) -> Any:
    hook = HOOKS[a % len(HOOKS)]
    world.trap = Trap(hook, (0, 0, 1, 2)[(a // len(HOOKS)) % 4], 1 + c % 3, b, c)
    if hook == "ophash":  # assigned after the class's first watch: admission checked it before
        world.op_class.__hash__ = hostile_hash  # type: ignore[method-assign,assignment]
    trap = world.trap
    reacts = REACTIONS[WEIGHTED[b % len(WEIGHTED)]][0]
    return ["armed", hook, trap.countdown, trap.shots, reacts, c]


def hostile_keys(world: World, a: int, b: int, c: int) -> Any:
    """The keys of a hostile watch: hostile keys and thresholds in the shapes of `keys_for`
    (made with the traps held: a mapping's own hashes and comparisons are not the purgatory's)."""
    k1, k2 = hostile_key(world, a), hostile_key(world, a + 1 + b // 7)
    shape = b % 8
    if shape == 7:  # a generator: the keys are made while the watch reads them
        return (key for key in (k1, k2))
    world.quiet = True
    try:
        return (
            (k1,),
            (k1, k2),
            [k1, k2, hostile_key(world, a)],
            {k1: 5, k2: 7},  # mixed thresholds: the watcher's marks are a dict
            {k1: hostile_value(world, c)},
            {k1: None, k2: 2},
            {k1: hostile_value(world, c), k2: hostile_value(world, c + 3)},
        )[shape]
    finally:
        world.quiet = False


async def watch_hostile(world: World, a: int, b: int, c: int) -> Any:
    p = world.purgatory
    timeout = TIMEOUTS[c % len(TIMEOUTS)]
    op: Operation = (
        (MortalOperation, MortalOperation, DyingOperation)[c // 5 % 3](world, timeout)
        if c % 5 >= 3
        else world.op_class(world, a % 6, timeout)
    )
    keys = hostile_keys(world, a, b, c)
    if b % 8 in (0, 1, 7) and b // 8 % 2 == 1:  # a collection of keys, one threshold for all
        threshold = hostile_value(world, c)
        return outcome(lambda: p.try_complete_else_watch(op, keys, threshold=threshold))
    return outcome(lambda: p.try_complete_else_watch(op, keys))


async def trigger_hostile(world: World, a: int, b: int, c: int) -> Any:
    key = hostile_key(world, a)
    if b % 3 == 0:
        return outcome(lambda: world.purgatory.check_and_complete(key))
    reached = hostile_value(world, b)
    return outcome(lambda: world.purgatory.check_and_complete(key, reached))


async def cancel_hostile(world: World, a: int, b: int, c: int) -> Any:
    key = hostile_key(world, a)
    return outcome(lambda: [safe(op) for op in world.purgatory.cancel_for_key(key)])


async def collect(world: World, a: int, b: int, c: int) -> Any:
    return outcome(lambda: gc.collect() >= 0)


async def await_op(world: World, a: int, b: int, c: int) -> Any:
    """A task awaits an operation, and its done callback, user code the loop runs once the
    outcome is known, logs the outcome and re-enters the purgatory (a trap's reaction)."""
    awaited = pick(world, a)
    if awaited is None:
        return None

    async def wait() -> Any:
        return await awaited

    def done(task: asyncio.Future[Any]) -> None:
        if world.closed:  # cancelled as the program's loop closes: not the program's
            return
        got = ["cancelled"] if task.cancelled() else outcome(task.result)
        name, call = reaction(world, b, c, None)
        world.log.append(["done", awaited.ident, got, name, outcome(call)])

    task = asyncio.ensure_future(wait())
    task.add_done_callback(done)
    world.tasks.append(task)
    return ["awaiting", awaited.ident]


#: The actions, by their kind (a program's action is [kind, a, b, c]).
ACTIONS = (
    watch_new,
    set_ready,
    trigger,
    force,
    cancel_key,
    advance,
    advance_to,
    purge,
    drain,
    run_pass,
    watch_again,
    shutdown,
    let_the_loop_run,
    bad_timeout,
    arm,
    watch_hostile,
    trigger_hostile,
    cancel_hostile,
    collect,
    await_op,
)


def arms_a_trap(program: dict[str, Any]) -> bool:
    """Whether `program` arms a trap at all: user code of its that re-enters the purgatory."""
    arm_kind = ACTIONS.index(arm)
    return any(kind % len(ACTIONS) == arm_kind for kind, _, _, _ in program["actions"])


def lifetime_dependent(program: dict[str, Any]) -> bool:
    """Whether `program` arms a trap on a __del__ (its trace depends on when objects die)."""
    arm_kind = ACTIONS.index(arm)
    return any(
        kind % len(ACTIONS) == arm_kind and HOOKS[a % len(HOOKS)] in LIFETIME_HOOKS
        for kind, a, _, _ in program["actions"]
    )


LIFETIME_HOOKS = ("del", "opdel")

#: The kinds of the hostile actions (the hostile test weighs them up).
HOSTILE_KINDS = tuple(
    ACTIONS.index(action)
    for action in (arm, watch_hostile, trigger_hostile, cancel_hostile, collect, await_op)
)
_ARM, _WATCH_HOSTILE, _TRIGGER_HOSTILE, _CANCEL_HOSTILE, _COLLECT, _AWAIT = HOSTILE_KINDS

#: The kinds a plain program's actions are drawn from, each as often as it appears: watches,
#: triggers and time moves are what programs are mostly made of (the subprocess test and the
#: state machine draw from it).
PLAIN_DRAW = (0,) * 8 + (1,) * 4 + (2,) * 5 + (3,) * 2 + (5,) * 3 + (6,) * 2 + tuple(range(14))
#: The kinds a hostile program's actions are drawn from (the subprocess test, the state machine
#: and tools/fuzz_differential.py): traps armed often, hostile keys and thresholds watched,
#: triggered and cancelled, collections; among the plain actions.
HOSTILE_DRAW = (
    (_ARM,) * 5
    + (_WATCH_HOSTILE,) * 6
    + (_TRIGGER_HOSTILE,) * 4
    + (_CANCEL_HOSTILE,) * 2
    + (_COLLECT,) * 3
    + (_AWAIT,) * 2
    + (0,) * 3
    + (1,) * 2
    + (2,) * 2
    + (3, 5, 5, 6, 7, 8, 11)
    + tuple(range(14))
)


def snapshot(world: World) -> Any:
    world.quiet = True
    try:
        return observe(world)
    finally:
        world.quiet = False


def observe(world: World) -> Any:
    p = world.purgatory
    stats = p.statistics()
    try:
        check_invariants(p)
        invariants: Any = "ok"
    except AssertionError as exc:
        invariants = ["broken", str(exc)]
    return {
        "stats": [
            stats.watched,
            stats.delayed,
            stats.keys,
            stats.completed,
            stats.expired,
            stats.cancelled,
            stats.purged,
            stats.timer_passes,
            stats.purges,
            safe(stats.next_deadline_in),
        ],
        "counts": [p.watched(), p.num_delayed()],
        "ops": [[repr(op), op.is_completed, op.is_expired, op.is_cancelled] for op in world.ops],
        "invariants": invariants,
        "repr": repr(p),
    }


class Run:
    """One program's run, an action at a time: the worker runs a whole program (`run_program`),
    the in-process state machine (test_differential_machine.py) one action per rule, on a
    purgatory of each build, and compares each step's trace."""

    def __init__(self, purge_interval: int, wheel_size: int, log: bool) -> None:
        self.world = World(purge_interval, wheel_size, log)
        #: The loop's error reports (`handler`, the loop's exception handler) not yet traced.
        self.reports: list[Any] = []

    def handler(self, _: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        self.reports.append([context.get("message"), type(exc).__name__, str(exc)])

    async def step(self, action: list[int]) -> dict[str, Any]:
        """Run one action: what it returned, what it caused, and the purgatory after it."""
        world = self.world
        kind, a, b, c = action
        result = await ACTIONS[kind % len(ACTIONS)](world, a, b, c)
        world.log.extend(["report", *report] for report in self.reports)
        self.reports.clear()
        step = {"action": action, "result": result, "log": world.log, **snapshot(world)}
        world.log = []
        return step

    async def finish(self) -> list[Any]:
        """Shut the purgatory down and close the world: the end of the program's trace."""
        world = self.world
        trace: list[Any] = []
        try:
            await world.purgatory.shutdown()
        except Exception as exc:  # noqa: BLE001 - the observation
            trace.append(["shutdown raised", type(exc).__name__, str(exc)])
        await asyncio.sleep(0)
        trace.append({"records": world.records, "reports": self.reports, "final": snapshot(world)})
        world.closed = True
        world.trap = None
        return trace


async def run_program(program: dict[str, Any]) -> Any:
    run = Run(program["purge_interval"], program["wheel_size"], program["log"])
    asyncio.get_running_loop().set_exception_handler(run.handler)
    trace = [await run.step(action) for action in program["actions"]]
    return [*trace, *await run.finish()]


def main() -> None:
    logging.disable(logging.CRITICAL)  # reports without a loop go to the logger: not compared
    gc.disable()  # __del__ runs in the collections programs ask for (see "hostile user code")
    print(json.dumps({"implementation": purgatory.IMPLEMENTATION}), flush=True)
    for line in sys.stdin:
        program = json.loads(line)
        if program.get("die") == purgatory.IMPLEMENTATION:  # the test's check of its own check
            os.kill(os.getpid(), signal.SIGKILL)  # (no handler: no report of a fault)
        try:
            trace = asyncio.run(run_program(program))
        except BaseException as exc:  # noqa: BLE001 - the program broke the worker itself
            trace = ["worker failed", type(exc).__name__, str(exc)]
        print(json.dumps(trace, default=repr), flush=True)
        gc.collect()  # what the program left: its world is closed, no trap fires


if __name__ == "__main__":
    main()
