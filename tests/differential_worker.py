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
import json
import logging
import math
import sys
from collections.abc import Hashable
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

    def __init__(self, world: World, kind: int, timeout: float) -> None:
        super().__init__(timeout)
        self.world = world
        self.kind = kind
        self.ready = False
        self.ident = len(world.ops)
        world.ops.append(self)

    def try_complete(self) -> bool:
        self.world.log.append(["try", self.ident])
        if self.kind == 1 and self.ready:
            raise ValueError(f"try_complete of {self.ident} failed")
        if self.kind == 5 and not self.ready:
            return True  # a false claim
        if self.ready:
            return self.force_complete()
        return False

    def on_complete(self) -> Any:
        self.world.log.append(["complete", self.ident, self.is_expired])
        if self.kind == 2:
            raise RuntimeError(f"on_complete of {self.ident} failed")
        if self.kind == 4:  # re-entrant: a trigger, and a force of the previous operation
            self.world.log.append(["reenter", self.world.purgatory.check_and_complete(KEYS[0])])
            if self.ident > 0:
                self.world.log.append(["reforce", self.world.ops[self.ident - 1].force_complete()])
        return ["result", self.ident]

    def on_expiration(self) -> None:
        self.world.log.append(["expire", self.ident])
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
    cls = AsyncOperation if a % 7 == 6 else Operation
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
)


def snapshot(world: World) -> Any:
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


async def run_program(program: dict[str, Any]) -> Any:
    world = World(program["purge_interval"], program["wheel_size"], program["log"])
    reports: list[Any] = []
    loop = asyncio.get_running_loop()

    def handler(_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        reports.append([context.get("message"), type(exc).__name__, str(exc)])

    loop.set_exception_handler(handler)
    trace: list[Any] = []
    for action in program["actions"]:
        kind, a, b, c = action
        result = await ACTIONS[kind % len(ACTIONS)](world, a, b, c)
        world.log.extend(["report", *report] for report in reports)
        reports.clear()
        trace.append({"action": action, "result": result, "log": world.log, **snapshot(world)})
        world.log = []
    try:
        await world.purgatory.shutdown()
    except Exception as exc:  # noqa: BLE001 - the observation
        trace.append(["shutdown raised", type(exc).__name__, str(exc)])
    await asyncio.sleep(0)
    trace.append({"records": world.records, "reports": reports, "final": snapshot(world)})
    return trace


def main() -> None:
    logging.disable(logging.CRITICAL)  # reports without a loop go to the logger: not compared
    print(json.dumps({"implementation": purgatory.IMPLEMENTATION}), flush=True)
    for line in sys.stdin:
        program = json.loads(line)
        try:
            trace = asyncio.run(run_program(program))
        except BaseException as exc:  # noqa: BLE001 - the program broke the worker itself
            trace = ["worker failed", type(exc).__name__, str(exc)]
        print(json.dumps(trace, default=repr), flush=True)


if __name__ == "__main__":
    main()
