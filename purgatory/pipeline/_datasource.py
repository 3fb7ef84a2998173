"""The Spark data sources ``purgatory-events`` and ``purgatory-trace`` (Spark's Python Data
Source API), registered on a session by `register_data_sources`.

    register_data_sources(spark)
    ops = spark.read.format("purgatory-events").load("events/")        # a DataFrame
    live = spark.readStream.format("purgatory-events").load("events/")  # a streaming one
    trace = spark.read.format("purgatory-trace").load("trace/")

They work alike on a classic session and on Spark Connect (the server runs them: its Python
workers need this package). A read is one partition per file, so a cluster reads files in
parallel; each file is read and checked whole by `._eventfile` or `._tracefile` in its task,
and a bad one fails the job with one line naming the file and the line or row (`task_errors`
turns it back into a `TraceError`). Files are listed and opened with pyarrow's filesystems:
local paths and ``file:``, ``s3://``, ``gs://``, ``hdfs://`` and ``abfs://`` URIs. Files and
directories whose names start with ``_`` or ``.`` are skipped, as Spark's own readers do.

A stream's offset is the set of files read so far: each micro-batch reads the files that
appeared since, once. That suits directories that recorders publish into by renaming a whole
file (never changed after): a file that changes after it was read is not read again.

Options of ``purgatory-events``:

- ``includePartFiles`` (``false``): also read ``*.part`` files, still being written or left by a
  killed process, up to their last whole line or batch (batch reads only).
- ``requireUtc`` (``false``): refuse a file whose operations have no UTC anchor.
- ``watchRecords`` (``false``): also the *watch records* (outcome ``watched``) of recorders
  made with ``watch_records=True``: a row as each operation was watched, before its end's row
  (without it they are dropped: one row per operation).
- ``anchors`` (``false``): one row per distinct UTC anchor of each file (``file``, ``clock``,
  ``utc``) instead of the operations.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from ._eventfile import ANCHOR_SCHEMA, EVENTS_SCHEMA, anchor_batches, event_batches
from ._frames import TraceError
from ._generate import TRACE_SCHEMA
from ._tracefile import trace_batches

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

try:  # Spark 4.2 on: a stream that knows where "all available now" ends
    from pyspark.sql.streaming.datasource import (
        SupportsTriggerAvailableNow as _AvailableNow,
    )
except ImportError:  # pragma: no cover - Spark 4.1: its wrapper reads to the latest offset
    _AvailableNow = object  # type: ignore[assignment,misc]

__all__ = (
    "EVENTS_FORMAT",
    "TRACE_FORMAT",
    "EventsSource",
    "TraceSource",
    "WorkerPythonError",
    "check_worker_python",
    "list_files",
    "register_data_sources",
    "spark_struct",
)

EVENTS_FORMAT: Final = "purgatory-events"
TRACE_FORMAT: Final = "purgatory-trace"
#: The files an event-log read takes, and those it takes with ``includePartFiles``.
_EVENT_SUFFIXES: Final = (".jsonl", ".arrows")
_PART_SUFFIXES: Final = tuple(suffix + ".part" for suffix in _EVENT_SUFFIXES)


def spark_struct(schema: pa.Schema) -> T.StructType:
    """The Spark schema of one of this package's Arrow schemas."""
    types: dict[str, T.DataType] = {
        "string": T.StringType(),
        "int32": T.IntegerType(),
        "int64": T.LongType(),
        "double": T.DoubleType(),
        "list<item: string>": T.ArrayType(T.StringType()),
        "timestamp[us, tz=UTC]": T.TimestampType(),
    }
    return T.StructType([T.StructField(f.name, types[str(f.type)], True) for f in schema])


class FilePartition(InputPartition):
    """One file to read: where to open it (`uri`) and its name as the user gave it."""

    def __init__(self, uri: str, name: str) -> None:
        super().__init__(name)
        self.uri = uri
        self.name = name


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of `path` and the path in it: a plain path is made absolute, and
    Hadoop's ``file:/x`` is ``file:///x``."""
    if path.startswith("file:") and not path.startswith("file://"):
        path = "file://" + path.removeprefix("file:")
    elif "://" not in path:
        path = os.path.abspath(path)
    fs, where = pafs.FileSystem.from_uri(path)
    return fs, str(where)


def _hidden(relative: str) -> bool:
    return any(part.startswith(("_", ".")) for part in relative.split("/"))


def list_files(path: str, suffixes: Sequence[str] | None, what: str) -> list[tuple[str, str]]:
    """Every file under `path` (a file or a directory) ending in one of `suffixes` (``None``:
    any), hidden ones left out: ``(relative path, its name as given)``, sorted.

    Raises:
        TraceError: `path` does not exist (`what` names it).
    """
    fs, where = _filesystem(path)
    info = fs.get_file_info(where)
    if info.type == pafs.FileType.NotFound:
        raise TraceError(f"{what} {path}: no such file or directory")
    if info.type != pafs.FileType.Directory:
        return [("", path)]
    found = []
    top = where.rstrip("/")
    for entry in fs.get_file_info(pafs.FileSelector(top, recursive=True)):
        if entry.type != pafs.FileType.File:
            continue
        relative = entry.path[len(top) :].lstrip("/")
        if _hidden(relative) or (suffixes is not None and not relative.endswith(tuple(suffixes))):
            continue
        found.append((relative, f"{path.rstrip('/')}/{relative}"))
    return sorted(found)


