"""What the Spark jobs share: their error, a row's first problem, schemas, Spark's read errors.

Only the DataFrame API is used here (and in the jobs), so every job runs the same on a classic
session and on Spark Connect.
"""

from __future__ import annotations

import math
import os
import re
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

__all__ = (
    "TraceError",
    "as_given",
    "file_cause",
    "first_line",
    "first_problem",
    "not_finite",
    "read_errors",
    "read_failure",
    "spark_schema",
    "task_error",
    "task_errors",
)


class TraceError(ValueError):
    """A trace or an event log that cannot be used as it is; the message names file and row."""


def as_given(file: str, root: str) -> str:
    """`file` (a URI as Spark reports it) as a path under `root` as the user gave it, when it is
    under it: an error then names the file the way the user knows it, not by absolute URI."""
    local = next((file[len(p) :] for p in ("file://", "file:") if file.startswith(p)), None)
    if local is None:
        return file
    base = next((root[len(p) :] for p in ("file://", "file:") if root.startswith(p)), root)
    if "://" in base:
        return file
    local, top = urllib.parse.unquote(local), os.path.abspath(base)
    if local == top:
        return root
    if local.startswith(top.rstrip("/") + "/"):
        return os.path.join(root, os.path.relpath(local, top))
    return file


def first_problem(checks: Sequence[tuple[Column, str | None]]) -> Column:
    """The message of the first check that holds (a ``None`` message: no problem, stop)."""
    expr: Any = F
    for condition, message in checks:
        expr = expr.when(condition, F.lit(message))
    result: Column = expr
    return result


def not_finite(column: Column) -> Column:
    """Whether a double column is NaN or infinite."""
    return F.isnan(column) | (F.abs(column) == F.lit(math.inf))


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (its type's name if it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


#: Spark's error for a file a task could not read, and the path it names.
_FAILED_READ: Final = re.compile(r"\[FAILED_READ_FILE[.\w]*\][^\n]*?reading file (\S+?)\.?(?:\s|$)")
#: The causes worth a user's eye, most specific first: (pattern in the trace, what to say).
_CAUSES: Final = (
    (
        re.compile(r"CRC checksum verification failed|could not verify page integrity", re.I),
        "a Parquet page fails its checksum (the file is corrupted)",
    ),
    (
        re.compile(r"ParquetDecodingException|can not read value at|Can't decode|Malformed", re.I),
        "a Parquet page cannot be decoded (the file is corrupted)",
    ),
    (re.compile(r"is not a Parquet file|expected magic number", re.I), "not a Parquet file"),
    (
        re.compile(r"EOFException|Reached the end of stream|truncated", re.I),
        "the file ends early (truncated)",
    ),
)


def file_cause(exc: BaseException) -> str | None:
    """What a reader's error says about its file in a user's words (a page failing its checksum,
    a truncated file, ...), or ``None`` if it is none of those."""
    text = str(exc)
    return next((said for pattern, said in _CAUSES if pattern.search(text)), None)


#: The last line of a Python traceback for our own error, as a Spark task reports it.
_OUR_ERROR: Final = re.compile(r"^(?:[\w.]+\.)?(TraceError|InputError): (.+)$", re.M)


def task_error(exc: BaseException) -> TraceError | None:
    """Our own error (`TraceError`) raised inside a Spark task or a data source, as the driver
    receives it (Spark's error around the task's traceback), or ``None`` if it is not one."""
    if isinstance(exc, TraceError):
        return exc
    text = str(exc)
    if "Traceback (most recent call" not in text and not type(exc).__module__.startswith(
        ("pyspark", "py4j")
    ):
        return None
    found = _OUR_ERROR.findall(text)
    return TraceError(found[-1][1].strip()) if found else None


@contextmanager
def task_errors() -> Iterator[None]:
    """Raise a `TraceError` raised in a Spark task (a bad event log or trace found by a data
    source's reader) as itself, one line, instead of Spark's error around its traceback."""
    try:
        yield
    except Exception as exc:
        ours = task_error(exc)
        if ours is None or ours is exc:
            raise
        raise ours from None


def read_failure(exc: BaseException, what: str, root: str) -> TraceError | None:
    """A one-line `TraceError` for Spark's failure to read one input file, else ``None``.

    Spark wraps what a reader found (a page whose checksum does not match, a page it cannot
    decode) in ``FAILED_READ_FILE`` naming the file, with the reader's own exception further
    down the JVM trace: this says both in one line. `what` names the input (``trace file``),
    and the file is shown under `root` as given (`as_given`).
    """
    text = str(exc)
    found = _FAILED_READ.search(text)
    if found is None:
        return None
    cause = next((said for pattern, said in _CAUSES if pattern.search(text)), None)
    if cause is None:
        cause = "unreadable: " + first_line(exc).split("] ", 1)[-1]
    return TraceError(f"{what} {as_given(found.group(1), root)}: {cause}")


def spark_schema(schema: pa.Schema) -> T.StructType:
    """The Spark struct for an Arrow schema of the types this package uses."""
    mapping: dict[str, T.DataType] = {
        "string": T.StringType(),
        "int32": T.IntegerType(),
        "int64": T.LongType(),
        "double": T.DoubleType(),
        "list<item: string>": T.ArrayType(T.StringType()),
        "binary": T.BinaryType(),
    }
    return T.StructType([T.StructField(f.name, mapping[str(f.type)], f.nullable) for f in schema])


@contextmanager
def read_errors(what: str, root: str) -> Iterator[None]:
    """Turn Spark's failure to read an input file (`read_failure`) into a one-line `TraceError`
    naming the file and the cause; anything else passes unchanged."""
    try:
        yield
    except Exception as exc:
        failure = read_failure(exc, what, root)
        if failure is None:
            raise
        raise failure from exc
