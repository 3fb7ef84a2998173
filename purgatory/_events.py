"""The event-log protocol: what a purgatory tells an opt-in recorder about each operation.

A purgatory given ``event_log=`` calls `EventLog.record_watch` once when an operation enters
`try_complete_else_watch` (after its arguments were accepted, before its first attempt) and
`EventLog.record_end` exactly once when that operation's fate is settled. With no event log the
purgatory makes no call at all, so recording costs nothing unless it is asked for.

Outcomes (``record_end``'s `outcome`):

- ``"completed"``: by its condition or `force_complete`, inside the watch call or later;
- ``"expired"``: its deadline passed;
- ``"drained"``: answered by ``drain`` (a shutdown) before its deadline, as at it: the
  operation expired early (``is_expired`` is set);
- ``"cancelled"``: `cancel_for_key`, a cancelled `watch`, or `shutdown`;
- ``"refused"``: the watch call raised (`PurgatoryFull`, a raising first `try_complete`, a bad
  key): the operation was never watched.

A recorder's calls come from the purgatory's own code, never concurrently, and in each
operation's order (its watch before its end), each with the time the event happened; an
expiry's comes at the end of its timer pass. A recorder
must not call back into the purgatory; what it raises is reported to the loop's exception
handler (or the ``purgatory`` logger) and the operations go on.

The bulk path. Two calls per operation are what recording cost, so the purgatory makes none:
it extends the two flat lists of an `EventSink` with raw values (``op, keys, marks,
watched_at`` as an operation enters, ``op, outcome, ended_at`` as it ends, where *marks* are the
watch's thresholds: ``None``, a ``dict`` of key to threshold, or one threshold for every key;
flat, so that the lists hold no object per event and a recorder takes each column with a slice)
and calls its `EventSink.collect` once `EventSink.watches` holds `EventSink.limit` items (and
after each timer pass, and at every end for an eager sink). A recorder that offers
``event_sink(purgatory_name) -> EventSink`` (the package's recorders do) takes the events in
bulk that way; any other `EventLog` is given its ``record_watch`` / ``record_end`` calls by
`sink_for`'s adapter, which collects after every event.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, final, runtime_checkable

from ._asyncio import report_exception

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = (
    "END_ITEMS",
    "TAP_LIMIT",
    "WATCH_ITEMS",
    "EventLog",
    "EventSink",
    "Outcome",
    "Tapper",
    "sink_for",
    "tapped",
    "thresholds_of",
)

Outcome = Literal["completed", "expired", "drained", "cancelled", "refused"]


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

        Args:
            purgatory: The purgatory's name.
            op: The operation watched.
            keys: The keys it watches.
            thresholds: ``None`` for a plain watch, else a tuple parallel to `keys` whose items
                are each key's threshold (``None`` for a key watched without one).
            watched_at: When it was watched, by the purgatory's clock (seconds).
            deadline: `watched_at` + ``op.timeout``, before rounding up to the tick.
        """
        ...

    def record_end(
        self, purgatory: str, op: DelayedOperation[Any], outcome: Outcome, ended_at: float
    ) -> None:
        """`op`'s fate in `purgatory` was settled at `ended_at` (seconds of the same clock).

        Args:
            purgatory: The purgatory's name.
            op: The operation, watched before (`record_watch`).
            outcome: ``"completed"``, ``"expired"``, ``"drained"``, ``"cancelled"`` or
                ``"refused"`` (see the module docstring).
            ended_at: When, by the purgatory's clock (seconds).
        """
        ...

    def flush(self) -> None:
        """Write out whatever is buffered; the purgatory calls it from `shutdown`."""
        ...


#: Items per event in `EventSink.watches` (operation, keys, marks, watched_at) and in
#: `EventSink.ends` (operation, outcome, ended_at).
WATCH_ITEMS = 4
END_ITEMS = 3


@final
class EventSink:
    """One purgatory's raw events for one event log (the bulk path: see the module docstring).

    The purgatory extends `watches` and `ends` on its hot paths and calls `collect` once either
    holds `limit` items (after a timer pass for the expiries it added); `collect` takes what
    the lists hold (and empties them, in place: the purgatory keeps the lists).
    """

    __slots__ = ("collect", "each_pass", "eager", "ends", "limit", "log", "name", "watches")

    def __init__(
        self, name: str, limit: int, collect: Callable[[], None], eager: bool = False
    ) -> None:
        #: The purgatory's name.
        self.name = name
        #: Items `watches` may hold before the purgatory calls `collect`; `ends` is taken then
        #: too, and after each timer pass.
        self.limit = limit
        #: Whether every event is collected at once (an ended operation's too).
        self.eager = eager
        #: Whether the ends are collected after every timer pass, however few (a tapped
        #: purgatory on a driven clock: its histograms follow each move of the clock).
        self.each_pass = False
        #: Takes the events of `watches` and `ends`.
        self.collect = collect
        #: ``op, keys, marks, watched_at`` per operation watched, flat.
        self.watches: list[Any] = []
        #: ``op, outcome, ended_at`` per operation ended, flat.
        self.ends: list[Any] = []
        #: The event log, named in reports of its failures (`sink_for` sets it).
        self.log: Any = None

    def take(self) -> None:
        """`collect`, reporting a failure (a full disk, a removed directory): the purgatory's
        operations never suffer from their recorder."""
        try:
            self.collect()
        except Exception as exc:  # noqa: BLE001 - reported; the operations go on
            self.report("collect", exc)

    def flush(self) -> None:
        """Everything recorded so far, collected and flushed (a shutdown), failures reported."""
        self.take()
        try:
            self.log.flush()
        except Exception as exc:  # noqa: BLE001 - reported; the shutdown goes on
            self.report("flush", exc)

    def ended(self, op: Any, outcome: str, at: float) -> None:
        """`op` ended off the hot paths (a watch call that completed it or refused it)."""
        self.ends += (op, outcome, at)
        if len(self.ends) >= self.limit:
            self.take()

    def report(self, call: str, exc: Exception) -> None:
        """What the event log raised, to the loop's exception handler (or the logger)."""
        report_exception(
            f"the event log of purgatory {self.name!r} failed ({call}); the operations go on, "
            "what it could not record is lost to the log",
            exc,
            event_log=self.log,
        )