def _join(root: str, relative: str) -> str:
    return root if not relative else f"{root.rstrip('/')}/{relative}"


def _open(uri: str, *, seekable: bool = False) -> Any:
    """`uri` opened for reading: a stream, or a file that can seek (Parquet's footer)."""
    fs, where = _filesystem(uri)
    return fs.open_input_file(where) if seekable else fs.open_input_stream(where)


def _flag(options: Any, name: str) -> bool:
    value = str(options.get(name, "false")).strip().lower()
    if value not in {"true", "false"}:
        raise ValueError(f"option {name!r} must be true or false, got {value!r}")
    return value == "true"


def _path(options: Any, source: str) -> str:
    path = options.get("path")
    if not path:
        raise ValueError(
            f"{source}: give the path to read: spark.read.format({source!r}).load(PATH)"
        )
    return str(path)


class _Files:
    """What a read of files needs on the driver and in every task: the root, the files' kind,
    and how one file is read (a picklable description; tasks get a copy)."""

    def __init__(self, root: str, kind: str, options: Any) -> None:
        self.root = root
        self.kind = kind
        self.partial = kind == "events" and _flag(options, "includePartFiles")
        self.require_utc = kind == "events" and _flag(options, "requireUtc")
        self.anchors = kind == "events" and _flag(options, "anchors")
        self.watches = kind == "events" and _flag(options, "watchRecords")

    @property
    def what(self) -> str:
        return "event log" if self.kind == "events" else "trace"

    def suffixes(self) -> tuple[str, ...] | None:
        if self.kind != "events":
            return None
        return _EVENT_SUFFIXES + (_PART_SUFFIXES if self.partial else ())

    def listing(self) -> list[tuple[str, str]]:
        files = list_files(self.root, self.suffixes(), self.what)
        single = files == [("", self.root)]
        if single and self.kind == "events" and not self.root.endswith(self.suffixes() or ()):
            raise TraceError(
                f"event log {self.root}: not an event log file (expected a name ending in "
                f"{' or '.join(_EVENT_SUFFIXES)}, or a directory of them)"
            )
        return files

    def partition(self, relative: str) -> FilePartition:
        return FilePartition(_join(self.root, relative), _join(self.root, relative))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePartition)
        with _open(partition.uri, seekable=self.kind == "trace") as source:
            if self.kind == "trace":
                yield from trace_batches(partition.name, source)
            elif self.anchors:
                yield from anchor_batches(partition.name, source, partial=self.partial)
            else:
                partial = partition.name.endswith(".part")
                yield from event_batches(
                    partition.name,
                    source,
                    partial=partial,
                    require_utc=self.require_utc,
                    watches=self.watches,
                )


class _BatchReader(DataSourceReader):
    """A batch read: a partition per file."""

    def __init__(self, files: _Files) -> None:
        self.files = files

    def partitions(self) -> Sequence[InputPartition]:
        found = [self.files.partition(relative) for relative, _ in self.files.listing()]
        # (Spark wants a partition to plan: none of the files is an empty read.)
        return found or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, FilePartition):
            yield from self.files.read(partition)


class _StreamReader(DataSourceStreamReader, _AvailableNow):
    """A stream of the files that appear: an offset is the sorted list of the files read (their
    paths under the root); a micro-batch reads those new since its start, a partition each."""

    def __init__(self, files: _Files) -> None:
        if files.partial:
            raise ValueError(
                "includePartFiles is for batch reads: a stream reads each file once, when it "
                "is published whole"
            )
        self.files = files
        self.cap: list[str] | None = None

    def initialOffset(self) -> dict[str, Any]:
        return {"files": []}

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        # (`start` and `limit`: Spark 4.2's signature; 4.1 calls it without them.)
        seen = set(start["files"]) if start else set()
        now = [relative for relative, _ in self.files.listing()]
        if self.cap is not None:
            now = [relative for relative in now if relative in self.cap]
        return {"files": sorted(seen.union(now))}

    def prepareForTriggerAvailableNow(self) -> None:
        """An ``availableNow`` query reads what is there now, and nothing published after."""
        self.cap = [relative for relative, _ in self.files.listing()]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        new = sorted(set(end["files"]) - set(start["files"]))
        return [self.files.partition(relative) for relative in new]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from self.files.read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass


