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

The split replay (`purgatory.pipeline._job_shards`) reads through the same code: each time
shard's task reads its purgatory's rows in its shard's arrival range (`shard_input`: the row
groups whose arrival statistics exclude it skipped too) with the same casts and checks, each
shard reporting the bad rows of its own range; its driver reads the columns it plans the shards
from once (`driver_columns`) and checks there what needs every row of a purgatory (the ids) or
rows that no shard reads (no purgatory, an arrival that is not a number).

pyarrow only: no Spark session is needed (the tests call it directly).
"""

from __future__ import annotations

import json
import math
import os
import re
import urllib.parse
from collections import Counter
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ._checks import local_path, trace_schema_problem
from ._frames import TraceError, as_given, file_cause, first_line
from ._generate import TRACE_SCHEMA
from ._tracefile import bad_rows

__all__ = (
    "BATCH_ROWS",
    "SHOWN_BAD_ROWS",
    "ShardRead",
    "TraceColumns",
    "bad_row_message",
    "direct_read_problem",
    "driver_columns",
    "duplicate_message",
    "first_duplicate",
    "in_system_pool",
    "listed_files",
    "purgatory_counts",
    "shard_input",
    "system_pool",
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


# -- Arrow's allocator -------------------------------------------------------------------------


@contextmanager
def system_pool() -> Iterator[None]:
    """Arrow's allocations in the block from the C library's allocator
    (``pa.system_memory_pool()``), the default pool back after (buffers keep the pool they came
    from, so what outlives the block is freed right).

    Why: reading a trace is a few large buffers per column and batch, and pyarrow's default
    pool (mimalloc, in its wheels) served them far slower here: a task reading the 20 M rows of
    one purgatory (`task_input`, on this 2-CPU virtual machine, nothing else running) took
    11.2-11.6 s with it against 6.7-7.4 s with the system pool (jemalloc: 6.7 s), and the
    driver's columns (`driver_columns`) 2.2-4.2 s against 1.3-1.6 s. Scoped, not set for the
    process: the driver is the user's.
    """
    before = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(before)


def in_system_pool(batches: Iterator[pa.RecordBatch]) -> Generator[pa.RecordBatch]:
    """`batches` made, and consumed between them, under `system_pool`: a task's input and the
    engine that reads it (a task's Python worker runs one task at a time)."""
    with system_pool():
        yield from batches


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
    one report per purgatory is kept. A purgatory split into time shards is reported by its
    shards (``shard``), each for the rows of its own range, under one configuration: the
    reports of its shards add up. A file that cannot be read comes first (the first by name),
    then a bad row anywhere, then a duplicate id.
    """
    rows: dict[tuple[str | None, int | None], list[dict[str, Any]]] = {}
    duplicates: dict[str, Mapping[str, Any]] = {}
    files = sorted(p["message"] for p in problems if p["kind"] == "file")
    if files:  # (as Spark's read: an unreadable file stops the validation's scan)
        return TraceError(files[0])
    for problem in problems:
        if problem["kind"] == "rows":
            rows[(problem["purgatory"], problem.get("shard"))] = problem["rows"]
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


#: Paths whose URI Hadoop writes as they are (``file://`` and the path): others are listed by Spark.
_PLAIN_PATH: Final = re.compile(r"[A-Za-z0-9/._~+-]+")
#: Parquet summary files, which Spark's listing keeps and its schema inference reads first.
_SUMMARY_FILES: Final = ("_metadata", "_common_metadata")


def listed_files(path: str) -> list[str] | None:
    """The trace's files as Spark lists them (its ``inputFiles``, sorted), found by the driver
    itself where that is certain and their schema is one Spark's read takes as it is; else
    ``None``: Spark reads the trace's schema (a Spark job) and says what is wrong with it.

    Spark's read infers the schema with a job over the first file's footer: on a cluster, the
    executors' first work (their Python workers started too), seconds before the replay's own
    job. Here: a local path (`local_path`), one Parquet file or a directory of files and no
    subdirectory (no partition columns), no Parquet summary files, names Hadoop writes as they
    are in a URI; every file's footer read, their schemas the same (metadata aside), a trace's
    (`trace_schema_problem`), and of types that Spark reads as the same kinds (strings, signed
    integers, floating point, lists of those): so the read finds the same columns that Spark's
    would, and anything else is left to Spark's read and its errors.
    """
    local = local_path(path)
    found = _listing(os.path.abspath(local)) if local is not None else None
    if not found:
        return None
    schemas = []
    for file in found:
        try:
            schemas.append(pq.read_schema(file))
        except (OSError, ValueError, pa.ArrowException):
            return None
    first = schemas[0]
    same = all(schema.equals(first, check_metadata=False) for schema in schemas)
    if not same or trace_schema_problem(first) is not None:
        return None
    if not all(_plain_type(first.field(name).type) for name in first.names):
        return None
    return [f"file://{file}" for file in found]


def _listing(top: str) -> list[str] | None:
    """The files Spark would list at `top` (an absolute path), if that is certain (see
    `listed_files`), else ``None``."""
    if not _PLAIN_PATH.fullmatch(top):
        return None
    if os.path.isfile(top):
        return [] if os.path.basename(top).startswith(("_", ".")) else [top]
    if not os.path.isdir(top):
        return None
    found = []
    for name in sorted(os.listdir(top)):
        if name in _SUMMARY_FILES:
            return None
        if name.startswith(("_", ".")):
            continue
        full = os.path.join(top, name)
        if not _PLAIN_PATH.fullmatch(name) or not os.path.isfile(full):
            return None
        found.append(full)
    return found


def _plain_type(kind: pa.DataType) -> bool:
    """A type Spark reads from Parquet as the same kind: a string, a signed integer, a float or
    a double, a list of strings or of signed integers (no unsigned, decimal or dictionary)."""
    t = pa.types
    if t.is_list(kind) or t.is_large_list(kind):
        kind = kind.value_type
        return bool(t.is_string(kind) or t.is_large_string(kind) or t.is_signed_integer(kind))
    return bool(
        t.is_string(kind)
        or t.is_large_string(kind)
        or t.is_signed_integer(kind)
        or t.is_float32(kind)
        or t.is_float64(kind)
    )


def _unreadable(uri: str, root: str, exc: BaseException) -> TraceError:
    cause = file_cause(exc) or f"unreadable Parquet ({first_line(exc)})"
    return TraceError(f"trace file {as_given(uri, root)}: {cause}")


def _parquet(uri: str, root: str, *, dictionary: bool = False) -> pq.ParquetFile:
    """The file open with every page's checksum verified; its schema a trace's. With
    `dictionary`, its ``purgatory`` column is read dictionary-encoded (a code per row)."""
    filesystem, path = _open(uri)
    try:
        source = filesystem.open_input_file(path)
        parquet = pq.ParquetFile(source, page_checksum_verification=True)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise _unreadable(uri, root, exc) from None
    problem = trace_schema_problem(parquet.schema_arrow)
    if problem is not None:
        raise TraceError(f"trace file {as_given(uri, root)}: {problem}")
    if dictionary:  # (its schema checked as stored; the footer not read again)
        parquet = pq.ParquetFile(
            source,
            metadata=parquet.metadata,
            page_checksum_verification=True,
            read_dictionary=["purgatory"],
        )
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


def _may_overlap(statistics: Any, lo: float, hi: float) -> bool:
    """Whether a row group may hold arrivals in ``[lo, hi]``, by the ``arrival`` column chunk's
    statistics. Only floating-point columns are pruned: their cast to double is exact, so the
    statistics compare as the cast rows do (an integer's may round)."""
    if statistics is None or not statistics.has_min_max:
        return True
    if statistics.physical_type not in ("FLOAT", "DOUBLE"):
        return True
    low, high = float(statistics.min), float(statistics.max)
    if math.isnan(low) or math.isnan(high):
        return True
    return high >= lo and low <= hi


def _column_index(metadata: pq.FileMetaData, name: str) -> int | None:
    return next(
        (j for j in range(metadata.num_columns) if metadata.schema.column(j).path == name), None
    )


class _Trace:
    """The trace's files as one task reads them: each file's footer read once."""

    def __init__(self, files: Sequence[str], root: str) -> None:
        self.files = list(files)
        self.root = root
        self._footers: dict[int, tuple[pq.FileMetaData, int | None, int | None]] = {}

    def _footer(self, index: int) -> tuple[pq.FileMetaData, int | None, int | None]:
        """A file's footer, and the indices of its ``purgatory`` and ``arrival`` columns."""
        if index not in self._footers:
            metadata = _parquet(self.files[index], self.root).metadata
            self._footers[index] = (
                metadata,
                _column_index(metadata, "purgatory"),
                _column_index(metadata, "arrival"),
            )
        return self._footers[index]

    def rows_of(self, name: str | None, lo: float = -math.inf, hi: float = math.inf) -> pa.Table:
        """Every row of purgatory `name` (``None``: the rows without one) arriving in ``[lo,
        hi]`` (by default: every row), cast to the trace schema's types, with the index of its
        file in `_FILE`; one chunk. Row groups whose statistics exclude the purgatory or the
        arrivals are not read."""
        bounded = lo > -math.inf or hi < math.inf
        parts = []
        for index, uri in enumerate(self.files):
            metadata, column, arrivals = self._footer(index)
            groups = [
                g
                for g in range(metadata.num_row_groups)
                if (
                    column is None
                    or _may_hold(metadata.row_group(g).column(column).statistics, name)
                )
                and (
                    not bounded
                    or arrivals is None
                    or _may_overlap(metadata.row_group(g).column(arrivals).statistics, lo, hi)
                )
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
            if bounded:
                arrival = table["arrival"]
                table = table.filter(
                    pc.and_(pc.greater_equal(arrival, lo), pc.less_equal(arrival, hi))
                )
                if not table.num_rows:
                    continue
            file = pa.array(np.full(table.num_rows, index, dtype=np.int32))
            parts.append(table.append_column(_FILE, file))
        if not parts:
            return _CAST.empty_table().append_column(_FILE, pa.array([], pa.int32()))
        return pa.concat_tables(parts).combine_chunks()

    def bad(self, rows: pa.Table, limits: Limits) -> list[dict[str, Any]]:
        """The first `SHOWN_BAD_ROWS` bad rows of `rows`, in `load_trace`'s order."""
        found = bad_rows(rows, limits)
        return [] if found is None else self.shown(found)

    def shown(self, found: pa.Table) -> list[dict[str, Any]]:
        """The first `SHOWN_BAD_ROWS` of bad rows found (`bad_rows`), in `load_trace`'s order,
        their files named."""
        if not found.num_rows:
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
        op_id = first_duplicate(rows["op_id"].to_numpy())
        if op_id is None:
            return None
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
        order = _arrival_order(rows)
        for config_id in sorted(groups[name]):
            yield from _sorted_batches(rows, order, config_id)


def _arrival_order(rows: pa.Table) -> pa.Array | None:
    """The indices of `rows` (checked: no nulls, ids unique) by arrival, then op_id (Arrow's
    C++ sort); ``None`` if they are in that order already (a trace written in time order, as
    `generate` writes it: one comparison a row instead of a sort)."""
    arrival = rows["arrival"].to_numpy()
    ids = rows["op_id"].to_numpy()
    after, before = arrival[1:], arrival[:-1]
    if bool(np.all((after > before) | ((after == before) & (ids[1:] > ids[:-1])))):
        return None
    return pc.sort_indices(rows, sort_keys=[("arrival", "ascending"), ("op_id", "ascending")])


def _sorted_batches(
    rows: pa.Table, order: pa.Array | None, config_id: int, shard: int | None = None
) -> Iterator[pa.RecordBatch]:
    """`rows` in `order` (``None``: as they are) as the engine's batches of `WORK_COLUMNS`
    under `config_id` (and a ``shard`` column after them, if given), `BATCH_ROWS` at a time:
    a batch taken at a time, not a sorted copy of the whole input (half the memory)."""
    rows = rows.select([c for c in WORK_COLUMNS if c != "config_id"])
    names = [*WORK_COLUMNS, *(["shard"] if shard is not None else [])]
    for start in range(0, rows.num_rows, BATCH_ROWS):
        if order is None:
            batch = rows.slice(start, BATCH_ROWS).combine_chunks()
        else:
            batch = rows.take(order.slice(start, BATCH_ROWS)).combine_chunks()
        columns = batch.columns
        n = batch.num_rows
        extra = [pa.array(np.full(n, shard, dtype=np.int32))] if shard is not None else []
        yield pa.RecordBatch.from_arrays(
            [
                columns[0].chunk(0),
                pa.array(np.full(n, config_id, dtype=np.int32)),
                *(c.chunk(0) for c in columns[1:]),
                *extra,
            ],
            names=names,
        )


def first_duplicate(ids: np.ndarray) -> int | None:
    """The smallest id that `ids` (no nulls) hold more than once, or ``None``. Ids already
    increasing (a trace written in order) take one comparison each; others are sorted (8 times
    faster than a hash count)."""
    if len(ids) < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return None
    ordered = np.sort(ids, kind="stable")  # (runs already in order are merged, not re-sorted)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    return int(repeated[0]) if len(repeated) else None


class ShardRead(NamedTuple):
    """One time shard's input, as its task reads it (`shard_input`).

    Attributes:
        purgatory, config_id, shard: The shard (`purgatory.pipeline._shards.Key`).
        lo, hi: Its input's arrivals, ``[lo, hi]``: its warm-up, its own range and the next
            shard's first arrival.
        start, end: Its own range, ``[start, end)`` (the last shard's takes in ``end`` too):
            the rows whose problems it reports.
        report: Whether it reports the bad rows of its own range (under one configuration of
            each purgatory only: those of the others read the same rows).
    """

    purgatory: str
    config_id: int
    shard: int
    lo: float
    hi: float
    start: float
    end: float
    report: bool


def shard_input(
    files: Sequence[str],
    root: str,
    shards: Sequence[ShardRead],
    limits: Limits,
    problems: list[dict[str, Any]],
) -> Iterator[pa.RecordBatch]:
    """One task's input for `replay_shards`, read from the trace's files: `task_input` for
    time shards.

    Each shard's rows, those of its purgatory arriving in ``[lo, hi]``, are read (only the row
    groups whose statistics may hold them), cast and checked as `task_input` reads them, sorted
    by arrival then op_id, and yielded as batches of `WORK_COLUMNS` and ``shard``, shard by
    shard in the order of (purgatory, config_id, shard).

    The checks are `task_input`'s, over every row read; a shard reports (``report``) the bad
    rows of its own range only, so that each row is reported once (its purgatory's ranges
    under one configuration cover every row whose arrival is a number: the driver has checked
    the rest, and the ids, `driver_columns`). A shard with a bad row in its input is not
    replayed, nor anything after it in the task (the job fails).
    """
    trace = _Trace(files, root)
    failed = False
    for read in sorted(shards):
        try:
            rows = trace.rows_of(read.purgatory, read.lo, read.hi)
        except TraceError as exc:
            problems.append({"kind": "file", "message": str(exc)})
            return
        found = bad_rows(rows, limits)
        if found is not None:
            failed = True
            if read.report:
                arrival = found["arrival"]
                own = pc.greater_equal(arrival, read.start)
                if read.end < math.inf:
                    own = pc.and_(own, pc.less(arrival, read.end))
                shown = trace.shown(found.filter(pc.fill_null(own, False)))
                if shown:
                    problems.append(
                        {
                            "kind": "rows",
                            "purgatory": read.purgatory,
                            "shard": read.shard,
                            "rows": shown,
                        }
                    )
        if failed:
            continue
        yield from _sorted_batches(rows, _arrival_order(rows), read.config_id, read.shard)


def encode_problems(problems: Sequence[Mapping[str, Any]]) -> str:
    """Problems as one JSON text (floats exact; NaN and infinities as JSON's extensions)."""
    return json.dumps(list(problems))


def decode_problems(text: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(text)
    return found


# -- the split replay's driver ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceColumns:
    """What the split replay's driver reads of a trace (`driver_columns`), by purgatory.

    Attributes:
        arrivals, timeouts: Each purgatory's, as float64 arrays, in the files' order.
        conditions: Its conditions (NaN: never), if they were read (else empty).
        longest: Its longest timeout.
    """

    arrivals: dict[str, np.ndarray]
    timeouts: dict[str, np.ndarray]
    conditions: dict[str, np.ndarray]
    longest: dict[str, float]

    def counts(self) -> dict[str, int]:
        """Each purgatory's operations."""
        return {name: len(values) for name, values in self.arrivals.items()}

    def for_carry(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """`purgatory.pipeline._purge_carry.carry`'s columns (with the conditions read)."""
        return {
            name: (self.arrivals[name], self.timeouts[name], self.conditions[name])
            for name in self.arrivals
        }


def driver_columns(
    files: Sequence[str], root: str, limits: Limits, *, conditions: bool
) -> TraceColumns:
    """Each purgatory's arrivals and timeouts (and with `conditions` its conditions) from the
    trace's files, for the split replay's plan, and the checks only the driver can make.

    Read once, with pyarrow (every page's checksum verified, as the tasks read), only the
    columns the plan needs and the ids. The driver checks its columns' rows as `task_input`
    checks them, but for the keys (`bad_rows` without them), and the ids' uniqueness per
    purgatory, which needs every row of a purgatory at once; the tasks check the keys (and
    everything else again) on the rows they read (`shard_input`). Should the driver find any
    problem, it reads the trace whole and checks it as the groups job's tasks do, so that the
    error is `load_trace`'s for the whole trace.

    Raises:
        TraceError: A file that cannot be read, or the trace's first problem.
    """
    with system_pool():
        return _driver_columns(files, root, limits, conditions=conditions)


def _driver_columns(
    files: Sequence[str], root: str, limits: Limits, *, conditions: bool
) -> TraceColumns:
    """`driver_columns`'s work, under `system_pool`."""
    from ._purge_carry import by_purgatory

    numbers = ["op_id", "arrival", "timeout", *(["condition_at"] if conditions else [])]
    names: dict[str, int] = {}
    codes: list[np.ndarray] = []
    read: dict[str, list[np.ndarray]] = {c: [] for c in numbers}
    unset = 0  # (conditions null: never)
    last: dict[int, int] | None = {}  # (each purgatory's last id, while they only increase)
    for uri in files:
        parquet = _parquet(uri, root, dictionary=True)
        try:
            part = parquet.read(columns=["purgatory", *numbers])
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise _unreadable(uri, root, exc) from None
        if part["purgatory"].null_count or part["op_id"].null_count:
            raise _whole_check(files, root, limits)
        for chunk in part["purgatory"].chunks:
            encoded = (
                chunk
                if pa.types.is_dictionary(chunk.type)
                else pc.dictionary_encode(chunk.cast(pa.string()))  # (a large_string column)
            )
            known = [names.setdefault(n, len(names)) for n in encoded.dictionary.to_pylist()]
            if len(known) == 1:  # (a file of one purgatory, as `generate` writes them)
                codes.append(np.full(len(encoded), known[0], np.int32))
            else:
                codes.append(np.array(known, np.int32)[encoded.indices.to_numpy()])
        for c in numbers:
            column = part[c].cast(_CAST.field(c).type, safe=False)
            unset += column.null_count if c == "condition_at" else 0
            read[c].append(column.to_numpy())
        if last is not None:
            last = _increasing(last, codes[-len(part["purgatory"].chunks) :], read["op_id"][-1])
    if not codes:
        return TraceColumns({}, {}, {}, {})
    # (Ids that only increase, file after file, are unique: not gathered, nor sorted.)
    checked = ["arrival", "timeout", *(["condition_at"] if conditions else [])]
    if last is None:
        checked.insert(0, "op_id")
    values = {c: np.concatenate(read[c]) for c in checked}
    if _suspect(values, unset, limits):
        raise _whole_check(files, root, limits)
    grouped = by_purgatory(np.concatenate(codes), list(names), [values[c] for c in checked])
    if last is None and any(first_duplicate(v[0]) is not None for v in grouped.values()):
        raise _whole_check(files, root, limits)
    first = 1 if last is None else 0
    return TraceColumns(
        arrivals={name: v[first] for name, v in grouped.items()},
        timeouts={name: v[first + 1] for name, v in grouped.items()},
        conditions={name: v[first + 2] for name, v in grouped.items()} if conditions else {},
        longest={name: float(v[first + 1].max()) for name, v in grouped.items()},
    )


def _increasing(
    last: dict[int, int], codes: Sequence[np.ndarray], ids: np.ndarray
) -> dict[int, int] | None:
    """`last` (each purgatory's last id so far) with a file's ids, if they are of one
    purgatory and follow its last id in increasing order; else ``None``: the ids must then be
    checked whole."""
    if not len(ids):
        return last
    first = codes[0][0] if len(codes[0]) else None
    if first is None or any(len(c) and (c.min() != first or c.max() != first) for c in codes):
        return None
    code = int(first)
    if int(ids[0]) <= last.get(code, int(ids[0]) - 1) or not bool(np.all(ids[1:] > ids[:-1])):
        return None
    return {**last, code: int(ids[-1])}


def _suspect(values: Mapping[str, np.ndarray], unset: int, limits: Limits) -> bool:
    """Whether the driver's columns show a row that `task_input`'s checks refuse (arrays, a
    pass or two each, where `bad_rows` over Arrow takes five times as long): an arrival or a
    timeout null or not finite, a negative timeout or one beyond a horizon, a condition not
    finite but null (`unset` of them) or before its arrival."""
    arrival, timeout = values["arrival"], values["timeout"]
    if not len(arrival):
        return False
    # (Extremes, not a mask per row: a NaN or an infinity shows in them, and scaling by a
    # positive factor keeps the order, so the longest timeout is beyond a horizon if any is.)
    extremes = [float(arrival.min()), float(arrival.max()), float(timeout.min())]
    longest = float(timeout.max())
    if not all(math.isfinite(x) for x in [*extremes, longest]) or extremes[2] < 0:
        return True
    beyond = any(longest * scale > limit for scale, limit, _ in limits)
    condition = values.get("condition_at")
    if beyond or condition is None:
        return beyond
    if np.count_nonzero(np.isnan(condition)) != unset:  # (a NaN stored, not a null)
        return True
    infinite = unset < len(condition) and not (
        math.isfinite(float(np.nanmin(condition))) and math.isfinite(float(np.nanmax(condition)))
    )
    with np.errstate(invalid="ignore"):
        return infinite or bool((condition < arrival).any())


def _whole_check(files: Sequence[str], root: str, limits: Limits) -> TraceError:
    """The trace's error, from checking every purgatory's rows as the groups job's tasks do."""
    names = purgatory_counts(files, root)
    problems: list[dict[str, Any]] = []
    for _ in task_input(files, root, dict.fromkeys(names, ()), limits, problems):
        pass  # (no configuration: only checked)
    error = trace_problem(problems, root)
    if error is None:  # (the driver's checks are the same: unreachable)
        raise AssertionError("the driver found a problem in the trace that its tasks do not")
    return error
