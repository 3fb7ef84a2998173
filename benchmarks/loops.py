"""Event loops the contenders run on: the stock asyncio loop and uvloop (baseline B).

Every probe and repetition gets a fresh loop, so no timer heap, cancelled handle or task left by
an earlier measurement can slow a later one.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ("LOOPS", "LoopFactory", "run_on", "uvloop_available")

T = TypeVar("T")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def _asyncio_loop() -> asyncio.AbstractEventLoop:
    return asyncio.new_event_loop()


def _uvloop_loop() -> asyncio.AbstractEventLoop:
    import uvloop

    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


#: Loop name -> factory.
LOOPS: dict[str, LoopFactory] = {"asyncio": _asyncio_loop, "uvloop": _uvloop_loop}


def uvloop_available() -> bool:
    """Whether uvloop can be imported (baseline B is skipped, and says so, when it cannot)."""
    return importlib.util.find_spec("uvloop") is not None


def run_on(loop: str, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` to completion on a fresh loop of the named kind, then close the loop."""
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(main())