class EventsSource(DataSource):
    """``purgatory-events``: recorded event logs (JSON Lines and Arrow streams), one row per
    operation (`EVENTS_SCHEMA`), or per anchor with the ``anchors`` option."""

    @classmethod
    def name(cls) -> str:
        return EVENTS_FORMAT

    def schema(self) -> T.StructType:
        anchors = _flag(self.options, "anchors")
        return spark_struct(ANCHOR_SCHEMA if anchors else EVENTS_SCHEMA)

    def _files(self) -> _Files:
        return _Files(_path(self.options, EVENTS_FORMAT), "events", self.options)

    def reader(self, schema: T.StructType) -> DataSourceReader:
        return _BatchReader(self._files())

    def streamReader(self, schema: T.StructType) -> DataSourceStreamReader:
        return _StreamReader(self._files())


class TraceSource(DataSource):
    """``purgatory-trace``: a trace (Parquet, schema version 1), checked file by file, one row
    per operation (`TRACE_SCHEMA`)."""

    @classmethod
    def name(cls) -> str:
        return TRACE_FORMAT

    def schema(self) -> T.StructType:
        return spark_struct(TRACE_SCHEMA)

    def _files(self) -> _Files:
        return _Files(_path(self.options, TRACE_FORMAT), "trace", self.options)

    def reader(self, schema: T.StructType) -> DataSourceReader:
        return _BatchReader(self._files())

    def streamReader(self, schema: T.StructType) -> DataSourceStreamReader:
        return _StreamReader(self._files())


def register_data_sources(spark: SparkSession) -> None:
    """Register ``purgatory-events`` and ``purgatory-trace`` on `spark` (a classic or a Spark
    Connect session); registering again is harmless.

    Then ``spark.read.format("purgatory-events").load(DIR)`` reads every event log under
    ``DIR`` (``spark.readStream`` follows it), and ``spark.read.format("purgatory-trace")``
    reads a trace. The schemas and options: ``docs/pipeline-schemas.md``.

    Raises:
        WorkerPythonError: The session runs its Python workers on this machine (a local
            master, or a Spark Connect server started in this process) with a Python that
            cannot import this package; the message says how to fix it.
    """
    if spark in _REGISTERED:
        return
    check_worker_python(spark)
    spark.dataSource.register(EventsSource)
    spark.dataSource.register(TraceSource)
    _REGISTERED[spark] = None


#: The sessions the sources are registered on (Spark warns of each registration again).
_REGISTERED: weakref.WeakKeyDictionary[Any, None] = weakref.WeakKeyDictionary()


class WorkerPythonError(RuntimeError):
    """The Python a session's workers run cannot import this package (one line: the fix)."""


def check_worker_python(spark: SparkSession) -> None:
    """Check that the Python workers of `spark` can import this package, where they run here.

    A data source runs in Spark's Python workers, which run ``PYSPARK_PYTHON`` as it was when
    the session's context started, else ``python3`` from ``PATH``: outside the virtualenv, the
    first read fails in 40 lines of worker traceback ending in ``No module named 'purgatory'``.
    On a local master (or a Spark Connect server this process started), that Python is run
    once, here, to import the package and pyarrow and numpy (``spark.submit.pyFiles`` on its
    path, as the workers have them). Workers elsewhere (a cluster, a remote Spark Connect
    server) are not checked.

    Raises:
        WorkerPythonError: It cannot import the package; the message names it and the fix.
    """
    context = _local_context(spark)
    if context is None:
        return
    python = str(getattr(context, "pythonExec", None) or "python3")
    files = context.getConf().get("spark.submit.pyFiles") or ""
    paths = [p.removeprefix("file:") for p in files.split(",") if p]
    problem = _import_problem(python, tuple(paths), os.environ.get("PYTHONPATH", ""))
    if problem is not None:
        raise WorkerPythonError(
            f"Spark's Python workers run {python} ({problem}): set PYSPARK_PYTHON="
            f"{sys.executable} before the session is built (or "
            f"spark.sparkContext.pythonExec = {sys.executable!r}), or install this package "
            f"in that Python"
        )


def _local_context(spark: SparkSession) -> Any:
    """The SparkContext of `spark` when its Python workers run on this machine, else None."""
    from pyspark import SparkContext

    if type(spark).__module__.startswith("pyspark.sql.connect"):
        context = SparkContext._active_spark_context
        if not os.environ.get("SPARK_LOCAL_REMOTE") or context is None:
            return None  # a remote server's workers
    else:
        context = spark.sparkContext
    master = str(context.master)
    return context if master.startswith("local") and "cluster" not in master else None


@functools.cache
def _import_problem(python: str, paths: tuple[str, ...], pythonpath: str) -> str | None:
    """Why `python` cannot import what the sources' tasks need (this package, pyarrow, numpy;
    pyspark comes from Spark), with `paths` before `pythonpath`, or None; asked once per
    Python and path."""
    found = shutil.which(python)
    if found is None:
        return "not found on PATH" if os.sep not in python else "no such executable"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *filter(None, [pythonpath])])}
    try:
        done = subprocess.run(
            [found, "-c", "import purgatory, pyarrow, numpy"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run it: {exc}"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {done.returncode}"
