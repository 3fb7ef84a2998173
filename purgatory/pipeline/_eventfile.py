"""One event-log file (JSON Lines or an Arrow stream) as Arrow record batches of operations.

This is what the ``purgatory-events`` data source runs in a Spark task, once per file: the
file is read whole, every record checked, and a bad one stops the read with one line naming the
file and the line (JSON Lines) or row (Arrow). Each operation comes out with its file's UTC
anchor applied: ``utc_offset`` (seconds to add to its clock times) and its times as UTC
timestamps, null for a file without an anchor. A file's first anchor also covers what was
watched before it; after that, the anchor in force at a watch is the latest at or before it.

Pure Python and pyarrow (no Spark): the tests call it directly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final

import numpy as np
import pyarrow as pa

from .._eventlog_arrow import arrow_schema
from ._frames import TraceError, first_line

__all__ = (
    "ANCHOR_SCHEMA",
    "ARROW_VERSION_KEY",
    "EVENTS_SCHEMA",
    "LOG_VERSIONS",
    "NOT_ENDED",
    "OUTCOMES",
    "anchor_batches",
    "event_batches",
    "line_problem",
)

#: The event-log schema versions read (docs/pipeline-schemas.md); a line of any other version is
#: refused rather than read by the wrong rules.
LOG_VERSIONS: Final = (1, 2)
#: The schema-metadata key of an Arrow event-log stream holding its version (Arrow streams exist
#: from version 2 on).
ARROW_VERSION_KEY: Final = b"purgatory.event_log"
#: The outcomes an operation's record may have. ``drained``: answered by the purgatory's
#: ``drain()`` (recorders that know it); ``open``: still pending when the recorder closed;
#: ``watched``: a watch record (``watch_records=True``), written as the operation was watched,
#: its end record following (read only when asked: `event_batches`' ``watches``).
OUTCOMES: Final = ("completed", "expired", "cancelled", "drained", "refused", "open", "watched")
#: The outcomes of a record that is not an operation's end.
NOT_ENDED: Final = ("open", "watched")

_UTC: Final = pa.timestamp("us", tz="UTC")
#: One row per operation: the record's version, its fields as the recorders write them
#: (`purgatory.ArrowEventLog`'s columns but its anchor; ``thresholds`` and ``fields`` as JSON
#: text), the UTC offset of its file's anchor in force at its watch, its times in UTC, and its
#: file.
EVENTS_SCHEMA: Final = pa.schema(
    [
        ("v", pa.int32()),
        *(column for column in arrow_schema() if column.name != "anchor"),
        ("utc_offset", pa.float64()),
        ("watched_utc", _UTC),
        ("deadline_utc", _UTC),
        ("ended_utc", _UTC),
        ("file", pa.string()),
    ]
)
#: The anchors of the files (option ``anchors``): one row per distinct anchor of a file.
ANCHOR_SCHEMA: Final = pa.schema(
    [("file", pa.string()), ("clock", pa.float64()), ("utc", pa.float64())]
)

#: The record's own columns, as the two formats hold them.
_RECORD: Final = EVENTS_SCHEMA.names[:11]
_ROWS_PER_BATCH: Final = 8192


@dataclass(slots=True)
class _Columns:
    """The operations read so far, as Python columns (flushed to Arrow every batch)."""

    values: dict[str, list[Any]] = field(default_factory=lambda: {n: [] for n in _RECORD})

    def __len__(self) -> int:
        return len(self.values["purgatory"])

    def add(self, record: Sequence[Any]) -> None:
        for name, value in zip(_RECORD, record, strict=True):
            self.values[name].append(value)

    def take(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays(
            [pa.array(self.values[n], EVENTS_SCHEMA.field(n).type) for n in _RECORD],
            names=list(_RECORD),
        )
        self.values = {n: [] for n in _RECORD}
        return batch


# -- JSON Lines -----------------------------------------------------------------------------


def _jsonl_records(
    name: str, lines: Iterable[bytes], partial: bool, anchors: dict[tuple[float, float], None]
) -> Iterator[pa.RecordBatch]:
    """The operations of a JSON Lines file in batches of its own columns; its anchors into
    `anchors`. `partial`: a ``.part`` file, whose last line may be cut (dropped, not refused)."""
    columns = _Columns()
    pending: tuple[int, bytes] | None = None
    for number, raw in enumerate(lines, 1):
        if pending is not None:
            _jsonl_line(name, *pending, columns, anchors)
        pending = (number, raw)
        if len(columns) >= _ROWS_PER_BATCH:
            yield columns.take()
    if pending is not None and not (partial and not pending[1].endswith(b"\n")):
        _jsonl_line(name, *pending, columns, anchors)
    if len(columns):
        yield columns.take()


def _jsonl_line(
    name: str,
    number: int,
    raw: bytes,
    columns: _Columns,
    anchors: dict[tuple[float, float], None],
) -> None:
    """Check one line and add its operation to `columns` (or its anchor to `anchors`)."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    if not text.strip():
        return  # a blank line holds no record (Spark's JSON reader skips it too)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    problem = line_problem(text) if not isinstance(data, dict) else _field_problem(data)
    if problem is not None:
        raise TraceError(f"event log file {name}: line {number}: {problem}")
    record = _record_problem(data)
    if isinstance(record, str):
        what = _with_ids(record, data.get("purgatory"), data.get("id"))
        raise TraceError(f"event log file {name}: line {number}: {what}")
    if record is None:
        anchor = data["anchor"]
        anchors[float(anchor["clock"]), float(anchor["utc"])] = None
        return
    columns.add(
        (
            data["v"],
            _text(data["purgatory"]),
            _text(data["id"]),
            None if data.get("keys") is None else [_text(k) for k in data["keys"]],
            _json_text(data.get("thresholds")),
            _double(data["watched_at"]),
            _double(data.get("timeout")),
            _double(data["deadline"]),
            data["outcome"],
            _double(data.get("ended_at")),
            _json_text(data.get("fields")),
        )
    )


