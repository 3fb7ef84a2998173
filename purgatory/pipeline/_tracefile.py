"""One trace file (Parquet, trace schema version 1) as checked Arrow record batches.

What the ``purgatory-trace`` data source runs in a Spark task, once per file: the schema is
checked (the columns, no more, no fewer, of usable types), every page read with its checksum
verified, the columns cast to `TRACE_SCHEMA` (numbers of any width to double, integers to long,
integer keys to strings) and every row checked as `load_trace` checks it. A bad file or row
stops the read with one line naming the file (and the row). What needs every file at once (an
operation id unique within its purgatory) is left to `load_trace`.

Pure pyarrow (no Spark): the tests call it directly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import IO, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._checks import trace_schema_problem
from ._frames import TraceError, file_cause, first_line
from ._generate import TRACE_SCHEMA

__all__ = ("bad_rows", "trace_batches")

_CAST: Final = pa.schema([pa.field(f.name, f.type) for f in TRACE_SCHEMA])


def trace_batches(name: str, source: IO[bytes]) -> Iterator[pa.RecordBatch]:
    """The rows of one trace file as batches of `TRACE_SCHEMA`'s columns (nullable, as Spark
    reads them), a row group at a time.

    Raises:
        TraceError: Not a readable Parquet file, a page failing its checksum, a schema that is
            not a trace's, or a bad row (named by purgatory and op_id, with how many more bad
            rows its row group holds).
    """
    try:
        parquet = pq.ParquetFile(source, page_checksum_verification=True)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise TraceError(f"trace file {name}: {_unreadable(exc)}") from None
    problem = trace_schema_problem(parquet.schema_arrow)
    if problem is not None:
        raise TraceError(f"trace file {name}: {problem}")
    for group in range(parquet.num_row_groups):
        try:
            table = parquet.read_row_group(group)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise TraceError(f"trace file {name}: {_unreadable(exc)}") from None
        rows = table.select(_CAST.names).cast(_CAST).combine_chunks()
        _check_rows(name, rows)
        # (As a Spark data source yields them: Spark's schema has no not-null columns.)
        yield from rows.to_batches()


def _unreadable(exc: BaseException) -> str:
    return file_cause(exc) or f"unreadable Parquet ({first_line(exc)})"


def _not_finite(column: Any) -> Any:
    return pc.invert(pc.is_finite(column))


def _problems(
    rows: pa.Table, limits: Sequence[tuple[float, float, str]] = ()
) -> list[tuple[Any, str]]:
    """(mask of the rows with the problem, the problem), in the order `load_trace` checks.

    `limits`: the timer's horizons to check the timeouts against (`horizon_limits`; the data
    source knows no configuration and checks none, the direct read of a replay does). Without
    a ``keys`` column (the split replay's driver reads every column but that one), the checks
    of the keys are left out.
    """
    arrival, timeout, condition = rows["arrival"], rows["timeout"], rows["condition_at"]
    checks_keys: list[tuple[Any, str]] = []
    if "keys" in rows.column_names:
        keys = rows["keys"]
        lengths = pc.fill_null(pc.list_value_length(keys), 0)
        null_keys = np.zeros(rows.num_rows, dtype=bool)
        items = pc.list_flatten(keys)
        if items.null_count:
            parents = pc.list_parent_indices(keys).to_numpy()
            null_keys[parents[pc.is_null(items).to_numpy(zero_copy_only=False)]] = True
        checks_keys = [
            (pc.is_null(keys), "column 'keys' is null"),
            (pc.equal(lengths, 0), "column 'keys' is empty"),
            (pa.array(null_keys), "column 'keys' holds a null key"),
        ]
    return [
        (pc.is_null(rows["purgatory"]), "column 'purgatory' is null"),
        (pc.is_null(rows["op_id"]), "column 'op_id' is null"),
        (pc.is_null(arrival), "column 'arrival' is null"),
        (_not_finite(arrival), "column 'arrival' is not finite"),
        (pc.is_null(timeout), "column 'timeout' is null"),
        (_not_finite(timeout), "column 'timeout' is not finite"),
        (pc.less(timeout, 0), "column 'timeout' is negative"),
        *(
            (
                pc.greater(pc.multiply(timeout, scale), limit),
                f"column 'timeout' is beyond the timer's horizon ({label})",
            )
            for scale, limit, label in limits
        ),
        *checks_keys,
        (_not_finite(condition), "column 'condition_at' is not finite (use null for never)"),
        (pc.less(condition, arrival), "column 'condition_at' is before the arrival"),
    ]


def bad_rows(rows: pa.Table, limits: Sequence[tuple[float, float, str]] = ()) -> pa.Table | None:
    """The rows of `rows` (a table of `TRACE_SCHEMA`'s types, one chunk; ``keys`` may be left
    out, and its checks with it) that `load_trace` would refuse, with their first problem in a
    ``_problem`` column; ``None`` if there is none."""
    first: pa.Array | None = None
    said = pa.nulls(rows.num_rows, pa.string())
    for mask, problem in _problems(rows, limits):
        hit = pc.fill_null(mask, False)
        if not pc.any(hit).as_py():
            continue
        said = pc.if_else(pc.and_(hit, pc.is_null(said)), problem, said)
        first = hit if first is None else pc.or_(first, hit)
    if first is None:
        return None
    return rows.append_column("_problem", said).filter(first)


def _check_rows(name: str, rows: pa.Table) -> None:
    """Refuse the first bad row of `rows` (by purgatory, then op_id), saying how many more."""
    bad = bad_rows(rows)
    if bad is None:
        return
    bad = bad.sort_by([("purgatory", "ascending"), ("op_id", "ascending")])
    row = bad.slice(0, 1).to_pylist()[0]
    more = bad.num_rows - 1
    raise TraceError(
        f"trace file {name}: row purgatory={row['purgatory']!r} op_id={row['op_id']!r}: "
        f"{row['_problem']} (arrival={row['arrival']!r}, timeout={row['timeout']!r}, "
        f"condition_at={row['condition_at']!r})"
        + (f"; {more} more bad row{'s' if more > 1 else ''} in this file" if more else "")
    )
