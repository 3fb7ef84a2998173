"""What the metrics integrations export, and how they read the purgatories they export.

Shared by `purgatory.prometheus` and `purgatory.otel` (standard library only). Both read
`DelayedOperationPurgatory.statistics` when they are scraped or collected, never on the hot
path, through a `Tracked` set of purgatories.

A purgatory is not thread-safe, and a scrape usually runs on another thread than the event loop
that drives it: prometheus_client's ``start_http_server`` answers on its own threads, and the
OpenTelemetry SDK's periodic reader collects on its own. So `Tracked` remembers the loop that was
running when each purgatory was added, and reads the purgatory on that loop
(``call_soon_threadsafe``), waiting for the answer; a read from the loop's own thread (an ASGI
``/metrics`` route, say) is direct. A purgatory added with no loop running (one on a
`ManualClock`) is read on whatever thread collects.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

from ._purgatory import DelayedOperationPurgatory, PurgatoryStatistics

__all__ = ("FIELDS", "Field", "Tracked")


@dataclass(frozen=True, slots=True)
class Field:
    """One exported figure: a `PurgatoryStatistics` attribute, read by its name."""

    attribute: str
    """The `PurgatoryStatistics` attribute."""
    metric: str
    """The metric's name after the ``purgatory`` prefix (``purgatory_delayed``)."""
    kind: Literal["gauge", "count", "counter"]
    """``count``: a gauge whose values add up over purgatories (OpenTelemetry's up-down
    counter); ``gauge``: one that does not; ``counter``: monotonic since the purgatory began."""
    unit: str
    """UCUM, as OpenTelemetry wants it; ``s`` also adds ``_seconds`` to the Prometheus name."""
    description: str


FIELDS: Final[tuple[Field, ...]] = (
    Field(
        "delayed",
        "delayed",
        "count",
        "{operation}",
        "Operations waiting in the timer: the requests parked now (Kafka's NumDelayedOperations).",
    ),
    Field(
        "watched",
        "watched",
        "count",
        "{entry}",
        "Entries over all watcher lists, finished operations not purged yet included: an "
        "operation on 3 keys counts 3 (Kafka's PurgatorySize).",
    ),
    Field("keys", "keys", "count", "{key}", "Keys with a watcher list."),
    Field(
        "next_deadline_in",
        "next_deadline",
        "gauge",
        "s",
        "Seconds until the timer next has work (+Inf when nothing is timed).",
    ),
    Field(
        "completed",
        "completed",
        "counter",
        "{operation}",
        "Operations completed by their condition (expiries not included).",
    ),
    Field(
        "expired", "expired", "counter", "{operation}", "Operations completed by their deadline."
    ),
    Field(
        "drained",
        "drained",
        "counter",
        "{operation}",
        "Operations answered by a drain (a shutdown) before their deadline, as at it.",
    ),
    Field(
        "cancelled",
        "cancelled",
        "counter",
        "{operation}",
        "Operations cancelled: by cancel_for_key, shutdown, or a cancelled watch.",
    ),
    Field("purged", "purged", "counter", "{entry}", "Watcher-list entries removed by purges."),
    Field(
        "timer_passes",
        "timer_passes",
        "counter",
        "{pass}",
        "Timer passes run (reaper wake-ups on the loop).",
    ),
    Field(
        "purges",
        "purges",
        "counter",
        "{purge}",
        "Timer passes that removed entries from the watcher lists.",
    ),
)
"""Every field exported, in the order a scrape lists them (a test checks that this covers
`PurgatoryStatistics`: a field added there is exported once it is named here)."""

