"""What the metrics integrations export, and how they read the purgatories they export.

Shared by `purgatory.prometheus` and `purgatory.otel` (standard library only). Both read
`DelayedOperationPurgatory.statistics` when they are scraped or collected, never on the hot
path, through a `Tracked` set of purgatories.

A scrape usually runs on another thread than the event loop that drives the purgatory:
prometheus_client's ``start_http_server`` answers on its own threads, and the OpenTelemetry
SDK's periodic reader collects on its own. `statistics` only reads counts the loop keeps (each a
single attribute the interpreter reads whole), so `Tracked` reads it on the scraping thread,
without waiting for the loop: a scrape answers at once however busy the loop is, when metrics
matter most. Only a read that keeps failing (a gauge caught in the middle of the loop's change,
which the statistics' reads are written not to meet) is made on the loop, waiting at most the
exporter's timeout.

Counters never go back. A purgatory shut down (or gone) leaves the exported set, as Kafka's
``shutdown`` removes its gauges, and a new purgatory may take its name, as an application does
each time it starts; its counters start from zero, which a backend would read as a reset (a
spike in every rate). So `Tracked` carries what the counters of the purgatories that left had
reached over to the next one of the same name: the exported series keeps rising.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from ._purgatory import PURGATORY_TYPES, DelayedOperationPurgatory, PurgatoryStatistics

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
"""Seconds a scrape waits for a purgatory's event loop when it must read on it (Prometheus
scrapes time out after 10 s by default)."""

#: The counters (monotonic since the purgatory began), carried over to a purgatory's successor.
COUNTERS: Final = tuple(field.attribute for field in FIELDS if field.kind == "counter")
# Direct reads of one purgatory that may fail (and are tried again) before it is read on its loop.
_DIRECT_TRIES: Final = 3


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@dataclass(slots=True)
class _Entry:
    """One purgatory exported: weakly, with its loop (weakly), its name, its last reading."""

    purgatory: weakref.ref[DelayedOperationPurgatory[Any]]
    loop: weakref.ref[asyncio.AbstractEventLoop] | None
    name: str
    last: PurgatoryStatistics | None = None


class Tracked:
    """The purgatories an exporter reads, held weakly, each with the loop it was added on.

    Weakly: exporting a purgatory never keeps it alive; once it is garbage, it is gone from the
    next scrape. A purgatory shut down is dropped too, as Kafka's ``shutdown`` removes its
    gauges: its series end rather than report a stopped purgatory forever, and a new purgatory
    may take its name; its counters go on from where the last one's were (see the module's
    docstring).
    """

    __slots__ = ("_carried", "_entries", "_lock", "timeout")

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = timeout
        self._lock = threading.Lock()
        self._entries: list[_Entry] = []
        # Per name: the counters the purgatories of that name that left had reached.
        self._carried: dict[str, dict[str, int]] = {}

    def add(self, purgatory: DelayedOperationPurgatory[Any]) -> None:
        """Export `purgatory`, read on the event loop running now (if any).

        Raises:
            TypeError: Not a `DelayedOperationPurgatory`.
            ValueError: It is shut down, already exported, or another purgatory exported here
                has its name (its samples would be indistinguishable).
        """
        if not isinstance(purgatory, PURGATORY_TYPES):
            raise TypeError(f"expected a DelayedOperationPurgatory, got {purgatory!r}")
        if purgatory.closed:
            raise ValueError(f"purgatory {purgatory.name!r} is shut down: nothing to export")
        loop = _running_loop()
        with self._lock:
            for entry in self._live():
                other = entry.purgatory()
                if other is purgatory:
                    raise ValueError(f"purgatory {purgatory.name!r} is already exported")
                if entry.name == purgatory.name:
                    raise ValueError(
                        f"another purgatory named {purgatory.name!r} is already exported; "
                        "give each purgatory a name of its own"
                    )
            self._entries.append(
                _Entry(
                    weakref.ref(purgatory),
                    None if loop is None else weakref.ref(loop),
                    purgatory.name,
                )
            )

    def purgatories(self) -> list[DelayedOperationPurgatory[Any]]:
        """The purgatories exported and still open, in the order added."""
        with self._lock:
            return [p for entry in self._live() if (p := entry.purgatory()) is not None]

    def _live(self) -> list[_Entry]:
        """Drop the dead and the shut down, carrying their counters (under the lock); the
        others, in order."""
        kept = []
        for entry in self._entries:
            purgatory = entry.purgatory()
            if purgatory is not None and not purgatory.closed:
                kept.append(entry)
                continue
            final = entry.last if purgatory is None else purgatory.statistics()
            if final is not None:
                carried = self._carried.setdefault(entry.name, dict.fromkeys(COUNTERS, 0))
                for counter in COUNTERS:
                    carried[counter] += getattr(final, counter)
        self._entries = kept
        return kept

    def snapshot(self, timeout: float | None = None) -> list[tuple[str, PurgatoryStatistics]]:
        """(name, statistics) of every purgatory exported and still open, in the order added,
        its counters carried on from the purgatories of its name that left.

        Each is read on this thread (see the module's docstring); only one whose reads keep
        failing is read on its event loop, waiting at most `timeout` seconds (default: the one
        given at creation).

        Raises:
            TimeoutError: A purgatory had to be read on its event loop, which did not answer in
                time (it is blocked, or stopped without being closed).
        """
        wait = self.timeout if timeout is None else min(timeout, self.timeout)
        found = []
        with self._lock:
            for entry in self._live():
                purgatory = entry.purgatory()
                loop = None if entry.loop is None else entry.loop()
                if purgatory is None or (entry.loop is not None and loop is None):
                    continue  # gone, or its loop is gone (and with it what drove it)
                stats = _read(purgatory, loop, wait)
                if stats is None:
                    continue
                entry.last = stats
                carried = self._carried.get(entry.name)
                if carried is not None:
                    stats = replace(stats, **{c: getattr(stats, c) + carried[c] for c in COUNTERS})
                found.append((entry.name, stats))
        return found


def _read(
    purgatory: DelayedOperationPurgatory[Any],
    loop: asyncio.AbstractEventLoop | None,
    timeout: float,
) -> PurgatoryStatistics | None:
    """`purgatory`'s statistics, read here; on its `loop` if direct reads keep failing."""
    for _ in range(_DIRECT_TRIES):
        try:
            return purgatory.statistics()
        except RuntimeError:  # a structure changed while read: read again
            continue
    if loop is None or loop is _running_loop():
        return purgatory.statistics()
    return _read_on(loop, purgatory, timeout)


def _read_on(
    loop: asyncio.AbstractEventLoop,
    purgatory: DelayedOperationPurgatory[Any],
    timeout: float,
) -> PurgatoryStatistics | None:
    """`purgatory.statistics()` on `loop`'s thread, this thread waiting for it; ``None`` if the
    loop is closed or the purgatory shut down meanwhile."""
    answer: concurrent.futures.Future[PurgatoryStatistics | None] = concurrent.futures.Future()

    def read() -> None:
        if answer.set_running_or_notify_cancel():
            try:
                answer.set_result(None if purgatory.closed else purgatory.statistics())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                answer.set_exception(exc)

    try:
        loop.call_soon_threadsafe(read)
    except RuntimeError:  # the loop is closed: what it drove is over
        return None
    try:
        return answer.result(timeout)
    except TimeoutError:
        answer.cancel()
        raise TimeoutError(
            f"the event loop of purgatory {purgatory.name!r} did not answer within {timeout} s "
            "(blocked, or stopped without being closed)"
        ) from None
