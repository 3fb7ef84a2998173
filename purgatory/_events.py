"""The event-log protocol: what a purgatory tells an opt-in recorder about each operation.

A purgatory given ``event_log=`` calls `EventLog.record_watch` once when an operation enters
`try_complete_else_watch` (after its arguments were accepted, before its first attempt) and
`EventLog.record_end` exactly once when that operation's fate is settled. With no event log the
purgatory makes no call at all, so recording costs nothing unless it is asked for.

Outcomes (``record_end``'s `outcome`):

- ``"completed"``: by its condition or `force_complete`, inside the watch call or later;
- ``"expired"``: its deadline passed;
- ``"cancelled"``: `cancel_for_key`, a cancelled `watch`, or `shutdown`;
- ``"refused"``: the watch call raised (`PurgatoryFull`, a raising first `try_complete`, a bad
  key): the operation was never watched.

The recorder is called synchronously from the purgatory's hot paths: it must be cheap, must not
call back into the purgatory, and must not raise (what it raises propagates to whoever triggered
the event).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = ("EventLog", "Outcome")

Outcome = Literal["completed", "expired", "cancelled", "refused"]


@runtime_checkable
class EventLog(Protocol):
    """A recorder of operation lifecycles (see the module docstring for when it is called)."""

    def record_watch(
        self,
        purgatory: str,
        op: DelayedOperation[Any],
        keys: tuple[Hashable, ...],
        thresholds: tuple[Any, ...] | None,
        watched_at: float,
        deadline: float,
    ) -> None:
        """`op` entered `purgatory` (its name) at `watched_at`, due at `deadline` (seconds).

        `thresholds` is ``None`` for a plain watch, else a tuple parallel to `keys` whose items
        are each key's threshold (``None`` for a key watched without one). `deadline` is
        `watched_at` + ``op.timeout``, before rounding up to the tick.
        """
        ...

    def record_end(
        self, purgatory: str, op: DelayedOperation[Any], outcome: Outcome, ended_at: float
    ) -> None:
        """`op`'s fate in `purgatory` was settled at `ended_at` (seconds of the same clock)."""
        ...

    def flush(self) -> None:
        """Write out whatever is buffered; the purgatory calls it from `shutdown`."""
        ...
