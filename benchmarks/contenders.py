"""Who runs in each workload and on which event loop: ours (on asyncio and on uvloop), baselines
A, A-lean, A-heap, B, C and the Floor.

Every probe and repetition gets a fresh loop, so no timer heap, cancelled handle or task left by
an earlier measurement can slow a later one. A baseline is compared with ours on the same loop
(`PAIRS`): A, A-lean and A-heap with ours on asyncio, B (A on uvloop) with ours on uvloop.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from .baselines import Floor, FutureTimer, HeapFutureTimer, LeanFutureTimer, TaskPerRequest
from .ours import OursTarget

__all__ = (
    "DESCRIPTIONS",
    "LOOPS",
    "PAIRS",
    "Contender",
    "run_on",
    "uvloop_available",
    "w1_contenders",
    "w2_contenders",
)

T = TypeVar("T")


def _uvloop_loop() -> asyncio.AbstractEventLoop:
    import uvloop

    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


#: Loop name -> factory.
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": _uvloop_loop,
}


def uvloop_available() -> bool:
    """Whether uvloop can be imported (baseline B is left out, and the run says so, if not)."""
    return importlib.util.find_spec("uvloop") is not None


def run_on(loop: str, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` to completion on a fresh loop of the named kind, then close the loop."""
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(main())


@dataclass(frozen=True)
class Contender(Generic[T]):
    """A named implementation, the loop it runs on, and how to build it inside that loop."""

    name: str
    loop: str
    factory: Callable[[], T]


DESCRIPTIONS: dict[str, str] = {
    "ours": "purgatory.DelayedOperationPurgatory (public API, asyncio loop, its reaper)",
    "ours-uvloop": "ours on uvloop, compared with B",
    "A": "asyncio.Future + loop.call_later + the waiters of a key in an ordered dict, which a "
    "finished waiter leaves in O(1) (asyncio loop)",
    "A-lean": "the leanest asyncio version: per request a tuple (threshold, Future, TimerHandle of "
    "loop.call_at, its number of keys) in a list per key, the condition checked inline, no class "
    "of its own; finished entries leave in the trigger's pass or a purge once they dominate",
    "A-heap": "W1-threshold only: A with a heap per key ordered by threshold, written by hand "
    "(Kafka Raft's ThresholdPurgatory idea in plain asyncio)",
    "B": "baseline A on uvloop",
    "C": "a Task per request: await asyncio.wait_for(event.wait(), timeout) (asyncio loop)",
    "Floor": "create the operation object and insert it into one dict per key (no timer)",
}

PAIRS: dict[str, str] = {"A": "ours", "A-lean": "ours", "A-heap": "ours", "B": "ours-uvloop"}
"""Baseline -> the ours it is compared with: the one on the same event loop."""


W1Any = OursTarget | FutureTimer | LeanFutureTimer | HeapFutureTimer


def w1_contenders(with_uvloop: bool) -> list[Contender[W1Any]]:
    """Ours, A, A-lean, A-heap (W1-threshold only) and (when uvloop is installed) ours on uvloop
    and B."""
    found: list[Contender[W1Any]] = [
        Contender("ours", "asyncio", OursTarget),
        Contender("A", "asyncio", partial(FutureTimer, "A")),
        Contender("A-lean", "asyncio", LeanFutureTimer),
        Contender("A-heap", "asyncio", HeapFutureTimer),
    ]
    if with_uvloop:
        found.append(Contender("ours-uvloop", "uvloop", OursTarget))
        found.append(Contender("B", "uvloop", partial(FutureTimer, "B")))
    return found


W2Any = OursTarget | FutureTimer | LeanFutureTimer | TaskPerRequest | Floor


def w2_contenders(with_uvloop: bool) -> list[Contender[W2Any]]:
    """Ours, A, A-lean, ours on uvloop and B (when uvloop is installed), C and the Floor."""
    found: list[Contender[W2Any]] = [
        Contender("ours", "asyncio", OursTarget),
        Contender("A", "asyncio", partial(FutureTimer, "A")),
        Contender("A-lean", "asyncio", LeanFutureTimer),
    ]
    if with_uvloop:
        found.append(Contender("ours-uvloop", "uvloop", OursTarget))
        found.append(Contender("B", "uvloop", partial(FutureTimer, "B")))
    found.append(Contender("C", "asyncio", TaskPerRequest))
    found.append(Contender("Floor", "asyncio", Floor))
    return found