def _record_problem(data: dict[str, Any]) -> str | bool | None:
    """What is wrong with a decoded record (a message); ``None`` for a good anchor, ``True``
    for a good operation."""
    versions = " or ".join(str(v) for v in LOG_VERSIONS)
    if data.get("v") not in LOG_VERSIONS:
        return f"field 'v' is not {versions} (schema version)"
    anchor = data.get("anchor")
    if anchor is not None:
        if anchor.get("clock") is None or anchor.get("utc") is None:
            return "anchor without 'clock' and 'utc'"
        return None
    for name in ("purgatory", "id", "watched_at", "deadline"):
        if data.get(name) is None:
            return f"field {name!r} is missing"
    return _outcome_problem(data.get("outcome"), data.get("ended_at") is None) or True


def _outcome_problem(outcome: Any, no_end: bool) -> str | None:
    if outcome not in OUTCOMES:
        return (
            f"field 'outcome' is not a known outcome ({outcome!r:.40}; known: "
            f"{', '.join(OUTCOMES)})"
        )
    if outcome not in NOT_ENDED and no_end:
        return "field 'ended_at' is missing"
    return None


def _with_ids(problem: str, purgatory: Any, ident: Any) -> str:
    if purgatory is None and ident is None:
        return problem
    shown = None if ident is None else _text(ident)
    return f"{problem} (purgatory={_text(purgatory)!r}, id={shown!r})"


def line_problem(text: str) -> str:
    """What makes an event-log line unreadable: not JSON, not an object, or a field of a type
    its column cannot hold (said in one phrase)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg}, column {exc.colno})"
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(data, dict):
        return f"not a JSON object (a JSON {type(data).__name__})"
    return _field_problem(data) or "a field of a type its column cannot hold"


def _field_problem(data: dict[str, Any]) -> str | None:
    """The first field of a decoded line that its column cannot hold."""
    version = data.get("v")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        return f"field 'v' is not an integer ({version!r:.40})"
    for name in ("watched_at", "timeout", "deadline", "ended_at"):
        if not _number(data.get(name)):
            return f"field {name!r} is not a number ({data[name]!r:.40})"
    keys = data.get("keys")
    if keys is not None and not isinstance(keys, list):
        return f"field 'keys' is not a list ({keys!r:.40})"
    anchor = data.get("anchor")
    if anchor is not None and not (
        isinstance(anchor, dict) and _number(anchor.get("clock")) and _number(anchor.get("utc"))
    ):
        return f"field 'anchor' is not an object of two numbers ({anchor!r:.60})"
    return None


_NON_FINITE: Final = frozenset({"NaN", "Infinity", "INF"})


def _number(value: object) -> bool:
    """Whether `value` reads as a double: a number, null, or a non-finite one's name (the way
    the recorders write numbers JSON cannot hold)."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return True
    return isinstance(value, str) and value.lstrip("+-") in _NON_FINITE


def _double(value: Any) -> float | None:
    return None if value is None else float(value)


