"""`JsonLinesEventLog`: an `EventLog` that writes one JSON line per operation, at its end.

Theory of operation. A purgatory given ``event_log=`` calls `record_watch` when an operation
enters and `record_end` when its fate is settled (see ``_events.py``). The recorder keeps a small
tuple per *open* operation (keyed by the operation's identity) from its watch to its end, and
at the end renders its line (one ``%``-format; the watch tuple and the operation are released at
once) onto a buffer. No I/O on the hot path: the buffer is written in one piece when it holds
``buffer_lines`` lines, on `flush` and on `close`.

Files. Lines go to ``<prefix>-<token>-<seq>.jsonl.part`` in `directory`; when that file reaches
``max_bytes`` (checked after each batch, so a file can exceed it by one batch) or on `flush` /
`close`, it is closed and renamed to ``<prefix>-<token>-<seq>.jsonl``. A ``.jsonl`` file is
therefore complete and only ever holds whole lines; readers (the pipeline's ``analyze``) read
``*.jsonl`` and ignore ``*.part``. `token` is random per recorder, so several processes may share
a directory. `flush` publishes: everything that ended so far is in a ``.jsonl`` file when it
returns (a purgatory calls it from ``shutdown``, after cancelling what was pending).

Operations still open at `close` are written with ``"outcome": "open"`` and ``"ended_at":
null``; at `flush` they stay in memory and are written when they end. The line schema (version
1) is documented in ``docs/pipeline-schemas.md``.

Wall-clock time. Times in the log are the purgatory's clock (``loop.time()``: seconds since
some unspecified point, not comparable across hosts or restarts). Each file therefore carries
*anchors*: lines ``{"v":2,"anchor":{"clock":C,"utc":U}}`` saying that the purgatory's clock read
``C`` when the system clock (``time.time()``) read ``U``. The recorder reads both clocks itself,
never per operation: once per batch it writes, an anchor goes first in each new file and again
before a batch whenever the two clocks have moved apart by more than `ANCHOR_DRIFT` since the
last anchor (a step of the system clock, a suspend). It must know the purgatory's clock for
that (`clock`, default ``time.monotonic``, which is what asyncio's and uvloop's loops use); it
checks it against the first operation that ends, and if the two disagree by more than
`SAME_CLOCK` (a `ManualClock`, a replay's virtual time) it writes no anchor and says why in
`anchor_error`. ``clock=None`` turns anchors off.

Standard JSON only. A number JSON cannot hold (an infinite threshold, a NaN from ``fields=``)
is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``: strict parsers accept
every line, and Spark's JSON reader reads these strings back as doubles.

Failures. A write that fails (a full disk, a removed directory) raises to the caller (the
purgatory reports it and settles the operation regardless) after counting the lines it lost in
`lost_lines`: the failed batch, and the lines of a file that can no longer be published. A file
is never left with part of a line: after a failed write it is cut back to its last whole batch.

Not thread-safe: a purgatory calls its recorder from the one thread its loop runs on.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Final, final

from ._events import Outcome

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = ("ANCHOR_DRIFT", "EVENT_LOG_VERSION", "SAME_CLOCK", "JsonLinesEventLog")

#: The ``"v"`` field of every line; bumped on any incompatible change of the line schema.
EVENT_LOG_VERSION: Final = 2
#: Seconds the two clocks may move apart (against the last anchor) before a new anchor is
#: written: a UTC time computed from a log is this close to what ``time.time()`` said.
ANCHOR_DRIFT: Final = 0.001
#: Seconds an operation's end time may differ from the recorder's `clock` for the two to be
#: taken as one clock (they are read microseconds apart; a pause of the process can add more).
SAME_CLOCK: Final = 1.0

_LINE = (
    '{"v":2,"purgatory":%s,"id":%s,"keys":[%s],"thresholds":%s,"watched_at":%s,"timeout":%s,'
    '"deadline":%s,"outcome":"%s","ended_at":%s%s}\n'
)
# Key tuples whose JSON rendering is remembered; past this the cache starts over (unique keys
# such as request ids would otherwise grow it without bound).
_KEY_CACHE_LIMIT = 65536

_Watch = tuple[str, Any, tuple[Hashable, ...], Any, float, float, float, Any]


@final
class JsonLinesEventLog:
    """Record each operation's lifecycle as one JSON line, written when the operation ends.

    Args:
        directory: Where the files go (created if missing).
        prefix: The start of every file name.
        max_bytes: Rotate to a new file once the current one holds at least this many bytes.
        buffer_lines: Finished operations kept before a batch is formatted and written.
        fields: Called once per operation at its watch; the mapping it returns is written as
            the line's ``"fields"`` object (values JSON-encoded, ``str()`` for anything JSON does
            not know). For instance ``fields=lambda op: {"request_id": op.request_id}``.
        op_id: Called once per operation at its watch for the line's ``"id"`` (an int or a str);
            ``None``: a counter per purgatory name, from 0 in watch order.
        key: Renders one key as a string for ``"keys"``; default ``str``.
        clock: The purgatory's clock, read (with ``time.time()``) to anchor the log to UTC;
            default ``time.monotonic``, the clock of asyncio's event loops. ``None``: no
            anchors (the times are not of a real clock, as in a replay).

    Raises:
        ValueError: `max_bytes` or `buffer_lines` is < 1.
    """

    __slots__ = (
        "_anchor",
        "_anchor_due",
        "_buffer_lines",
        "_clock",
        "_directory",
        "_ended",
        "_fd",
        "_fields",
        "_file_bytes",
        "_file_lines",
        "_ids",
        "_key",
        "_key_cache",
        "_limit",
        "_max_bytes",
        "_name_cache",
        "_one_key_cache",
        "_op_id",
        "_open",
        "_part",
        "_prefix",
        "_seq",
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
        *,
        prefix: str = "events",
        max_bytes: int = 64 * 1024 * 1024,
        buffer_lines: int = 8192,
        fields: Callable[[Any], Mapping[str, Any]] | None = None,
        op_id: Callable[[Any], int | str] | None = None,
        key: Callable[[Hashable], str] = str,
        clock: Callable[[], float] | None = time.monotonic,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes!r}")
        if buffer_lines < 1:
            raise ValueError(f"buffer_lines must be >= 1, got {buffer_lines!r}")
        self._directory = os.fspath(directory)
        os.makedirs(self._directory, exist_ok=True)
        self._prefix = prefix
        self._token = uuid.uuid4().hex[:12]
        self._max_bytes = max_bytes
        self._buffer_lines = buffer_lines
        self._fields = fields
        self._op_id = op_id
        self._key = key
        self._ids: dict[str, int] = {}
        self._open: dict[DelayedOperation[Any], _Watch] = {}
        self._ended: list[str] = []
        self._key_cache: dict[tuple[Hashable, ...], str] = {}
        self._one_key_cache: dict[Hashable, str] = {}
        self._name_cache: dict[str, str] = {}
        self._fd = -1
        self._file_bytes = 0
        self._file_lines = 0
        self._part = ""
        self._seq = 0
        self.closed_files: list[str] = []
        """Paths of the complete ``.jsonl`` files written so far, in order."""
        self.unmatched_ends = 0
        """`record_end` calls for operations this recorder never saw watched (none expected)."""
        self.lost_lines = 0
        """Lines that could not be written or published (each loss also raised its error)."""
        self.anchor_error: str | None = None if clock is not None else "no clock given"
        """Why this recorder writes no anchor; ``None`` while it does (or will, once checked)."""
        self._clock = clock
        # The anchor written last (clock, utc); None until the clock has been checked.
        self._anchor: tuple[float, float] | None = None
        # The first end checks the clock (a batch of one), then batches are `buffer_lines`.
        self._limit = 1 if clock is not None else buffer_lines
        self._anchor_due = False
        self._unchecked = clock is not None

    def __repr__(self) -> str:
        return (
            f"<JsonLinesEventLog {self._directory!r} open={len(self._open)} "
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
        if self._op_id is None:
            ids = self._ids
            ident: Any = ids.get(purgatory, 0)
            ids[purgatory] = ident + 1
        else:
            ident = self._op_id(op)
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
        """Queue `op`'s line; write a batch when ``buffer_lines`` are queued. O(1) amortised."""
        watch = self._open.pop(op, None)
        if watch is None:
            self.unmatched_ends += 1
            return
        ended = self._ended
        ended.append(self._line(watch, outcome, ended_at))
        if len(ended) >= self._limit:
            if self._unchecked:
                self._check_clock(ended_at)
                if len(ended) < self._limit:
                    return
            self._write_batch()

    def flush(self) -> None:
        """Write every finished operation and publish the file (rename ``.part`` to ``.jsonl``).

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
        """Write everything, operations still open included (``"outcome": "open"``); idempotent.

        The recorder may be used again afterwards: it starts a new file.
        """
        if self._open:
            self._ended.extend(self._line(watch, "open", None) for watch in self._open.values())
            self._open.clear()
        self.flush()

    def __enter__(self) -> JsonLinesEventLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------

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

    def _anchor_line(self, new_file: bool) -> str:
        """An anchor line if this batch needs one (a new file, or the clocks drifted), else ''."""
        clock = self._clock
        if clock is None or not (self._anchor_due or self._anchor is not None):
            return ""
        best = None
        for _ in range(3):  # the reading with the least time between its two wall-clock reads
            before = time.time()
            at = clock()
            after = time.time()
            if best is None or after - before < best[2]:
                best = (at, (before + after) / 2, after - before)
        assert best is not None
        at, utc, _ = best
        last = self._anchor
        if (
            not new_file
            and last is not None
            and abs((utc - at) - (last[1] - last[0])) <= (ANCHOR_DRIFT)
        ):
            return ""
        self._anchor = (at, utc)
        self._anchor_due = False
        return f'{{"v":2,"anchor":{{"clock":{at!r},"utc":{utc!r}}}}}\n'

    def _write_batch(self) -> None:
        ended = self._ended
        if not ended:
            return
        self._ended = []
        try:
            new_file = self._fd < 0
            data = (self._anchor_line(new_file) + "".join(ended)).encode()
            if new_file:
                name = f"{self._prefix}-{self._token}-{self._seq:06d}.jsonl.part"
                self._seq += 1
                self._part = os.path.join(self._directory, name)
                self._fd = os.open(self._part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                self._file_bytes = self._file_lines = 0
            _write_all(self._fd, data)
        except OSError as exc:
            self._lose(len(ended), exc)
            raise
        self._file_bytes += len(data)
        self._file_lines += len(ended)
        if self._file_bytes >= self._max_bytes:
            self._publish()

    def _lose(self, lines: int, exc: OSError) -> None:
        """Count a failed batch; cut the file back to its whole batches, or give it up."""
        self.lost_lines += lines
        exc.add_note(f"event log: {lines} lines lost ({self.lost_lines} so far)")
        if self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, self._file_bytes)
            os.lseek(self._fd, self._file_bytes, os.SEEK_SET)
        except OSError:
            self._abandon()

    def _abandon(self) -> None:
        """Give up the current file: its lines are lost (it may hold part of a line)."""
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
        try:
            os.close(fd)
            self._fd = -1
            os.replace(self._part, final)
        except OSError as exc:
            lines = self._file_lines
            self.lost_lines += lines
            self._fd = -1
            self._file_lines = 0
            exc.add_note(f"event log: {lines} lines lost ({self.lost_lines} so far)")
            raise
        self._file_lines = 0
        self.closed_files.append(final)

    def _line(self, watch: _Watch, outcome: str, ended_at: float | None) -> str:
        """One operation's line, rendered when it ends so that nothing of it stays referenced.

        Floats go through ``%s``, which is their shortest round-tripping ``repr`` (valid JSON
        for finite numbers; the others become strings, see `_number`); names and keys are
        JSON-encoded once and remembered. Strings are not tracked by the cyclic GC, tuples and
        operations are: holding a batch of lines rather than of watches keeps the collector's
        work down.
        """
        purgatory, ident, keys, thresholds, watched_at, timeout, deadline, fields = watch
        total = watched_at + timeout + deadline + (0.0 if ended_at is None else ended_at)
        if total - total != 0.0:  # a NaN or an infinity among them (rare): spelled as strings
            watched_at, timeout, deadline = _number(watched_at), _number(timeout), _number(deadline)
            ended_at = None if ended_at is None else _number(ended_at)
        name = self._name_cache.get(purgatory)
        if name is None:
            name = self._name_cache[purgatory] = json.dumps(purgatory)
        text = self._key_cache.get(keys)
        if text is None:
            text = self._render_keys(keys)
        return _LINE % (
            name,
            ident if type(ident) is int else json.dumps(ident),
            text,
            "null" if thresholds is None else _json(list(thresholds)),
            watched_at,
            timeout,
            deadline,
            outcome,
            "null" if ended_at is None else ended_at,
            "" if fields is None else ',"fields":' + _json(fields),
        )

    def _render_keys(self, keys: tuple[Hashable, ...]) -> str:
        """JSON of `keys` without the brackets, remembered per key tuple and per key (bounded)."""
        cache = self._key_cache
        if len(cache) >= _KEY_CACHE_LIMIT:
            cache.clear()
        one = self._one_key_cache
        if len(one) >= _KEY_CACHE_LIMIT:
            one.clear()
        parts = []
        for key in keys:
            text = one.get(key)
            if text is None:
                text = one[key] = json.dumps(self._key(key))
            parts.append(text)
        joined = cache[keys] = ",".join(parts)
        return joined


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


_NON_FINITE: Final = {math.inf: '"Infinity"', -math.inf: '"-Infinity"'}


def _number(value: Any) -> Any:
    """A time as JSON: the float itself if finite, else the string ``"NaN"``/``"[-]Infinity"``."""
    if value - value == 0.0:
        return value
    return _NON_FINITE.get(value, '"NaN"')


def _finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by its string (recursively in containers)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json(value: Any) -> str:
    """Standard JSON of `value` (``str()`` for what JSON does not know; see `_finite`)."""
    try:
        return json.dumps(value, default=str, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), default=str, separators=(",", ":"), allow_nan=False)
