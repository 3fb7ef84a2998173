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

Not thread-safe: a purgatory calls its recorder from the one thread its loop runs on.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Hashable, Mapping
from typing import IO, TYPE_CHECKING, Any, Final, final

from ._events import Outcome

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = ("EVENT_LOG_VERSION", "JsonLinesEventLog")

#: The ``"v"`` field of every line; bumped on any incompatible change of the line schema.
EVENT_LOG_VERSION: Final = 1

_LINE = (
    '{"v":1,"purgatory":%s,"id":%s,"keys":[%s],"thresholds":%s,"watched_at":%s,"timeout":%s,'
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

    Raises:
        ValueError: `max_bytes` or `buffer_lines` is < 1.
    """

    __slots__ = (
        "_buffer_lines",
        "_directory",
        "_ended",
        "_fields",
        "_file",
        "_file_bytes",
        "_ids",
        "_key",
        "_key_cache",
        "_max_bytes",
        "_name_cache",
        "_one_key_cache",
        "_op_id",
        "_open",
        "_part",
        "_prefix",
        "_seq",
        "_token",
        "closed_files",
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
        self._file: IO[bytes] | None = None
        self._file_bytes = 0
        self._part = ""
        self._seq = 0
        self.closed_files: list[str] = []
        """Paths of the complete ``.jsonl`` files written so far, in order."""
        self.unmatched_ends = 0
        """`record_end` calls for operations this recorder never saw watched (none expected)."""

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
        if len(ended) >= self._buffer_lines:
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

    def _write_batch(self) -> None:
        ended = self._ended
        if not ended:
            return
        self._ended = []
        data = "".join(ended).encode()
        file = self._file
        if file is None:
            name = f"{self._prefix}-{self._token}-{self._seq:06d}.jsonl.part"
            self._seq += 1
            self._part = os.path.join(self._directory, name)
            file = self._file = open(self._part, "xb")  # noqa: SIM115 - kept open across calls
            self._file_bytes = 0
        file.write(data)
        self._file_bytes += len(data)
        if self._file_bytes >= self._max_bytes:
            self._publish()

    def _publish(self) -> None:
        file = self._file
        if file is None:
            return
        self._file = None
        file.close()
        final = self._part.removesuffix(".part")
        os.replace(self._part, final)
        self.closed_files.append(final)

    def _line(self, watch: _Watch, outcome: str, ended_at: float | None) -> str:
        """One operation's line, rendered when it ends so that nothing of it stays referenced.

        Floats go through ``%s``, which is their shortest round-tripping ``repr`` (valid JSON
        for the finite numbers a clock gives); names and keys are JSON-encoded once and
        remembered. Strings are not tracked by the cyclic GC, tuples and operations are: holding
        a batch of lines rather than of watches keeps the collector's work down.
        """
        purgatory, ident, keys, thresholds, watched_at, timeout, deadline, fields = watch
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
            "null" if thresholds is None else json.dumps(list(thresholds), default=str),
            watched_at,
            timeout,
            deadline,
            outcome,
            "null" if ended_at is None else ended_at,
            ""
            if fields is None
            else ',"fields":' + json.dumps(fields, default=str, separators=(",", ":")),
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