def _text(value: Any) -> str | None:
    """A JSON value in a string column: a string as it is, anything else as its JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _json_text(value: Any) -> str | None:
    """A JSON value kept as JSON text (``thresholds``, ``fields``), as the Arrow recorder
    writes it; null stays null."""
    return None if value is None else json.dumps(value, separators=(",", ":"))


# -- Arrow streams --------------------------------------------------------------------------


def _arrow_records(
    name: str, source: IO[bytes], partial: bool, anchors: dict[tuple[float, float], None]
) -> Iterator[pa.RecordBatch]:
    """The operations of an Arrow event-log stream, batch by batch; its anchors into
    `anchors`. `partial`: a ``.part`` stream, read up to its first batch that is not whole."""
    try:
        reader = pa.ipc.open_stream(source)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise TraceError(
            f"event log file {name}: unreadable Arrow stream ({first_line(exc)})"
        ) from None
    metadata = reader.schema.metadata or {}
    found = metadata.get(ARROW_VERSION_KEY, b"").decode(errors="replace")
    if not found.isdigit() or int(found) not in LOG_VERSIONS[1:]:
        raise TraceError(
            f"event log file {name}: not an event-log Arrow stream of a known schema version "
            f"(its {ARROW_VERSION_KEY.decode()} is {found or 'missing'!r})"
        )
    version = int(found)
    names = set(reader.schema.names)
    missing = [
        n for n in ("purgatory", "id", "watched_at", "deadline", "outcome") if n not in names
    ]
    if missing:
        raise TraceError(
            f"event log file {name}: not an event-log Arrow stream (no column {missing[0]!r})"
        )
    row = 0
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except (OSError, ValueError, pa.ArrowException) as exc:
            if partial:
                return  # the batch being written when the recorder stopped
            raise TraceError(
                f"event log file {name}: unreadable Arrow stream ({first_line(exc)})"
            ) from None
        if batch.num_rows:
            yield _arrow_batch(name, batch, version, row, anchors)
        row += batch.num_rows


def _arrow_batch(
    name: str,
    batch: pa.RecordBatch,
    version: int,
    row: int,
    anchors: dict[tuple[float, float], None],
) -> pa.RecordBatch:
    """One Arrow record batch of a stream as the record's columns, checked."""
    n = batch.num_rows
    if "anchor" in batch.schema.names:
        anchor = batch.column("anchor")[0].as_py()
        if anchor is not None and anchor.get("clock") is not None and anchor.get("utc") is not None:
            anchors[float(anchor["clock"]), float(anchor["utc"])] = None
    arrays: list[pa.Array] = []
    for column in _RECORD:
        kind = EVENTS_SCHEMA.field(column).type
        if column == "v":
            arrays.append(pa.repeat(pa.scalar(version, kind), n))
        elif column in batch.schema.names:
            try:
                arrays.append(batch.column(column).cast(kind))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise TraceError(
                    f"event log file {name}: column {column!r} is not {kind} ({first_line(exc)})"
                ) from None
        else:
            arrays.append(pa.nulls(n, kind))
    records = pa.RecordBatch.from_arrays(arrays, names=list(_RECORD))
    _check_arrow(name, records, row)
    return records


def _check_arrow(name: str, records: pa.RecordBatch, row: int) -> None:
    """Refuse the first record of a batch missing what its outcome requires."""
    import pyarrow.compute as pc

    bad = pc.is_null(records.column("outcome"))
    for column in ("purgatory", "id", "watched_at", "deadline"):
        bad = pc.or_(bad, pc.is_null(records.column(column)))
    known = pc.is_in(records.column("outcome"), value_set=pa.array(OUTCOMES))
    ended = pc.or_(
        pc.is_in(records.column("outcome"), value_set=pa.array(NOT_ENDED)),
        pc.is_valid(records.column("ended_at")),
    )
    bad = pc.or_(bad, pc.invert(pc.and_(known, ended)))
    if not pc.any(bad).as_py():
        return
    index = pc.index(bad, True).as_py()
    values = {column: records.column(column)[index].as_py() for column in records.schema.names}
    problem = next(
        (
            f"field {column!r} is missing"
            for column in ("purgatory", "id", "watched_at", "deadline")
            if values[column] is None
        ),
        None,
    ) or _outcome_problem(values["outcome"], values["ended_at"] is None)
    assert problem is not None
    raise TraceError(
        f"event log file {name}: row {row + index + 1}: "
        f"{_with_ids(problem, values['purgatory'], values['id'])}"
    )


# -- both -----------------------------------------------------------------------------------


def _records(
    name: str, source: IO[bytes], partial: bool, anchors: dict[tuple[float, float], None]
) -> Iterator[pa.RecordBatch]:
    stem = name.removesuffix(".part")
    if stem.endswith(".arrows"):
        return _arrow_records(name, source, partial, anchors)
    return _jsonl_records(name, _lines(source), partial, anchors)


def _lines(source: IO[bytes], chunk: int = 1 << 20) -> Iterator[bytes]:
    """The lines of `source`, each with its newline (the last one perhaps without), read a
    chunk at a time (pyarrow's input streams have no ``readline``)."""
    rest = b""
    while True:
        data = source.read(chunk)
        if not data:
            break
        lines = (rest + data).split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield line + b"\n"
    if rest:
        yield rest