#: Items a tapped purgatory's own sink holds before its batch is taken, when no event log sets
#: it (`tapped`): as a recorder's batches of 1,024 operations.
TAP_LIMIT: Final = 1024 * WATCH_ITEMS

Tapper = Callable[[list[Any], list[Any]], None]
"""What takes a batch of events as they are: ``tap(watches, ends)``, the flat lists (read only)."""


@final
class _Tee:
    """A tapped purgatory's events: handed to its taps, then to its event log's sink (if any).

    The purgatory extends the lists of a sink of its own (`sink`), so that no other purgatory's
    batch (a recorder serves several) is ever taken past the taps; each batch moves to the
    event log's sink (`inner`) in one extend, and the event log collects it there as before.
    """

    __slots__ = ("inner", "sink", "taps")

    def __init__(self, name: str, inner: EventSink | None) -> None:
        self.inner = inner
        self.taps: list[Tapper] = []
        limit = TAP_LIMIT if inner is None else min(TAP_LIMIT, inner.limit)
        self.sink = EventSink(name, limit, self.collect, eager=inner is not None and inner.eager)
        self.sink.log = self if inner is None else inner.log

    def collect(self) -> None:
        """One batch: each tap (one that raises is reported), then the event log's sink."""
        sink = self.sink
        watches, ends = sink.watches, sink.ends
        for tap in self.taps:
            try:
                tap(watches, ends)
            except Exception as exc:  # noqa: BLE001 - reported; the operations go on
                report_exception(
                    f"a metrics tap of purgatory {sink.name!r} failed; the operations go on, "
                    "its histograms may lack some or all of this batch",
                    exc,
                    tap=tap,
                )
        inner = self.inner
        if inner is None:
            watches.clear()
            ends.clear()
            return
        inner.watches += watches
        inner.ends += ends
        watches.clear()
        ends.clear()
        inner.collect()
        sink.limit = min(TAP_LIMIT, inner.limit)  # (a recorder's limit changes once)

    def flush(self) -> None:
        """Nothing to write out: the taps keep no buffer of the purgatory's."""


def tapped(sink: EventSink | None, name: str, tap: Tapper) -> EventSink:
    """The sink through which the purgatory `name`, whose sink was `sink` (``None``: no event
    log), also hands its events to `tap`: `sink` itself if it was tapped already."""
    tee = getattr(None if sink is None else sink.collect, "__self__", None)
    if type(tee) is not _Tee:
        tee = _Tee(name, sink)
    tee.taps.append(tap)
    return tee.sink


def thresholds_of(keys: tuple[Hashable, ...], marks: Any) -> tuple[Any, ...] | None:
    """`record_watch`'s `thresholds` from a watch's marks: ``None`` for a plain watch, else one
    threshold per key (``None`` for a key watched without one)."""
    if marks is None:
        return None
    if type(marks) is dict:
        thresholds = tuple(marks.values())
        return None if thresholds.count(None) == len(thresholds) else thresholds
    return (marks,) * len(keys)


def sink_for(log: EventLog, name: str) -> EventSink:
    """The `EventSink` through which the purgatory `name` records into `log`: the log's own
    (``event_sink``), or an adapter that makes the `EventLog` calls."""
    make = getattr(log, "event_sink", None)
    sink: EventSink = make(name) if make is not None else _Calls(log, name).sink
    sink.log = log
    return sink


@final
class _Calls:
    """The adapter of an `EventLog` without a bulk path: each event becomes its call."""

    __slots__ = ("log", "sink")

    def __init__(self, log: EventLog, name: str) -> None:
        self.log = log
        self.sink = EventSink(name, 1, self.collect, eager=True)  # each call as its event comes

    def collect(self) -> None:
        """The events so far, as calls (watches first: each came before its own end); one
        that raises is reported and the others are still made."""
        sink = self.sink
        name = sink.name
        watches = sink.watches.copy()
        sink.watches.clear()
        for i in range(0, len(watches), WATCH_ITEMS):
            op, keys, marks, at = watches[i : i + WATCH_ITEMS]
            thresholds = thresholds_of(keys, marks)
            self._call("record_watch", name, op, keys, thresholds, at, at + op._timeout)
        ends = sink.ends.copy()
        sink.ends.clear()
        for i in range(0, len(ends), END_ITEMS):
            op, outcome, at = ends[i : i + END_ITEMS]
            self._call("record_end", name, op, outcome, at)

    def _call(self, method: str, *args: Any) -> None:
        try:
            getattr(self.log, method)(*args)
        except Exception as exc:  # noqa: BLE001 - reported; the operations go on
            self.sink.report(method, exc)
