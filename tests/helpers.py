"""Operations and utilities shared by the tests."""

from __future__ import annotations

import asyncio
from typing import Any

from purgatory import DelayedOperation


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


class Custom(BaseException):
    """A BaseException of the test's own: neither an Exception nor an interrupt."""


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