def event_batches(
    name: str,
    source: IO[bytes],
    *,
    partial: bool = False,
    require_utc: bool = False,
    watches: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The operations of one event-log file as batches of `EVENTS_SCHEMA`.

    Args:
        name: The file as the user knows it (errors and the ``file`` column show it); a name
            ending in ``.arrows`` (or ``.arrows.part``) is an Arrow stream, else JSON Lines.
        source: The file's bytes, read once from the start.
        partial: A ``.part`` file still being written (or left by a killed process): a cut last
            line or batch is dropped instead of refused.
        require_utc: Refuse a file with operations and no anchor (its times have no UTC).
        watches: Keep the watch records (outcome ``watched``); without it they are checked and
            dropped, so every count of operations sees one record per operation, as before.

    Raises:
        TraceError: A bad record (file and line or row named), a stream that is not an event
            log, or (with `require_utc`) a file without an anchor.
    """
    anchors: dict[tuple[float, float], None] = {}
    # Anchors may follow the operations they cover (an Arrow stream's first batch): the file
    # is read whole before any offset is known.
    batches = list(_records(name, source, partial, anchors))
    if not batches:
        return
    if not anchors and require_utc:
        raise TraceError(
            f"event log file {name}: no UTC anchor (schema version 1, or recorded without a "
            "wall clock), so its operations cannot be placed in UTC"
        )
    clocks, offsets = _spans(anchors)
    for records in batches:
        if not watches:
            import pyarrow.compute as pc

            records = records.filter(pc.not_equal(records.column("outcome"), "watched"))  # noqa: PLW2901
            if not records.num_rows:
                continue
        yield _with_utc(records, name, clocks, offsets)


def anchor_batches(
    name: str, source: IO[bytes], *, partial: bool = False
) -> Iterator[pa.RecordBatch]:
    """The distinct anchors of one event-log file, as batches of `ANCHOR_SCHEMA` (the file is
    checked whole as by `event_batches`)."""
    anchors: dict[tuple[float, float], None] = {}
    for _ in _records(name, source, partial, anchors):
        pass
    if anchors:
        clocks, utcs = zip(*anchors, strict=True)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([name] * len(clocks)),
                pa.array(clocks, pa.float64()),
                pa.array(utcs, pa.float64()),
            ],
            schema=ANCHOR_SCHEMA,
        )


def _spans(anchors: dict[tuple[float, float], None]) -> tuple[np.ndarray, np.ndarray]:
    """The anchors' clock times in order and each one's offset (utc - clock)."""
    ordered = sorted(anchors)
    clocks = np.array([c for c, _ in ordered], dtype=np.float64)
    offsets = np.array([u - c for c, u in ordered], dtype=np.float64)
    return clocks, offsets


def _with_utc(
    batch: pa.RecordBatch, name: str, clocks: np.ndarray, offsets: np.ndarray
) -> pa.RecordBatch:
    """`batch` with ``utc_offset``, the three UTC times and ``file`` (`EVENTS_SCHEMA`)."""
    n = batch.num_rows
    watched = batch.column("watched_at").to_numpy(zero_copy_only=False)
    if len(clocks):
        # The latest anchor at or before the watch; the first one for what came before it.
        index = np.searchsorted(clocks, watched, side="right") - 1
        offset = offsets[np.clip(index, 0, None)]
        # (No anchor covers a watch at NaN or +inf: the offset is null, as a span's end is.)
        offset = np.where(np.isnan(watched) | (watched == np.inf), np.nan, offset)
        offset_array = pa.array(offset, pa.float64(), from_pandas=True)
    else:
        offset = np.full(n, np.nan)
        offset_array = pa.nulls(n, pa.float64())
    times = [
        _utc(batch.column(column).to_numpy(zero_copy_only=False), offset)
        for column in ("watched_at", "deadline", "ended_at")
    ]
    return pa.RecordBatch.from_arrays(
        [*batch.columns, offset_array, *times, pa.repeat(pa.scalar(name), n)],
        schema=EVENTS_SCHEMA,
    )


def _utc(clock: np.ndarray, offset: np.ndarray) -> pa.Array:
    """Clock times plus their offsets as UTC timestamps (null where either is missing or the
    time is not finite)."""
    with np.errstate(invalid="ignore", over="ignore"):
        micros = np.round((clock.astype(np.float64) + offset) * 1e6)
        valid = np.isfinite(micros) & (np.abs(micros) < 2**62)
    values = np.where(valid, micros, 0).astype(np.int64)
    return pa.array(values, pa.int64(), mask=~valid).cast(_UTC)
