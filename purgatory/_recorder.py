"""`FileRecorder`: what every file-writing `EventLog` shares, whatever it renders.

Theory of operation. A purgatory given ``event_log=`` records each operation's watch and end on
its hot paths, so the recorder takes them in bulk: it gives each purgatory an `EventSink`
(`event_sink`) to which the purgatory appends raw tuples, with no call per event, and `_collect`
takes them a batch at a time (see ``_events.py``). Taken watches become one tuple per *open*
operation (keyed by the operation); taken ends move it, with the outcome and end time, onto the
batch. `record_watch` and `record_end`, the `EventLog` protocol's calls, do the same one event
at a time. Nothing is formatted there. When the batch holds ``buffer_lines`` operations, or on
`flush` / `close`, a subclass renders the whole batch at once (`_render`: JSON Lines, or an
Arrow record batch) and the bytes are written to the current file in one piece.

Files. Batches go to ``<prefix>-<token>-<seq><suffix>.part`` in `directory`; when that file
reaches ``max_bytes`` (checked after each batch, so a file can exceed it by one batch) or on
`flush` / `close`, it is closed and renamed without ``.part``. A published file is therefore
complete and holds only whole records; readers ignore ``*.part``. `token` is random per
recorder, so recorders (and processes) may share a directory. A killed process loses the
batches it had not written, and the one it was killed writing may be cut (a ``write(2)`` of
megabytes is not atomic against ``SIGKILL``): its ``.part`` file holds whole batches, then
perhaps the start of one, which a reader drops (``docs/pipeline-schemas.md`` shows how).

Wall-clock anchors. The times a purgatory passes are its clock's (``loop.time()``). To link them
to UTC, the recorder reads its `clock` (the purgatory's, by default ``time.monotonic``, which is
asyncio's and uvloop's) together with ``time.time()``, once per batch, never per operation: a
subclass writes the pair (an *anchor*) at the start of every file and again whenever the two
clocks have moved apart by more than `ANCHOR_DRIFT` since the last one. The first operation to
end checks that `clock` is the purgatory's (its end time was read microseconds before); if they
differ by more than `SAME_CLOCK` (a `ManualClock`, a replay's virtual time) no anchor is ever
written and `anchor_error` says why.

Failures. A write that fails (a full disk, a removed directory) raises to the caller (a
purgatory reports it and settles the operation regardless) after counting the records it lost in
`lost_lines`: the failed batch, and the records of a file that can no longer be published. After
a failed write the file is cut back to its last whole batch. `flush` (and so a purgatory's
shutdown) goes on past a failed batch: every batch is written or counted, then the first failure
is raised.

Not thread-safe: a purgatory calls its recorder from the one thread its loop runs on.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from itertools import repeat
from operator import add, attrgetter
from typing import TYPE_CHECKING, Any, Final, Self, final

from ._events import WATCH_ITEMS, EventSink, Outcome, thresholds_of

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = (
    "ANCHOR_DRIFT",
    "EVENT_LOG_VERSION",
    "SAME_CLOCK",
    "WATCHED",
    "Batch",
    "FileRecorder",
)

#: The schema version of every record; bumped on any incompatible change.
EVENT_LOG_VERSION: Final = 2
#: Seconds the two clocks may move apart (against the last anchor) before a new anchor is
#: written: a UTC time computed from a log is this close to what ``time.time()`` said.
ANCHOR_DRIFT: Final = 0.001
#: Seconds an operation's end time may differ from the recorder's `clock` for the two to be
#: taken as one clock (they are read microseconds apart; a pause of the process can add more).
SAME_CLOCK: Final = 1.0
#: The outcome of a *watch record* (``watch_records=True``): the operation was watched at
#: ``watched_at`` and had not ended when the record was taken (its end record follows).
WATCHED: Final = "watched"


@final
@dataclass(slots=True)
class Batch:
    """The finished operations of a batch, column by column (what a format renders)."""

    names: list[str]
    ids: list[Any]
    keys: list[tuple[Hashable, ...]]
    thresholds: list[tuple[Any, ...] | None]
    watched: list[float]
    timeouts: list[float]
    deadlines: list[float]
    outcomes: list[str]
    ended: list[float | None]
    """``None`` for an operation still open at `close`."""
    fields: list[Any]

    def __len__(self) -> int:
        return len(self.ids)


@final
class _Stream:
    """One purgatory name's open operations in a recorder, a dict per column (keyed by the
    operation: entries, no object per operation): keys, marks, watch time, id, and the
    `fields` values and deadlines given to `record_watch` that are not watched_at + timeout."""

    __slots__ = ("at", "deadlines", "fields", "ids", "keys", "marks", "name", "next_id")

    def __init__(self, name: str) -> None:
        self.name = name
        self.keys: dict[Any, tuple[Hashable, ...]] = {}
        self.marks: dict[Any, Any] = {}
        self.at: dict[Any, float] = {}
        self.ids: dict[Any, Any] = {}
        self.fields: dict[Any, Any] = {}
        self.deadlines: dict[Any, float] = {}
        self.next_id = 0

    def open(self, ops: list[Any], keys: list[Any], marks: list[Any], at: list[float]) -> None:
        """Remember the watched `ops` (ids in watch order, unless `ids` is extended after)."""
        self.keys.update(zip(ops, keys, strict=True))
        self.marks.update(zip(ops, marks, strict=True))
        self.at.update(zip(ops, at, strict=True))


@final
class _Pending:
    """The ended operations of the batch being filled, in end order, as columns of raw values:
    moving operations here is dict pops into lists, in C-level loops."""

    __slots__ = (
        "at",
        "deadlines",
        "ended",
        "fields",
        "ids",
        "keys",
        "marks",
        "names",
        "ops",
        "outcomes",
    )

    def __init__(self) -> None:
        self.names: list[str] = []
        self.ops: list[Any] = []
        self.keys: list[tuple[Hashable, ...]] = []
        self.marks: list[Any] = []
        self.at: list[float] = []
        self.ids: list[Any] = []
        self.outcomes: list[str] = []
        self.ended: list[float | None] = []
        self.fields: list[Any] = []
        # Deadlines given to `record_watch`, by operation.
        self.deadlines: dict[Any, float] = {}

    def __len__(self) -> int:
        return len(self.ops)

    def add(self, stream: _Stream, ops: list[Any], outcomes: Any, ended: Any, fields: bool) -> int:
        """Move `stream`'s open `ops` here with their `outcomes` and `ended` times; return how
        many were not open (ends of operations never seen watched: dropped)."""
        at = list(map(stream.at.pop, ops, repeat(None)))
        unmatched = 0
        if None in at:
            kept = [i for i, value in enumerate(at) if value is not None]
            unmatched = len(ops) - len(kept)
            outcomes, ended = list(outcomes), list(ended)
            ops = [ops[i] for i in kept]
            at = [at[i] for i in kept]
            outcomes = [outcomes[i] for i in kept]
            ended = [ended[i] for i in kept]
        self.names.extend(repeat(stream.name, len(ops)))
        self.ops.extend(ops)
        self.keys.extend(map(stream.keys.pop, ops))
        self.marks.extend(map(stream.marks.pop, ops))
        self.at.extend(at)  # type: ignore[arg-type]
        self.ids.extend(map(stream.ids.pop, ops))
        self.outcomes.extend(outcomes)
        self.ended.extend(ended)
        if fields:
            self.fields.extend(map(stream.fields.pop, ops))
        if stream.deadlines:
            given = stream.deadlines
            self.deadlines.update((op, given.pop(op)) for op in ops if op in given)
        return unmatched

    def add_watches(self, stream: _Stream, ops: list[Any], fields: bool) -> None:
        """A *watch record* (outcome ``watched``, no end) for each of `stream`'s just-watched
        `ops`, which stay open: their values are copied, not moved."""
        n = len(ops)
        self.names.extend(repeat(stream.name, n))
        self.ops.extend(ops)
        self.keys.extend(map(stream.keys.__getitem__, ops))
        self.marks.extend(map(stream.marks.__getitem__, ops))
        self.at.extend(map(stream.at.__getitem__, ops))
        self.ids.extend(map(stream.ids.__getitem__, ops))
        self.outcomes.extend(repeat(WATCHED, n))
        self.ended.extend(repeat(None, n))
        if fields:
            self.fields.extend(map(stream.fields.__getitem__, ops))
        if stream.deadlines:
            given = stream.deadlines
            self.deadlines.update((op, given[op]) for op in ops if op in given)

    def take(self, n: int) -> Batch:
        """The columns of the first `n` operations (at most), which leave the batch."""
        ops = self.ops[:n]
        keys, marks, at = self.keys[:n], self.marks[:n], self.at[:n]
        count = len(ops)
        thresholds: list[Any] = [None] * count
        if marks.count(None) != count:
            thresholds = list(map(_thresholds, keys, marks))
        timeouts = list(map(_timeout_of, ops))
        deadlines = list(map(add, at, timeouts))
        if self.deadlines:
            given = self.deadlines
            deadlines = [
                given.get(op, deadline) for op, deadline in zip(ops, deadlines, strict=True)
            ]
            # (A watch record leaves its deadline for the operation's end record.)
            for op, outcome in zip(ops, self.outcomes[:n], strict=True):
                if outcome != WATCHED:
                    given.pop(op, None)
        batch = Batch(
            self.names[:n],
            self.ids[:n],
            keys,
            thresholds,
            at,
            timeouts,
            deadlines,
            self.outcomes[:n],
            self.ended[:n],
            self.fields[:n] or [None] * count,
        )
        for column in (
            self.names,
            self.ops,
            self.keys,
            self.marks,
            self.at,
            self.ids,
            self.outcomes,
            self.ended,
            self.fields,
        ):
            del column[:n]
        return batch


class FileRecorder:
    """The shared part of `JsonLinesEventLog` and `ArrowEventLog` (see the module docstring)."""

    __slots__ = (
        "_anchor",
        "_anchor_due",
        "_buffer_lines",
        "_clock",
        "_directory",
        "_fd",
        "_fields",
        "_file_bytes",
        "_file_lines",
        "_key",
        "_limit",
        "_max_bytes",
        "_op_id",
        "_part",
        "_pending",
        "_prefix",
        "_seq",
        "_sinks",
        "_streams",
        "_suffix",
        "_token",
        "_unchecked",
        "_watch_records",
        "anchor_error",
        "closed_files",
        "lost_lines",
        "unmatched_ends",
    )

    def __init__(
        self,
        directory: str | os.PathLike[str],
        suffix: str,
        *,
        prefix: str,
        max_bytes: int,
        buffer_lines: int,
        fields: Callable[[Any], Mapping[str, Any]] | None,
        op_id: Callable[[Any], int | str] | None,
        key: Callable[[Hashable], str],
        clock: Callable[[], float] | None,
        watch_records: bool = False,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes!r}")
        if buffer_lines < 1:
            raise ValueError(f"buffer_lines must be >= 1, got {buffer_lines!r}")
        self._directory = os.fspath(directory)
        os.makedirs(self._directory, exist_ok=True)
        self._prefix = prefix
        self._suffix = suffix
        self._token = uuid.uuid4().hex[:12]
        self._max_bytes = max_bytes
        self._buffer_lines = buffer_lines
        self._fields = fields
        self._op_id = op_id
        self._key = key
        self._watch_records = watch_records
        # Per purgatory name: its open operations and its part of the batch.
        self._streams: dict[str, _Stream] = {}
        # The batch being filled.
        self._pending = _Pending()
        # The purgatories' sinks of raw events (the bulk path), taken by `_collect`.
        self._sinks: list[EventSink] = []
        self._fd = -1
        self._file_bytes = 0
        self._file_lines = 0
        self._part = ""
        self._seq = 0
        self._clock = clock
        # The anchor written last (clock, utc); None until the clock has been checked.
        self._anchor: tuple[float, float] | None = None
        self._anchor_due = False
        # The first end checks the clock (a batch of one), then batches are `buffer_lines`.
        self._unchecked = clock is not None
        self._limit = 1 if clock is not None else buffer_lines
        self.closed_files: list[str] = []
        """Paths of the complete files written so far, in order."""
        self.unmatched_ends = 0
        """`record_end` calls for operations this recorder never saw watched (none expected)."""
        self.lost_lines = 0
        """Records that could not be written or published (each loss also raised its error)."""
        self.anchor_error: str | None = None if clock is not None else "no clock given"
        """Why this recorder writes no anchor; ``None`` while it does (or will, once checked)."""

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self._directory!r} open={self._opened()} "
            f"buffered={len(self._pending)} files={len(self.closed_files)}>"
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the EventLog protocol ----------------------------------------------------------------

    def record_watch(
        self,
        purgatory: str,
        op: DelayedOperation[Any],
        keys: tuple[Hashable, ...],
        thresholds: tuple[Any, ...] | None,
        watched_at: float,
        deadline: float,
    ) -> None:
        """Remember `op` until it ends. Runtime complexity: O(1) (plus `fields` and `op_id`)."""
        stream = self._stream(purgatory)
        marks = None if thresholds is None else _Given(thresholds)
        stream.open([op], [keys], [marks], [watched_at])
        stream.ids[op] = stream.next_id if self._op_id is None else self._op_id(op)
        stream.next_id += 1
        if self._fields is not None:
            stream.fields[op] = self._fields(op)
        if not deadline == watched_at + op._timeout:  # noqa: SIM201 - NaN too
            stream.deadlines[op] = deadline
        if self._watch_records:
            self._watched(stream, [op], watched_at)

    def record_end(
        self, purgatory: str, op: DelayedOperation[Any], outcome: Outcome, ended_at: float
    ) -> None:
        """Put `op` on the batch; render and write the batch when it is full. O(1) amortised."""
        self._ended(self._stream(purgatory), [op], [outcome], [ended_at])

    def flush(self) -> None:
        """Write every finished operation and publish the file (rename away ``.part``).

        Operations still open stay in memory and are written when they end (or at `close`).
        A batch whose write fails is counted in `lost_lines` and the flush goes on with the
        next ones; the first failure is raised once every batch is written or counted.
        """
        failure: Exception | None = None
        try:
            for _ in range(len(self._sinks) + 1):  # each failure leaves the failed sink taken
                try:
                    self._collect()
                    break
                except Exception as exc:  # noqa: BLE001 - counted; raised after the rest
                    failure = failure or exc
            while self._pending:
                try:
                    self._write_batch()
                except Exception as exc:  # noqa: BLE001 - counted; raised after the rest
                    failure = failure or exc
        finally:  # what is whole is published, whatever the last write did (cut back to it)
            self._publish()
        if failure is not None:
            raise failure

    def event_sink(self, purgatory: str) -> EventSink:
        """The bulk path (see ``purgatory._events``): where the purgatory named `purgatory`
        appends its raw events, taken a batch at a time."""
        # The first end checks the clock (at once: a list of one event); then whole batches.
        limit = 1 if self._unchecked else self._buffer_lines * WATCH_ITEMS
        sink = EventSink(purgatory, limit, self._collect)
        self._sinks.append(sink)
        return sink

    # -- beyond the protocol ------------------------------------------------------------------

    @property
    def open_operations(self) -> int:
        """Operations watched and not yet ended."""
        self._collect()
        return self._opened()

    def close(self) -> None:
        """Write everything, operations still open included (outcome ``open``); idempotent.

        The recorder may be used again afterwards: it starts a new file.
        """
        self._collect()
        for stream in self._streams.values():
            if stream.at:
                ops = list(stream.at)
                n = len(ops)
                self._pending.add(stream, ops, repeat("open", n), repeat(None, n), self._fields_on)
        self.flush()

    # -- for subclasses -----------------------------------------------------------------------

    def _render(self, batch: Batch, anchor: tuple[float, float] | None, new: bool) -> bytes:
        """The bytes of `batch` for the current file.

        `anchor` is the anchor in force (``None`` before the first); `new` says it is new to the
        file (the file's first, or the clocks drifted) and must be written with this batch.
        """
        raise NotImplementedError

    def _file_start(self) -> bytes:
        """What a new file begins with (a format's header); nothing by default."""
        return b""

    # -- internals ----------------------------------------------------------------------------

    @property
    def _fields_on(self) -> bool:
        return self._fields is not None

    def _opened(self) -> int:
        return sum(len(stream.at) for stream in self._streams.values())

    def _stream(self, purgatory: str) -> _Stream:
        stream = self._streams.get(purgatory)
        if stream is None:
            stream = self._streams[purgatory] = _Stream(purgatory)
        return stream

    def _collect(self) -> None:
        """Take every sink's events (the bulk path): watches into the open operations, then
        ends onto the batch, which is written whenever it is full."""
        for sink in self._sinks:
            if sink.watches:
                self._open_all(sink)
            ends = sink.ends
            if ends:
                raw = ends.copy()
                ends.clear()
                self._ended(self._stream(sink.name), raw[0::3], raw[1::3], raw[2::3])

    def _open_all(self, sink: EventSink) -> None:
        """`record_watch` for every watch of `sink`, in bulk: a slice per column of the flat
        list the purgatory extended, C-level loops; ids in watch order. `fields` and `op_id`
        are called here, soon after each watch."""
        raw = sink.watches.copy()
        sink.watches.clear()
        stream = self._stream(sink.name)
        ops = raw[0::4]
        stream.open(ops, raw[1::4], raw[2::4], raw[3::4])
        if self._op_id is None:
            first = stream.next_id
            stream.ids.update(zip(ops, range(first, first + len(ops)), strict=True))
        else:
            stream.ids.update(zip(ops, map(self._op_id, ops), strict=True))
        stream.next_id += len(ops)
        if self._fields is not None:
            stream.fields.update(zip(ops, map(self._fields, ops), strict=True))
        if self._watch_records and ops:
            self._watched(stream, ops, raw[3])

    def _watched(self, stream: _Stream, ops: list[Any], first_at: float) -> None:
        """Watch records for `ops` onto the batch (``watch_records``), written when it is full:
        a reader then knows of an operation before it ends, and of one that never does."""
        if self._unchecked:
            self._check_clock(first_at)  # (a watch time was read just now too)
        pending = self._pending
        pending.add_watches(stream, ops, self._fields is not None)
        while len(pending) >= self._limit:
            self._write_batch()

    def _ended(self, stream: _Stream, ops: list[Any], outcomes: Any, ended: Any) -> None:
        """`ops` of `stream` ended (`outcomes`, at `ended`): onto the batch, written when full."""
        if self._unchecked:
            ended = list(ended)
            self._check_clock(ended[0])
        pending = self._pending
        self.unmatched_ends += pending.add(stream, ops, outcomes, ended, self._fields is not None)
        while len(pending) >= self._limit:
            self._write_batch()

    def _check_clock(self, ended_at: float) -> None:
        """At the first end (or watch record): is `clock` the purgatory's? (`ended_at` was read
        just now.)"""
        self._limit = self._buffer_lines
        self._unchecked = False
        for sink in self._sinks:
            sink.limit = self._buffer_lines * WATCH_ITEMS
        clock = self._clock
        assert clock is not None
        now = clock()
        if abs(now - ended_at) <= SAME_CLOCK:
            self._anchor_due = True
            return
        self._clock = None
        self.anchor_error = (
            f"an operation ended (or was watched) at {ended_at!r} while the recorder's clock "
            f"read {now!r}: the purgatory has another clock, so no UTC anchor is written"
        )

    def _take_anchor(self, new_file: bool) -> bool:
        """Read both clocks if anchored; True if the batch must carry a new anchor."""
        clock = self._clock
        if clock is None or not (self._anchor_due or self._anchor is not None):
            return False
        best = (0.0, 0.0, 0.0)
        for attempt in range(3):  # the reading with the least time between its wall reads
            before = time.time()
            at = clock()
            after = time.time()
            if attempt == 0 or after - before < best[2]:
                best = (at, (before + after) / 2, after - before)
        at, utc, _ = best
        last = self._anchor
        if (
            not new_file
            and last is not None
            and abs((utc - at) - (last[1] - last[0])) <= ANCHOR_DRIFT
        ):
            return False
        self._anchor = (at, utc)
        self._anchor_due = False
        return True

    def _write_batch(self) -> None:
        """Write the first `buffer_lines` operations of the batch being filled (or all of it
        once the first end has checked the clock: `_limit` is 1 until then)."""
        if not self._pending:
            return
        batch = self._pending.take(self._buffer_lines)
        ended = batch.ids
        try:
            new_file = self._fd < 0
            new_anchor = self._take_anchor(new_file)
            data = self._render(batch, self._anchor, new_anchor)
            if new_file:
                data = self._file_start() + data
                name = f"{self._prefix}-{self._token}-{self._seq:06d}{self._suffix}.part"
                self._seq += 1
                self._part = os.path.join(self._directory, name)
                self._fd = os.open(self._part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                self._file_bytes = self._file_lines = 0
            _write_all(self._fd, data)
        except Exception as exc:  # a failed write, or a render that raised (a user callback)
            self._lose(len(ended), exc)
            if self._anchor is not None:  # the anchor may have gone with the batch: write again
                self._anchor = None
                self._anchor_due = True
            raise
        self._file_bytes += len(data)
        self._file_lines += len(ended)
        if self._file_bytes >= self._max_bytes:
            self._publish()

    def _lose(self, lines: int, exc: Exception) -> None:
        """Count a failed batch; cut the file back to its whole batches, or give it up (when it
        holds none, its start, such as an Arrow stream's schema, may have gone with the batch:
        the next batch starts a new file)."""
        self.lost_lines += lines
        exc.add_note(f"event log: {lines} records lost ({self.lost_lines} so far)")
        if self._fd < 0:
            return
        if not self._file_bytes:
            self._abandon()
            return
        try:
            os.ftruncate(self._fd, self._file_bytes)
            os.lseek(self._fd, self._file_bytes, os.SEEK_SET)
        except OSError:
            self._abandon()

    def _abandon(self) -> None:
        """Give up the current file: its records are lost (it may hold part of one)."""
        self.lost_lines += self._file_lines
        fd, self._fd = self._fd, -1
        self._file_lines = 0
        try:
            os.close(fd)
        finally:
            if os.path.exists(self._part):
                os.remove(self._part)

    def _publish(self) -> None:
        fd = self._fd
        if fd < 0:
            return
        final = self._part.removesuffix(".part")
        self._fd = -1
        lines, self._file_lines = self._file_lines, 0
        try:
            os.close(fd)
            os.replace(self._part, final)
        except OSError as exc:
            self.lost_lines += lines
            exc.add_note(f"event log: {lines} records lost ({self.lost_lines} so far)")
            raise
        self.closed_files.append(final)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@final
class _Given(tuple[Any, ...]):
    """Thresholds given to `record_watch` as they are, where a watch's marks stand."""

    __slots__ = ()


def _thresholds(keys: tuple[Hashable, ...], marks: Any) -> tuple[Any, ...] | None:
    if marks is None or type(marks) is _Given:
        return marks
    return thresholds_of(keys, marks)


_timeout_of = attrgetter("_timeout")
