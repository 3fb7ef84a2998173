"""The event loops in virtual time (virtual_time.py) that the event-loop tests run on.

Each test runs on both (`new_loop`): what a test may rely on is that the clock moves only when
the loop would otherwise sleep, straight to the earliest timer, and that a loop with nothing
scheduled still waits for the outside (another thread) as a real loop does.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
from virtual_time import DEFAULT_START, EACH_LOOP, NewLoop

from purgatory._asyncio import loop_time_function

T = TypeVar("T")


def run(new_loop: NewLoop, main: Coroutine[Any, Any, T]) -> T:
    loop = new_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()


@EACH_LOOP
def test_sleeps_take_no_wall_time_and_the_clock_reads_the_timers(new_loop: NewLoop) -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        assert loop.time() == DEFAULT_START
        seen: list[float] = []
        await asyncio.sleep(3600.0)
        seen.append(loop.time())
        await asyncio.gather(*(asyncio.sleep(d) for d in (0.25, 0.5, 0.125)))
        seen.append(loop.time())
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(2.0):
                await asyncio.Event().wait()  # nothing else scheduled: the timeout fires
        seen.append(loop.time())
        return seen

    started = time.monotonic()
    assert run(new_loop, main()) == [
        DEFAULT_START + 3600.0,
        DEFAULT_START + 3600.5,
        DEFAULT_START + 3602.5,
    ]
    assert time.monotonic() - started < 30.0  # an hour of sleeping, not an hour


@EACH_LOOP
def test_timers_run_in_time_order_and_cancelled_ones_never(new_loop: NewLoop) -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        fired: list[tuple[str, float]] = []
        done = loop.create_future()

        def note(name: str) -> None:
            fired.append((name, loop.time()))

        loop.call_later(0.3, note, "c")
        loop.call_at(start + 0.1, note, "a")
        loop.call_later(0.2, note, "b")
        loop.call_later(0.15, note, "cancelled").cancel()
        loop.call_later(0.4, done.set_result, None)
        await done
        return fired

    start = DEFAULT_START  # each timer fires with the clock at its time, to the float
    assert run(new_loop, main()) == [
        ("a", start + 0.1),
        ("b", start + 0.2),
        ("c", start + 0.3),
    ]


@EACH_LOOP
def test_a_timer_cancelled_by_another_due_with_it_does_not_run(new_loop: NewLoop) -> None:
    errors: list[dict[str, Any]] = []

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        fired: list[str] = []
        handles: dict[str, asyncio.TimerHandle] = {}

        def fire(name: str, other: str) -> None:
            fired.append(name)
            handles[other].cancel()

        handles["a"] = loop.call_later(0.1, fire, "a", "b")
        handles["b"] = loop.call_later(0.1, fire, "b", "a")
        await asyncio.sleep(1.0)
        return fired

    assert len(run(new_loop, main())) == 1
    assert errors == []


@EACH_LOOP
def test_many_cancelled_timers_are_dropped_and_the_rest_still_run(new_loop: NewLoop) -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        fired: list[int] = []
        handles = [loop.call_later(1.0 + i / 1000, fired.append, i) for i in range(1000)]
        for i, handle in enumerate(handles):
            if i % 10:
                handle.cancel()
        await asyncio.sleep(5.0)
        return fired

    assert run(new_loop, main()) == list(range(0, 1000, 10))


@EACH_LOOP
def test_the_clock_stands_still_while_callbacks_are_ready(new_loop: NewLoop) -> None:
    """A timer that is due runs among ready callbacks, and nothing later does."""

    async def main() -> tuple[int, bool, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        due_now = asyncio.Event()
        later = asyncio.Event()
        loop.call_at(start, due_now.set)
        loop.call_later(1.0, later.set)
        spins = 0
        while not due_now.is_set() and spins < 1000:
            spins += 1
            await asyncio.sleep(0)
        for _ in range(100):
            await asyncio.sleep(0)
        return spins, later.is_set(), loop.time() - start

    spins, later, elapsed = run(new_loop, main())
    assert spins < 1000, "the due timer did not run while the loop was busy"
    assert not later
    assert elapsed == 0.0


@EACH_LOOP
def test_with_no_timer_the_loop_waits_for_another_thread(new_loop: NewLoop) -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        woken = loop.create_future()

        def worker() -> None:
            time.sleep(0.05)  # the loop is idle with nothing scheduled meanwhile
            loop.call_soon_threadsafe(woken.set_result, None)

        thread = threading.Thread(target=worker)
        thread.start()
        await woken
        thread.join()
        return loop.time() - start

    assert run(new_loop, main()) == 0.0  # it waited, and the virtual clock did not move


@EACH_LOOP
def test_ready_io_runs_before_the_clock_jumps(new_loop: NewLoop) -> None:
    """A timer pending (a guard) while a socket becomes readable: the read, not a jump."""

    async def main() -> tuple[bytes, float]:
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        try:
            left.setblocking(False)
            start = loop.time()
            loop.call_soon(right.send, b"ready")  # once the read below is waiting
            async with asyncio.timeout(5.0):
                data = await loop.sock_recv(left, 5)
            return data, loop.time() - start
        finally:
            left.close()
            right.close()

    assert run(new_loop, main()) == (b"ready", 0.0)


@EACH_LOOP
def test_the_purgatory_reads_the_virtual_clock(new_loop: NewLoop) -> None:
    loop = new_loop()
    try:
        assert loop_time_function(loop) == loop.time
        assert loop_time_function(loop)() == DEFAULT_START
    finally:
        loop.close()


@EACH_LOOP
@pytest.mark.parametrize("start", [float("nan"), float("inf"), "0", True])
def test_a_bad_start_is_refused(
    new_loop: Callable[[float], asyncio.AbstractEventLoop], start: Any
) -> None:
    with pytest.raises((TypeError, ValueError), match="start must be"):
        new_loop(start)
