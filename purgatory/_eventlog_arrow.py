"""`ArrowEventLog`: an `EventLog` that writes Arrow IPC streams, one record batch per batch.

The hot path, the files, anchors and failures are `FileRecorder`'s (``_recorder.py``): raw
values are kept per operation and nothing is formatted there. This module turns a whole batch
into one Arrow record batch: each column goes from a Python sequence to Arrow in one C-level
loop (numbers packed to C values, strings taken from their distinct values), so no work is left
in Python per operation. Files are Arrow IPC *streams* (``<prefix>-<token>-<seq>.arrows``): the
schema, then one record batch per write. A stream needs no footer, so a ``.part`` file left by a
killed process reads batch by batch up to its last whole one (the one being written may be cut:
a reader stops at it).

Columns (schema version 2; `docs/pipeline-schemas.md`): ``purgatory``, ``id`` (string),
``keys`` (list of string), ``thresholds`` (JSON text, null for a plain watch), ``watched_at``,
``timeout``, ``deadline``, ``outcome``, ``ended_at`` (null for ``open``), ``fields`` (JSON
text, null without ``fields=``) and ``anchor`` (``struct<clock, utc>``: the anchor in force
when the batch was written, null before the first). The schema's metadata holds
``{"purgatory.event_log": "2"}``. pyarrow is needed (``pip install asyncio-purgatory[arrow]``);
it is imported when the first recorder is made, so ``import purgatory`` stays standard-library
only.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Final, final

from ._eventlog import _json
from ._recorder import EVENT_LOG_VERSION, Batch, FileRecorder

__all__ = ("ARROW_VERSION_KEY", "ArrowEventLog", "arrow_schema")

#: The schema-metadata key holding the event-log schema version.
ARROW_VERSION_KEY: Final = "purgatory.event_log"


def _pyarrow() -> Any:
    try:
        import pyarrow  # optional: only this recorder needs it
    except ImportError:
        raise ImportError(
            "ArrowEventLog needs pyarrow: pip install 'asyncio-purgatory[arrow]' "
            "(or use JsonLinesEventLog, which needs nothing)"
        ) from None
    return pyarrow


def arrow_schema() -> Any:
    """The Arrow schema of an `ArrowEventLog` file (a ``pyarrow.Schema``)."""
    pa = _pyarrow()
    return pa.schema(
        [
            ("purgatory", pa.string()),
            ("id", pa.string()),
            ("keys", pa.list_(pa.string())),
            ("thresholds", pa.string()),
            ("watched_at", pa.float64()),
            ("timeout", pa.float64()),
            ("deadline", pa.float64()),
            ("outcome", pa.string()),
            ("ended_at", pa.float64()),
            ("fields", pa.string()),
            ("anchor", pa.struct([("clock", pa.float64()), ("utc", pa.float64())])),
        ],
        metadata={ARROW_VERSION_KEY: str(EVENT_LOG_VERSION)},
    )


@final
class ArrowEventLog(FileRecorder):
    """Record each operation's lifecycle as one row of an Arrow IPC stream, at its end.

    The same arguments, guarantees and counters as `JsonLinesEventLog` (whole records only,
    files published by rename, UTC anchors, `lost_lines`); the pipeline's ``analyze`` reads both
    formats. Needs pyarrow.

    Args:
        directory: Where the files go (created if missing).
        prefix: The start of every file name.
        max_bytes: Rotate to a new file once the current one holds at least this many bytes.
        buffer_lines: Finished operations kept before a batch is converted and written.
        fields: Called once per operation at its watch; the mapping it returns is written as
            JSON text in the ``fields`` column (``str()`` for anything JSON does not know).
        op_id: Called once per operation at its watch for the ``id`` column (an int or a str,
            written as a string); ``None``: a counter per purgatory name, from 0 in watch order.
        key: Renders one key as a string for ``keys``; default ``str``.
        clock: The purgatory's clock, read (with ``time.time()``) once per batch to anchor the
            log to UTC; default ``time.monotonic``, the clock of asyncio's event loops.
            ``None``: no anchors.
        watch_records: Also write a *watch record* for each operation as it is watched
            (outcome ``watched``, ``ended_at`` null), then its end record as usual: a reader
            that follows the published files (``analyze --follow --stuck``) knows of every
            operation watched, and so of those whose end never comes (a killed process, a lost
            wake-up). Twice the records; the pipeline's batch readers skip watch records.

    Raises:
        ValueError: `max_bytes` or `buffer_lines` is < 1.
        ImportError: pyarrow is not installed.
    """

    __slots__ = ("_pa", "_schema")

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
        watch_records: bool = False,
    ) -> None:
        self._pa = _pyarrow()
        self._schema = arrow_schema()
        super().__init__(
            directory,
            ".arrows",
            prefix=prefix,
            max_bytes=max_bytes,
            buffer_lines=buffer_lines,
            fields=fields,
            op_id=op_id,
            key=key,
            clock=clock,
            watch_records=watch_records,
        )

    # -- rendering ----------------------------------------------------------------------------

    def _file_start(self) -> bytes:
        data: bytes = self._schema.serialize().to_pybytes()
        return data

    def _render(self, batch: Batch, anchor: tuple[float, float] | None, new: bool) -> bytes:
        """`batch` as one IPC record-batch message (see the module docstring)."""
        pa = self._pa
        schema = self._schema
        n = len(batch)
        names, ids, keys, thresholds = batch.names, batch.ids, batch.keys, batch.thresholds
        watched, timeouts, deadlines = batch.watched, batch.timeouts, batch.deadlines
        outcomes, ends, fields = batch.outcomes, batch.ended, batch.fields
        anchor_type = schema.field("anchor").type
        arrays = [
            _repeated_strings(pa, names),
            self._id_column(ids),
            self._key_column(keys),
            _json_column(pa, thresholds, lambda t: _json(list(t))),
            _doubles(pa, watched),
            _doubles(pa, timeouts),
            _doubles(pa, deadlines),
            _outcomes(pa, outcomes),
            _doubles(pa, ends),
            _json_column(pa, fields, _json),
            pa.nulls(n, anchor_type)
            if anchor is None
            else pa.repeat(pa.scalar({"clock": anchor[0], "utc": anchor[1]}, anchor_type), n),
        ]
        data: bytes = pa.RecordBatch.from_arrays(arrays, schema=schema).serialize().to_pybytes()
        return data

    def _id_column(self, ids: list[Any]) -> Any:
        pa = self._pa
        try:  # (packed in C; a str or a huge int is refused)
            packed = struct.pack(f"{len(ids)}q", *ids)
        except struct.error:
            return pa.array([i if type(i) is str else str(i) for i in ids], pa.string())
        return _from_buffer(pa, pa.int64(), len(ids), packed).cast(pa.string())

    def _key_column(self, keys: list[tuple[Hashable, ...]]) -> Any:
        """The keys as list<string>: each distinct key tuple of the batch rendered once."""
        pa = self._pa
        seen = dict.fromkeys(keys)  # the distinct key tuples, in order (a C-level loop)
        index = {k: i for i, k in enumerate(seen)}
        packed = struct.pack(f"{len(keys)}i", *map(index.__getitem__, keys))
        indices = _from_buffer(pa, pa.int32(), len(keys), packed)
        render = self._key
        if render is str and all(type(k) is str for key_tuple in seen for k in key_tuple):
            distinct: list[Any] = list(seen)
        else:
            distinct = [[render(k) for k in key_tuple] for key_tuple in seen]
        return pa.array(distinct, pa.list_(pa.string())).take(indices)


def _from_buffer(pa: Any, kind: Any, n: int, values: bytes) -> Any:
    """An Arrow array of `n` values of `kind` on the memory of `values` (no copy)."""
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(values)])


def _doubles(pa: Any, values: list[Any]) -> Any:
    """A float64 column: the floats packed into C doubles in one C-level loop, not converted
    one Python object at a time; null where `values` holds None (an operation still open)."""
    try:
        packed = struct.pack(f"{len(values)}d", *values)
    except struct.error:  # a None
        return pa.array(values, pa.float64())
    return _from_buffer(pa, pa.float64(), len(values), packed)


#: The outcomes a batch may hold (`purgatory.EventLog`'s, "open" at `close`, "watched" for a
#: watch record), as indices.
_OUTCOMES: Final = ("completed", "expired", "cancelled", "refused", "open", "drained", "watched")
_OUTCOME_INDEX: Final = {outcome: i for i, outcome in enumerate(_OUTCOMES)}


def _outcomes(pa: Any, values: list[str]) -> Any:
    """The outcome column: an index per value (a C-level lookup), the strings taken from them."""
    try:
        indices = bytes(map(_OUTCOME_INDEX.__getitem__, values))
    except KeyError:  # an outcome of a recorder's caller's own
        return pa.array(values, pa.string())
    return pa.array(_OUTCOMES, pa.string()).take(_from_buffer(pa, pa.int8(), len(values), indices))


def _repeated_strings(pa: Any, values: list[str]) -> Any:
    """A string column; one conversion when every value is the same (one purgatory's name)."""
    if values and values.count(values[0]) == len(values):
        return pa.repeat(pa.scalar(values[0], pa.string()), len(values))
    return pa.array(values, pa.string())


def _json_column(pa: Any, values: list[Any], render: Callable[[Any], str]) -> Any:
    """A string column of JSON texts, null where `values` holds None (all null: no work)."""
    if values.count(None) == len(values):
        return pa.nulls(len(values), pa.string())
    return pa.array([None if v is None else render(v) for v in values], pa.string())
