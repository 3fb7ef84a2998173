"""Operations and utilities shared by the tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory.testing import ManualClock


class FlagOperation(DelayedOperation[str]):
    """Completes when `ready` is set; records every callback, in order."""

    def __init__(self, timeout: float, name: str = "op") -> None:
        super().__init__(timeout)
        self.name = name
        self.ready = False
        self.calls: list[str] = []
        self.attempts = 0

    def try_complete(self) -> bool:
        self.attempts += 1
        if self.ready:
            return self.force_complete()
        return False

    def on_complete(self) -> str:
        self.calls.append("complete")
        return f"{self.name} done"

    def on_expiration(self) -> None:
        self.calls.append("expire")


def manual_purgatory(
    name: str = "test", **options: Any
) -> tuple[ManualClock, DelayedOperationPurgatory[Any]]:
    """A purgatory driven by a `ManualClock` of its own, and that clock (`options`: the
    purgatory's other arguments)."""
    clock = ManualClock()
    return clock, DelayedOperationPurgatory[Any](name, clock=clock, **options)


class AsyncFlag(DelayedOperation[str]):
    """`FlagOperation`'s async counterpart: an ``async def try_complete`` that never suspends."""

    def __init__(self, timeout: float = 30.0) -> None:
        super().__init__(timeout)
        self.ready = False

    async def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> str:
        return "async"

    def on_expiration(self) -> None:
        pass


class DelayedFuture(DelayedOperation[int]):
    """Kafka's ``DelayedFuture``: done when every future is; on expiry the rest time out.

    The result is the sum of the futures that succeeded (Kafka's ``updateResult`` callback).
    """

    def __init__(self, timeout: float, futures: list[asyncio.Future[int]]) -> None:
        super().__init__(timeout)
        self.futures = futures

    def try_complete(self) -> bool:
        if all(future.done() for future in self.futures):
            return self.force_complete()
        return False

    def on_complete(self) -> int:
        for future in self.futures:
            if not future.done():
                future.set_exception(TimeoutError("the delayed future timed out"))
        return sum(future.result() for future in self.futures if future.exception() is None)

    def on_expiration(self) -> None:
        pass


class Recorder:
    """Collects what the event loop's exception handler is given."""

    def __init__(self) -> None:
        self.contexts: list[dict[str, Any]] = []

    def __call__(self, loop: Any, context: dict[str, Any]) -> None:
        self.contexts.append(context)

    @property
    def exceptions(self) -> list[BaseException]:
        return [c["exception"] for c in self.contexts if "exception" in c]


def loop_errors() -> Recorder:
    """A `Recorder` installed as the running loop's exception handler."""
    recorder = Recorder()
    asyncio.get_running_loop().set_exception_handler(recorder)
    return recorder


class Custom(BaseException):
    """A BaseException of the test's own: neither an Exception nor an interrupt."""


class Boom(Exception):
    """An error of the test's own, raised by the callbacks below."""


class RaisingComplete(FlagOperation):
    def on_complete(self) -> str:
        super().on_complete()
        raise Boom("on_complete")


class RaisingExpiration(FlagOperation):
    def on_expiration(self) -> None:
        super().on_expiration()
        raise Boom("on_expiration")


class FailsFirstAttempt(DelayedOperation[str]):
    """An async try_complete whose first attempt raises `error` after a suspension (inside the
    attempt's task); the next one completes."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(30.0)
        self.error = error
        self.attempts = 0

    async def try_complete(self) -> bool:
        self.attempts += 1
        await asyncio.sleep(0)
        if self.attempts == 1:
            raise self.error
        return self.force_complete()

    def on_complete(self) -> str:
        return "second time lucky"

    def on_expiration(self) -> None:
        pass


class Raises(FlagOperation):
    """A flag operation whose `on_complete` or `on_expiration` (`where`) raises `error`."""

    def __init__(self, timeout: float, where: str, error: BaseException) -> None:
        super().__init__(timeout, where)
        self.where = where
        self.error = error

    def on_complete(self) -> str:
        super().on_complete()
        if self.where == "on_complete":
            raise self.error
        return "fine"

    def on_expiration(self) -> None:
        super().on_expiration()
        if self.where == "on_expiration":
            raise self.error


def raised_in_a_thread(call: Callable[[], object]) -> BaseException | None:
    """Run `call` in a thread of its own, to its end: what it raised, or ``None``."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test, which checks it
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return raised[0] if raised else None


async def until(
    condition: Callable[[], bool], what: str = "the condition", timeout: float = 5.0
) -> None:
    """Let the loop run, polling every millisecond of loop time, until `condition()` holds.

    For state nobody signals. On a loop in virtual time (conftest.py) the polls cost no wall time
    and the bound is in virtual seconds: it fails a test whose loop stopped making progress, never
    one on a slow machine. On a real clock it is a hang guard.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        if loop.time() >= end:
            raise AssertionError(f"{what}: not reached within {timeout} s of loop time")
        await asyncio.sleep(0.001)


def run_process(
    *command: str | os.PathLike[str], timeout: float, **options: Any
) -> subprocess.CompletedProcess[str]:
    """Run `command` to its end, its output captured as text; the caller checks how it ended.

    `options` go to `subprocess.run` as they are (``cwd``, ``env``, ``input``).
    """
    argv = [os.fspath(part) for part in command]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, **options
    )


def import_error(module: str, *, without: str) -> str:
    """What importing `module` says in a fresh interpreter where `without` cannot be imported."""
    code = (
        f"import sys\nsys.modules[{without!r}] = None\n"
        f"try:\n    import {module}\nexcept ImportError as exc:\n    print(exc)\n"
    )
    done = run_process(sys.executable, "-c", code, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


# -- the purgatory's private state: the few reads the tests make, in one place --------------------


def reaper_restarts(purgatory: DelayedOperationPurgatory[Any]) -> int:
    """How many times the reaper's task was started again after it ended unexpectedly."""
    reaper = purgatory._binding.reaper
    assert reaper is not None, "the purgatory has no reaper (a driven clock, or never used)"
    return reaper.restarts


def cascading(purgatory: DelayedOperationPurgatory[Any]) -> bool:
    """Whether a cascade of the timing wheel is under way (cut in slices across timer passes)."""
    return purgatory._timer.wheel.cascading is not None


def wheel_levels(purgatory: DelayedOperationPurgatory[Any]) -> int:
    """How many levels the timing wheel has grown to."""
    return purgatory._timer.wheel.levels


def attempt_tasks(purgatory: DelayedOperationPurgatory[Any]) -> set[asyncio.Task[None]]:
    """The tasks of the async attempts in flight."""
    return purgatory._attempts.tasks


def attempt_running(purgatory: DelayedOperationPurgatory[Any], op: object) -> bool:
    """Whether an async attempt of `op` is in flight."""
    return purgatory._attempts.running(op)
