"""`FileRecorder`: what every file-writing `EventLog` shares, whatever it renders.

Theory of operation. A purgatory given ``event_log=`` calls `record_watch` when an operation
enters and `record_end` when its fate is settled (see ``_events.py``); both are on its hot path.
So they only keep raw values: `record_watch` stores one tuple per *open* operation (keyed by the
operation), `record_end` moves it, with the outcome and end time, onto the batch. Nothing is
formatted there. When the batch holds ``buffer_lines`` operations, or on `flush` / `close`, a
subclass renders the whole batch at once (`_render`: JSON Lines, or an Arrow record batch) and
the bytes are written to the current file in one piece.

Files. Batches go to ``<prefix>-<token>-<seq><suffix>.part`` in `directory`; when that file
reaches ``max_bytes`` (checked after each batch, so a file can exceed it by one batch) or on
`flush` / `close`, it is closed and renamed without ``.part``. A published file is therefore
complete and holds only whole records; readers ignore ``*.part``. `token` is random per
recorder, so recorders (and processes) may share a directory. A killed process loses the batch
it had not written; its ``.part`` file holds whole batches only (a batch is one write).

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
a failed write the file is cut back to its last whole batch.

Not thread-safe: a purgatory calls its recorder from the one thread its loop runs on.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Final

from ._events import Outcome

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = ("ANCHOR_DRIFT", "EVENT_LOG_VERSION", "SAME_CLOCK", "FileRecorder")

#: The schema version of every record; bumped on any incompatible change.
EVENT_LOG_VERSION: Final = 2
#: Seconds the two clocks may move apart (against the last anchor) before a new anchor is
#: written: a UTC time computed from a log is this close to what ``time.time()`` said.
ANCHOR_DRIFT: Final = 0.001
#: Seconds an operation's end time may differ from the recorder's `clock` for the two to be
#: taken as one clock (they are read microseconds apart; a pause of the process can add more).
SAME_CLOCK: Final = 1.0

#: One open operation: (purgatory, id, keys, thresholds, watched_at, timeout, deadline, fields).
Watch = tuple[str, Any, tuple[Hashable, ...], Any, float, float, float, Any]
#: The finished operations of a batch, as three parallel lists: their watches, outcomes and end
#: times (None for an operation still open at `close`).
Batch = tuple[list[Watch], list[str], list[float | None]]


class FileRecorder:
    """The shared part of `JsonLinesEventLog` and `ArrowEventLog` (see the module docstring)."""

    __slots__ = (
        "_anchor",
        "_anchor_due",
        "_buffer_lines",
        "_clock",
        "_directory",
        "_ended",
        "_ends",
        "_fd",
        "_fields",
        "_file_bytes",
        "_file_lines",
        "_ids",
        "_last_name",
        "_limit",
        "_max_bytes",
        "_next_id",
        "_op_id",
        "_open",
        "_outcomes",
        "_part",
        "_prefix",
        "_seq",
        "_suffix",
        "_token",
        "_unchecked",
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
        clock: Callable[[], float] | None,
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
        self._ids: dict[str, int] = {}
        self._open: dict[DelayedOperation[Any], Watch] = {}
        self._ended: list[Watch] = []
        self._outcomes: list[str] = []
        self._ends: list[float | None] = []
        # The id counter of the purgatory named last (most recorders serve one purgatory);
        # `_ids` holds the others' while another is served.
        self._last_name: str | None = None
        self._next_id = 0
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
            f"<{type(self).__name__} {self._directory!r} open={len(self._open)} "
            f"buffered={len(self._ended)} files={len(self.closed_files)}>"
        )

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
        if purgatory is self._last_name:
            ident: Any = self._next_id
            self._next_id = ident + 1
        else:
            ident = self._new_id(purgatory, op)
        fields = self._fields
        self._open[op] = (
            purgatory,
            ident,
            keys,
            thresholds,
            watched_at,
            op._timeout,
            deadline,
            None if fields is None else fields(op),
        )

    def record_end(
        self, purgatory: str, op: DelayedOperation[Any], outcome: Outcome, ended_at: float
    ) -> None:
        """Put `op` on the batch; render and write the batch when it is full. O(1) amortised."""
        watch = self._open.pop(op, None)
        if watch is None:
            self.unmatched_ends += 1
            return
        ended = self._ended
        ended.append(watch)
        self._outcomes.append(outcome)
        self._ends.append(ended_at)
        if len(ended) >= self._limit:
            if self._unchecked:
                self._check_clock(ended_at)
                if len(ended) < self._limit:
                    return
            self._write_batch()

    def flush(self) -> None:
        """Write every finished operation and publish the file (rename away ``.part``).

        Operations still open stay in memory and are written when they end (or at `close`).
        """
        self._write_batch()
        self._publish()

    # -- beyond the protocol ------------------------------------------------------------------

    @property
    def open_operations(self) -> int:
        """Operations watched and not yet ended."""
        return len(self._open)

    def close(self) -> None:
        """Write everything, operations still open included (outcome ``open``); idempotent.

        The recorder may be used again afterwards: it starts a new file.
        """
        if self._open:
            self._ended.extend(self._open.values())
            self._outcomes.extend(["open"] * len(self._open))
            self._ends.extend([None] * len(self._open))
            self._open.clear()
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

    def _new_id(self, purgatory: str, op: DelayedOperation[Any]) -> Any:
        """The id of `op`: from `op_id`, or the counter of another purgatory than the last."""
        if self._op_id is not None:
            return self._op_id(op)
        ids = self._ids
        if self._last_name is not None:
            ids[self._last_name] = self._next_id
        ident = ids.get(purgatory, 0)
        self._last_name = purgatory
        self._next_id = ident + 1
        return ident

    def _check_clock(self, ended_at: float) -> None:
        """At the first end: is `clock` the purgatory's? (`ended_at` was read just now.)"""
        self._limit = self._buffer_lines
        self._unchecked = False
        clock = self._clock
        assert clock is not None
        now = clock()
        if abs(now - ended_at) <= SAME_CLOCK:
            self._anchor_due = True
            return
        self._clock = None
        self.anchor_error = (
            f"an operation ended at {ended_at!r} while the recorder's clock read {now!r}: "
            "the purgatory has another clock, so no UTC anchor is written"
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
        ended = self._ended
        if not ended:
            return
        batch = (ended, self._outcomes, self._ends)
        self._ended, self._outcomes, self._ends = [], [], []
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
