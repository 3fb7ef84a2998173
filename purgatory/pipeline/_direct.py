"""A replay task's rows, read straight from the trace's Parquet files: no JVM in the data path.

The groups job used to hand every row of the trace to the JVM: read and checked there
(`load_trace`'s scans), joined with the plan, shuffled, sorted and turned into Arrow batches for
the Python workers. That serial JVM work took more CPU than the replay itself and capped what
more cores could gain. Here the driver reads only the ``purgatory`` column (`purgatory_counts`,
to balance the groups over the tasks), and each task reads its own purgatories' rows with pyarrow
(`task_input`): only the row groups whose statistics may hold the purgatory, every page's
checksum verified, cast to the trace schema's types, checked as `load_trace` checks them, sorted
by arrival then op_id in Arrow's C++ and cut into batches for `replay_batches`. One purgatory is
in memory at a time, read once for all of its configurations in the task.

What the checks find is not raised in the task, where only the task's own rows are known: each
purgatory's first bad rows (at most `SHOWN_BAD_ROWS`, in `load_trace`'s order) or its smallest
duplicate id go back to the driver as problems (JSON), and `trace_problem` merges them over every
task into the one error `load_trace` raises for the whole trace: the same row named, the same
count of more. Ids need to be unique only within their purgatory, and a task reads all of a
purgatory's rows, so the check per task is exact. A task that has found a problem replays nothing
more (it still checks the rest of its input). A file pyarrow cannot read ends the task's input,
reported the same way with one line naming it, as Spark's read does.

pyarrow only: no Spark session is needed (the tests call it directly).
"""

from __future__ import annotations

import json
import urllib.parse
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ._checks import trace_schema_problem
from ._frames import TraceError, as_given, file_cause, first_line
from ._generate import TRACE_SCHEMA
from ._tracefile import bad_rows

__all__ = (
    "BATCH_ROWS",
    "SHOWN_BAD_ROWS",
    "bad_row_message",
    "direct_read_problem",
    "duplicate_message",
    "purgatory_counts",
    "task_input",
    "trace_problem",
)

#: How many bad rows `load_trace` looks at (its message says "N+ more" of them).
SHOWN_BAD_ROWS: Final = 5
#: Rows per batch handed to the engine: Spark's Arrow batches (``maxRecordsPerBatch``).
BATCH_ROWS: Final = 10_000
#: The columns the engine reads, in the order the Spark read handed them over.
WORK_COLUMNS: Final = (
    "purgatory",
    "config_id",
    "op_id",
    "arrival",
    "keys",
    "timeout",
    "condition_at",
)

_CAST: Final = pa.schema([pa.field(f.name, f.type) for f in TRACE_SCHEMA])
_FILE: Final = "_file"

Limits = Sequence[tuple[float, float, str]]


# -- messages: the same words on both read paths -----------------------------------------------


def bad_row_message(first: Mapping[str, Any], more: int, root: str) -> str:
    """`load_trace`'s error for the first bad row (keys ``_file``, ``purgatory``, ``op_id``,
    ``_problem``, ``arrival``, ``timeout``, ``condition_at``), `more` bad rows after it seen."""
    return (
        f"trace file {as_given(first[_FILE], root)}: row purgatory={first['purgatory']!r} "
        f"op_id={first['op_id']!r}: {first['_problem']} (arrival={first['arrival']!r}, "
        f"timeout={first['timeout']!r}, condition_at={first['condition_at']!r})"
        + (f"; {more}+ more bad rows" if more else "")
    )


def duplicate_message(
    purgatory: str, op_id: int, rows: int, files: Sequence[str], root: str
) -> str:
    """`load_trace`'s error for a duplicate id: `rows` rows in `files` (as Spark names them)."""
    named = sorted({as_given(file, root) for file in files})
    return (
        f"trace file {', '.join(named)}: duplicate op_id {op_id!r} in purgatory {purgatory!r} "
        f"({rows} rows; an operation id must be unique within its purgatory)"
    )


