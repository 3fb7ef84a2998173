"""Our side of every comparison: `purgatory` through its public API only.

A `DelayedOperation` subclass whose synchronous `try_complete` checks a flag, watched by a
`DelayedOperationPurgatory` on the running loop with its own reaper: exactly what an application
writes. Nobody awaits the operations (neither does anybody await baseline A's futures), so the
lazily created future of an operation is never built here.

Every workload's operation is `FlagOp` or `TimedOp`, so "an operation" costs the same everywhere;
`FlagOp` is the pipeline's calibration's own, so a cost profile times the same operation too
(``benchmarks.instructions`` keeps one written for its own harness).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

from purgatory import DelayedOperationPurgatory
from purgatory.pipeline._calibrate import FlagOp

from .baselines import complete_by_key

__all__ = ("FlagOp", "OursTarget", "TimedOp")

_monotonic = time.monotonic


class TimedOp(FlagOp):
    """`FlagOp` that records how late it expired, by ``time.monotonic`` (the loop's clock).

    It adds no ``__init__``, so its construction, which W2 times, is as deep as `FlagOp`'s.
    """

    __slots__ = ()

    #: Where expiry lateness (seconds) goes; the target of the current run installs its list.
    expiry_sink: ClassVar[list[float]] = []

    def on_expiration(self) -> None:
        TimedOp.expiry_sink.append(_monotonic() - self.deadline)


class OursTarget:
    """Adapter the W1 and W2 drivers call; one per probe or repetition, on a running loop."""

    name = "ours"
    has_timer = True

    def __init__(self) -> None:
        self.expiry_lateness: list[float] = []
        TimedOp.expiry_sink = self.expiry_lateness
        self.purgatory: DelayedOperationPurgatory[TimedOp] = DelayedOperationPurgatory("bench")

    # -- one request at a time (W1) -------------------------------------------------------------

    def submit(
        self, keys: tuple[Hashable, ...], timeout: float, deadline: float, threshold: float
    ) -> TimedOp:
        """W1-force and W1-key: a plain watch (`threshold` unused)."""
        op = TimedOp(timeout, deadline)
        self.purgatory.try_complete_else_watch(op, keys)
        return op

    def force(self, op: TimedOp) -> bool:
        return op.force_complete()

    def trigger(self, op: TimedOp, key: Hashable, reached: float) -> bool:
        """W1-key: Kafka's ``checkAndComplete(key)``, every watcher of `key` re-tried."""
        op.ready = True
        return self.purgatory.check_and_complete(key) > 0

    def submit_threshold(
        self, keys: tuple[Hashable, ...], timeout: float, deadline: float, threshold: float
    ) -> TimedOp:
        """W1-threshold: watch every key at `threshold` (the request's completion time), the
        one threshold of its keys (``threshold=``: no mapping to build)."""
        op = TimedOp(timeout, deadline)
        self.purgatory.try_complete_else_watch(op, keys, threshold)
        return op

    def trigger_threshold(self, op: TimedOp, key: Hashable, reached: float) -> bool:
        """W1-threshold: re-try only the watchers of `key` at a threshold <= `reached`."""
        op.ready = True
        return self.purgatory.check_and_complete(key, reached) > 0

    # -- batches (W2) ---------------------------------------------------------------------------

    def schedule(
        self,
        keysets: Sequence[tuple[Hashable, ...]],
        deadlines: Sequence[float],
        out: list[Any],
    ) -> None:
        monotonic = _monotonic
        new = TimedOp
        watch = self.purgatory.try_complete_else_watch
        for i, keys in enumerate(keysets):
            due = deadlines[i]
            timeout = due - monotonic()
            if timeout < 0.0:  # noqa: PLR1730 - cheaper than max() in the timed loop
                timeout = 0.0
            op = new(timeout, due)
            watch(op, keys)
            out[i] = op

    def complete(self, ops: Sequence[TimedOp], keysets: Sequence[tuple[Hashable, ...]]) -> int:
        return complete_by_key(self.purgatory.check_and_complete, ops, keysets)

    async def settle(self) -> None:
        """Nothing runs later: completion and watching are synchronous."""

    # -- gauges and teardown --------------------------------------------------------------------

    def pending(self) -> int:
        return self.purgatory.num_delayed()

    def watched(self) -> int:
        return self.purgatory.watched()

    async def close(self) -> None:
        await self.purgatory.shutdown()