DEFAULT_TIMEOUT: Final = 5.0
"""Seconds a scrape waits for a purgatory's event loop to answer (Prometheus scrapes time out
after 10 s by default)."""


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Tracked:
    """The purgatories an exporter reads, held weakly, each with the loop it was added on.

    Weakly: exporting a purgatory never keeps it alive; once it is garbage, it is gone from the
    next scrape. A purgatory shut down is dropped too, as Kafka's ``shutdown`` removes its
    gauges: its series end rather than report a stopped purgatory forever, and a new purgatory
    may take its name.
    """

    __slots__ = ("_entries", "_lock", "timeout")

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = timeout
        self._lock = threading.Lock()
        self._entries: list[tuple[weakref.ref[Any], weakref.ref[Any] | None]] = []

    def add(self, purgatory: DelayedOperationPurgatory[Any]) -> None:
        """Export `purgatory`, read on the event loop running now (if any).

        Raises:
            TypeError: Not a `DelayedOperationPurgatory`.
            ValueError: It is shut down, already exported, or another purgatory exported here
                has its name (its samples would be indistinguishable).
        """
        if not isinstance(purgatory, DelayedOperationPurgatory):
            raise TypeError(f"expected a DelayedOperationPurgatory, got {purgatory!r}")
        if purgatory.closed:
            raise ValueError(f"purgatory {purgatory.name!r} is shut down: nothing to export")
        loop = _running_loop()
        with self._lock:
            for other in self._live():
                if other is purgatory:
                    raise ValueError(f"purgatory {purgatory.name!r} is already exported")
                if other.name == purgatory.name:
                    raise ValueError(
                        f"another purgatory named {purgatory.name!r} is already exported; "
                        "give each purgatory a name of its own"
                    )
            self._entries.append(
                (weakref.ref(purgatory), None if loop is None else weakref.ref(loop))
            )

    def _live(self) -> list[DelayedOperationPurgatory[Any]]:
        """Drop the dead and the shut down (under the lock); the others, in order."""
        kept, live = [], []
        for entry in self._entries:
            purgatory = entry[0]()
            if purgatory is not None and not purgatory.closed:
                kept.append(entry)
                live.append(purgatory)
        self._entries = kept
        return live

    def snapshot(self, timeout: float | None = None) -> list[tuple[str, PurgatoryStatistics]]:
        """(name, statistics) of every purgatory exported and still open, in the order added.

        Each is read on its event loop (see the module's docstring), waiting at most `timeout`
        seconds (default: the one given at creation) for each loop.

        Raises:
            TimeoutError: A purgatory's event loop did not answer in time (it is blocked, or
                stopped without being closed).
        """
        wait = self.timeout if timeout is None else min(timeout, self.timeout)
        with self._lock:
            self._live()
            entries = list(self._entries)
        here = _running_loop()
        order: list[DelayedOperationPurgatory[Any]] = []
        by_loop: dict[asyncio.AbstractEventLoop | None, list[DelayedOperationPurgatory[Any]]] = {}
        for purgatory_ref, loop_ref in entries:
            purgatory = purgatory_ref()
            loop = None if loop_ref is None else loop_ref()
            if purgatory is None or (loop_ref is not None and loop is None):
                continue  # gone, or its loop is gone (and with it what drove it)
            order.append(purgatory)
            by_loop.setdefault(None if loop is here else loop, []).append(purgatory)
        read: dict[int, tuple[str, PurgatoryStatistics]] = {}
        for loop, purgatories in by_loop.items():
            read.update(_read(purgatories) if loop is None else _read_on(loop, purgatories, wait))
        return [read[id(purgatory)] for purgatory in order if id(purgatory) in read]


def _read(
    purgatories: Iterable[DelayedOperationPurgatory[Any]],
) -> dict[int, tuple[str, PurgatoryStatistics]]:
    return {
        id(purgatory): (purgatory.name, purgatory.statistics())
        for purgatory in purgatories
        if not purgatory.closed
    }


def _read_on(
    loop: asyncio.AbstractEventLoop,
    purgatories: list[DelayedOperationPurgatory[Any]],
    timeout: float,
) -> dict[int, tuple[str, PurgatoryStatistics]]:
    """`_read` on `loop`'s thread, this thread waiting for it."""
    answer: concurrent.futures.Future[dict[int, tuple[str, PurgatoryStatistics]]]
    answer = concurrent.futures.Future()

    def read() -> None:
        if answer.set_running_or_notify_cancel():
            try:
                answer.set_result(_read(purgatories))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                answer.set_exception(exc)

    try:
        loop.call_soon_threadsafe(read)
    except RuntimeError:  # the loop is closed: what it drove is over
        return {}
    try:
        return answer.result(timeout)
    except TimeoutError:
        answer.cancel()
        names = ", ".join(repr(p.name) for p in purgatories)
        raise TimeoutError(
            f"the event loop of purgatory {names} did not answer within {timeout} s "
            "(blocked, or stopped without being closed)"
        ) from None
