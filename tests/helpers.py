"""Operations and utilities shared by the tests."""

from __future__ import annotations

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


class Recorder:
    """Collects what the event loop's exception handler is given."""

    def __init__(self) -> None:
        self.contexts: list[dict[str, Any]] = []

    def __call__(self, loop: Any, context: dict[str, Any]) -> None:
        self.contexts.append(context)

    @property
    def exceptions(self) -> list[BaseException]:
        return [c["exception"] for c in self.contexts if "exception" in c]
