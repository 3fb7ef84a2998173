"""Who runs in each workload, on which loop: ours, baselines A, A-lean, B, C and the Floor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .baselines import Floor, FutureTimer, HeapFutureTimer, LeanFutureTimer, TaskPerRequest
from .ours import OursTarget

__all__ = ("DESCRIPTIONS", "Contender", "w1_contenders", "w2_contenders")

T = TypeVar("T")


@dataclass(frozen=True)
class Contender(Generic[T]):
    """A named implementation, the loop it runs on, and how to build it inside that loop."""

    name: str
    loop: str
    factory: Callable[[], T]


DESCRIPTIONS: dict[str, str] = {
    "ours": "purgatory.DelayedOperationPurgatory (public API, asyncio loop, its reaper)",
    "A": "asyncio.Future + loop.call_later + dict[key, list[waiter]] (asyncio loop)",
    "A-lean": "the leanest asyncio version: per request a tuple (threshold, Future, TimerHandle of "
    "loop.call_at) in a list per key, the condition checked inline, no class of its own",
    "A-heap": "W1-threshold only: A with a heap per key ordered by threshold, written by hand "
    "(Kafka Raft's ThresholdPurgatory idea in plain asyncio)",
    "B": "baseline A on uvloop",
    "C": "a Task per request: await asyncio.wait_for(event.wait(), timeout) (asyncio loop)",
    "Floor": "create the operation object and insert it into one dict per key (no timer)",
}


def _a() -> FutureTimer:
    return FutureTimer("A")


def _b() -> FutureTimer:
    return FutureTimer("B")


W1Any = OursTarget | FutureTimer | LeanFutureTimer | HeapFutureTimer


def w1_contenders(with_uvloop: bool) -> list[Contender[W1Any]]:
    """Ours, A, A-lean, A-heap (W1-threshold only) and (when uvloop is installed) B."""
    found: list[Contender[W1Any]] = [
        Contender("ours", "asyncio", OursTarget),
        Contender("A", "asyncio", _a),
        Contender("A-lean", "asyncio", LeanFutureTimer),
        Contender("A-heap", "asyncio", HeapFutureTimer),
    ]
    if with_uvloop:
        found.append(Contender("B", "uvloop", _b))
    return found


W2Any = OursTarget | FutureTimer | LeanFutureTimer | TaskPerRequest | Floor


def w2_contenders(with_uvloop: bool) -> list[Contender[W2Any]]:
    """Ours, A, A-lean, B (when uvloop is installed), C and the Floor."""
    found: list[Contender[W2Any]] = [
        Contender("ours", "asyncio", OursTarget),
        Contender("A", "asyncio", _a),
        Contender("A-lean", "asyncio", LeanFutureTimer),
    ]
    if with_uvloop:
        found.append(Contender("B", "uvloop", _b))
    found.append(Contender("C", "asyncio", TaskPerRequest))
    found.append(Contender("Floor", "asyncio", Floor))
    return found