def _bad_row_order(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """`load_trace`'s order of bad rows: purgatory, op_id (nulls first, as Spark sorts), file."""
    name, op_id = row["purgatory"], row["op_id"]
    return (name is not None, name or "", op_id is not None, op_id or 0, row[_FILE])


def trace_problem(problems: Sequence[Mapping[str, Any]], root: str) -> TraceError | None:
    """The error `load_trace` raises for the whole trace, from what the tasks found, or ``None``.

    Each purgatory read by several tasks (one per configuration) is reported by each, the same:
    one report per purgatory is kept. A file that cannot be read comes first (the first by
    name), then a bad row anywhere, then a duplicate id.
    """
    rows: dict[str | None, list[dict[str, Any]]] = {}
    duplicates: dict[str, Mapping[str, Any]] = {}
    files = sorted(p["message"] for p in problems if p["kind"] == "file")
    if files:  # (as Spark's read: an unreadable file stops the validation's scan)
        return TraceError(files[0])
    for problem in problems:
        if problem["kind"] == "rows":
            rows[problem["purgatory"]] = problem["rows"]
        else:
            duplicates[problem["purgatory"]] = problem
    if rows:
        bad = sorted((row for found in rows.values() for row in found), key=_bad_row_order)
        shown = bad[:SHOWN_BAD_ROWS]
        return TraceError(bad_row_message(shown[0], len(shown) - 1, root))
    if duplicates:
        first = min(duplicates.values(), key=lambda d: (d["purgatory"], d["op_id"]))
        return TraceError(
            duplicate_message(
                first["purgatory"], first["op_id"], first["rows"], first["files"], root
            )
        )
    return None


# -- files ------------------------------------------------------------------------------------


def _open(uri: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem and path for a file as Spark names it (``file:/...`` or a URI).

    Raises:
        ValueError: pyarrow has no filesystem for it (``s3a://``, ``hdfs://`` without libhdfs).
    """
    if uri.startswith("file:"):
        path = uri[len("file:") :]
        if path.startswith("//"):  # file:///abs (file://host/abs is not a local file)
            host, _, rest = path[2:].partition("/")
            if host not in ("", "localhost"):
                raise ValueError(f"a file on another host ({host})")
            path = "/" + rest
        return pafs.LocalFileSystem(), urllib.parse.unquote(path)
    if "://" not in uri:
        return pafs.LocalFileSystem(), uri
    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ValueError(first_line(exc)) from None
    return filesystem, str(path)


def direct_read_problem(files: Sequence[str]) -> str | None:
    """Why the tasks cannot read `files` (Spark's names) themselves, or ``None`` if they can.

    pyarrow needs a filesystem for each file's scheme (asked once per scheme and host: a
    filesystem is created, no file opened), and the files must hold the trace's columns
    themselves: a column that Spark reads from the directories' names (``purgatory=p0/``, as
    ``partitionBy`` writes it) is not in them (the first file's footer says).
    """
    seen: set[tuple[str, str]] = set()
    for uri in files:
        parts = urllib.parse.urlsplit(uri)
        if (parts.scheme, parts.netloc) in seen:
            continue
        seen.add((parts.scheme, parts.netloc))
        try:
            _open(uri)
        except ValueError as exc:
            return f"pyarrow cannot open {uri}: {exc}"
    if files:
        try:
            filesystem, path = _open(files[0])
            names = set(pq.read_schema(filesystem.open_input_file(path)).names)
        except (OSError, ValueError, pa.ArrowException):
            return None  # (the read names the file and what is wrong with it)
        missing = [name for name in _CAST.names if name not in names]
        if missing:
            return (
                f"{files[0]} holds no column {missing[0]!r} (Spark reads it from the "
                "directories' names)"
            )
    return None


def _unreadable(uri: str, root: str, exc: BaseException) -> TraceError:
    cause = file_cause(exc) or f"unreadable Parquet ({first_line(exc)})"
    return TraceError(f"trace file {as_given(uri, root)}: {cause}")


def _parquet(uri: str, root: str) -> pq.ParquetFile:
    """The file open with every page's checksum verified; its schema a trace's."""
    filesystem, path = _open(uri)
    try:
        parquet = pq.ParquetFile(filesystem.open_input_file(path), page_checksum_verification=True)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise _unreadable(uri, root, exc) from None
    problem = trace_schema_problem(parquet.schema_arrow)
    if problem is not None:
        raise TraceError(f"trace file {as_given(uri, root)}: {problem}")
    return parquet


def purgatory_counts(files: Sequence[str], root: str) -> dict[str | None, int]:
    """Rows per purgatory over `files` (``None``: rows without one), from that column alone."""
    counts: Counter[str | None] = Counter()
    for uri in files:
        parquet = _parquet(uri, root)
        try:
            column = parquet.read(columns=["purgatory"], use_threads=False)["purgatory"]
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise _unreadable(uri, root, exc) from None
        found = pc.value_counts(column)
        names = found.field("values")
        if pa.types.is_dictionary(names.type):
            names = names.cast(names.type.value_type)
        for name, n in zip(names.to_pylist(), found.field("counts").to_pylist(), strict=True):
            counts[name] += n
    return dict(counts)


def _may_hold(statistics: Any, name: str | None) -> bool:
    """Whether a row group may hold rows of purgatory `name` (``None``: null), by the column
    chunk's statistics; without usable statistics, it may."""
    if statistics is None:
        return True
    if name is None:
        return not statistics.has_null_count or statistics.null_count > 0
    if not statistics.has_min_max:
        return True
    try:
        low, high = statistics.min, statistics.max
    except (UnicodeDecodeError, ValueError, pa.ArrowException):
        return True
    key: Any = name.encode("utf-8", "surrogatepass") if isinstance(low, bytes) else name
    return bool(low <= key <= high)


class _Trace:
    """The trace's files as one task reads them: each file's footer read once."""

    def __init__(self, files: Sequence[str], root: str) -> None:
        self.files = list(files)
        self.root = root
        self._footers: dict[int, tuple[pq.FileMetaData, int | None]] = {}

    def _footer(self, index: int) -> tuple[pq.FileMetaData, int | None]:
        if index not in self._footers:
            parquet = _parquet(self.files[index], self.root)
            metadata = parquet.metadata
            column = next(
                (
                    j
                    for j in range(metadata.num_columns)
                    if metadata.schema.column(j).path == "purgatory"
                ),
                None,
            )
            self._footers[index] = (metadata, column)
        return self._footers[index]

    def rows_of(self, name: str | None) -> pa.Table:
        """Every row of purgatory `name` (``None``: the rows without one), cast to the trace
        schema's types, with the index of its file in `_FILE`; one chunk."""
        parts = []
        for index, uri in enumerate(self.files):
            metadata, column = self._footer(index)
            groups = [
                g
                for g in range(metadata.num_row_groups)
                if column is None
                or _may_hold(metadata.row_group(g).column(column).statistics, name)
            ]
            if not groups:
                continue
            filesystem, path = _open(uri)
            try:
                parquet = pq.ParquetFile(
                    filesystem.open_input_file(path),
                    metadata=metadata,
                    page_checksum_verification=True,
                )
                table = parquet.read_row_groups(groups, columns=_CAST.names, use_threads=False)
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise _unreadable(uri, self.root, exc) from None
            mine = (
                pc.is_null(table["purgatory"])
                if name is None
                else pc.equal(table["purgatory"], name)
            )
            table = table.filter(mine)
            if not table.num_rows:
                continue
            table = table.select(_CAST.names).cast(_CAST, safe=False)
            file = pa.array(np.full(table.num_rows, index, dtype=np.int32))
            parts.append(table.append_column(_FILE, file))
        if not parts:
            return _CAST.empty_table().append_column(_FILE, pa.array([], pa.int32()))
        return pa.concat_tables(parts).combine_chunks()

    def bad(self, rows: pa.Table, limits: Limits) -> list[dict[str, Any]]:
        """The first `SHOWN_BAD_ROWS` bad rows of `rows`, in `load_trace`'s order."""
        found = bad_rows(rows, limits)
        if found is None:
            return []
        named = pc.take(pa.array(self.files, pa.string()), found[_FILE])
        found = found.set_column(found.schema.get_field_index(_FILE), _FILE, named)
        found = found.append_column("_named", pc.is_valid(found["purgatory"]))
        found = found.append_column("_numbered", pc.is_valid(found["op_id"]))
        order = [
            ("_named", "ascending"),
            ("purgatory", "ascending"),
            ("_numbered", "ascending"),
            ("op_id", "ascending"),
            (_FILE, "ascending"),
        ]
        shown = found.sort_by(order).slice(0, SHOWN_BAD_ROWS)
        keep = ["purgatory", "op_id", _FILE, "_problem", "arrival", "timeout", "condition_at"]
        return list(shown.select(keep).to_pylist())

    def duplicate(self, name: str, rows: pa.Table) -> dict[str, Any] | None:
        """The smallest op_id that `rows` (one purgatory's, no null id) hold more than once."""
        ids = np.sort(rows["op_id"].to_numpy())  # (sorted: 8 times faster than a hash count)
        repeated = ids[1:][ids[1:] == ids[:-1]]
        if not len(repeated):
            return None
        op_id = int(repeated[0])
        mine = rows.filter(pc.equal(rows["op_id"], op_id))
        files = sorted({self.files[i] for i in mine[_FILE].to_pylist()})
        return {
            "kind": "duplicate",
            "purgatory": name,
            "op_id": op_id,
            "rows": mine.num_rows,
            "files": files,
        }


def task_input(
    files: Sequence[str],
    root: str,
    groups: Mapping[str | None, Sequence[int]],
    limits: Limits,
    problems: list[dict[str, Any]],
) -> Iterator[pa.RecordBatch]:
    """One task's input for `replay_batches`, read from the trace's files.

        Args:
            files: The trace's files as Spark lists them (its ``inputFiles``).
            root: The trace's path as the user gave it (errors name files under it).
            groups: The task's purgatories, each with its configurations (ids); ``None``: the rows
                without a purgatory, only checked (they are all bad).
            limits: The timer's horizons of the replay's configurations (`horizon_limits`).
            problems: Receives what the checks find (JSON-ready dicts, for `trace_problem`).

        Yields:
            Batches of `WORK_COLUMNS`, by purgatory then configuration (as Spark sorted them),
            each group's rows by arrival then op_id.

    A file that pyarrow cannot read (a page failing its checksum, a truncated file) is a
        problem too (its one line, naming the file as Spark's read does), and ends the task's
        input: a task that fails would have Spark kill the others' Python workers mid-batch (each
        printing a traceback) and, on a cluster, retry it.
    """
    trace = _Trace(files, root)
    for name in sorted(groups, key=lambda n: (n is not None, n or "")):
        try:
            rows = trace.rows_of(name)
        except TraceError as exc:
            problems.append({"kind": "file", "message": str(exc)})
            return
        bad = trace.bad(rows, limits)
        if bad:
            problems.append({"kind": "rows", "purgatory": name, "rows": bad})
            continue
        if name is None:
            continue
        duplicate = trace.duplicate(name, rows)
        if duplicate is not None:
            problems.append(duplicate)
            continue
        if problems or not groups[name]:
            continue  # the job fails: check the rest, replay nothing more
        order = pc.sort_indices(rows, sort_keys=[("arrival", "ascending"), ("op_id", "ascending")])
        rows = rows.select([c for c in WORK_COLUMNS if c != "config_id"])
        for config_id in sorted(groups[name]):
            # A batch at a time (not a sorted copy of the whole purgatory: half the memory).
            for start in range(0, len(order), BATCH_ROWS):
                batch = rows.take(order.slice(start, BATCH_ROWS)).combine_chunks()
                columns = batch.columns
                config = pa.array(np.full(batch.num_rows, config_id, dtype=np.int32))
                yield pa.RecordBatch.from_arrays(
                    [columns[0].chunk(0), config, *(c.chunk(0) for c in columns[1:])],
                    names=list(WORK_COLUMNS),
                )


def encode_problems(problems: Sequence[Mapping[str, Any]]) -> str:
    """Problems as one JSON text (floats exact; NaN and infinities as JSON's extensions)."""
    return json.dumps(list(problems))


def decode_problems(text: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(text)
    return found
