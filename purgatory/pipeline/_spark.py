"""The Spark session (classic or Spark Connect), the Java check, whole-or-nothing outputs.

The jobs use only what a classic session and a Spark Connect session both offer (the DataFrame
API, ``mapInArrow``, runtime SQL settings). What differs lives here, behind `is_connect`:
starting the session, the log level, and how an output directory is published (Hadoop's
FileSystem through the JVM on a classic session; pyarrow's filesystems inside a task on Spark
Connect, whose client has no JVM).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from pyspark import SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from . import _class_archive as class_archive
from ._checks import connect_url

__all__ = (
    "JavaMissing",
    "atomic_output",
    "check_java",
    "connect_url",
    "get_session",
    "is_connect",
    "is_local_master",
    "quiet",
    "running_under_spark_submit",
    "utc_timestamps",
)

#: Session settings every job relies on: UTC for timestamps, Arrow batches of a size that
#: keeps a Python worker's memory small.
_SQL: Final = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
}
_LOCAL: Final = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")


class JavaMissing(RuntimeError):
    """Spark cannot start: no ``java`` was found."""


def check_java() -> None:
    """Raise `JavaMissing` with one clear line when neither ``JAVA_HOME`` nor ``PATH`` has java.

    Runs before Spark is started, whose own error for this is a long gateway traceback.
    """
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return
    if shutil.which("java"):
        return
    raise JavaMissing(
        "Java not found: Spark needs Java 17 or later on PATH or in JAVA_HOME "
        "(for example: apt-get install openjdk-17-jre-headless)"
    )


def running_under_spark_submit() -> bool:
    """``True`` when this driver was started by ``spark-submit`` (or a Spark context runs).

    ``spark-submit`` starts the JVM first and hands the Python driver its gateway through
    ``PYSPARK_GATEWAY_PORT``; then the master comes from spark-submit and must not be set here.
    """
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT")) or (
        SparkContext._active_spark_context is not None
    )


def is_local_master(master: str | None) -> bool:
    """Whether `master` (``None``: the default, ``local[*]``) runs everything in this process."""
    return master is None or _LOCAL.fullmatch(master.strip()) is not None


def local_cores(master: str | None) -> int:
    """The cores a ``local[...]`` master uses (``local``: 1, ``local[*]``: every core here)."""
    found = _LOCAL.fullmatch((master or "local[*]").strip())
    count = found.group(1) if found else None
    if count is None:
        return 1 if found else os.cpu_count() or 1
    return os.cpu_count() or 1 if count == "*" else max(1, int(count))


def get_session(
    master: str | None = None,
    app: str = "purgatory-pipeline",
    conf: Mapping[str, str] | None = None,
    *,
    ui: bool = False,
) -> SparkSession:
    """The Spark session of a command: Spark Connect, a classic master, or spark-submit's.

    - ``sc://host:port`` (or no master and ``SPARK_REMOTE`` set): a Spark Connect session; no
      Java is needed here, the server runs the jobs.
    - a classic master (default ``local[*]``), unless spark-submit already chose one. With a
      ``local[...]`` master the driver binds 127.0.0.1 only, and the shuffle has as many
      partitions as there are cores (adaptive execution coalesces them further): a small job
      does not pay for 200 tasks per shuffle.
    - the web UI starts only with `ui` (under spark-submit, its own settings decide).

    The Python workers run this interpreter (``PYSPARK_PYTHON``, unless set), so the package
    and its dependencies are the ones installed here. `conf` is applied last.
    """
    settings: dict[str, str] = dict(_SQL)
    remote = connect_url(master)
    if remote is not None:
        builder: Any = SparkSession.builder.remote(remote)
    else:
        if master is not None and os.environ.get("SPARK_REMOTE"):
            # The explicit option wins; pyspark would refuse the two together.
            print(f"purgatory.pipeline: --master {master}: SPARK_REMOTE ignored", file=sys.stderr)
            del os.environ["SPARK_REMOTE"]
        check_java()
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.appName(app)
        if running_under_spark_submit():
            if master is not None:
                print(
                    f"purgatory.pipeline: --master {master} ignored: spark-submit chose the master",
                    file=sys.stderr,
                )
            if ui:
                settings["spark.ui.enabled"] = "true"
        else:
            builder = builder.master(master or "local[*]")
            settings["spark.ui.enabled"] = "true" if ui else "false"
            settings["spark.ui.showConsoleProgress"] = "true"
            if is_local_master(master):
                os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
                settings.update(_local_settings(master))
    saving: Path | None = None
    options = "spark.driver.extraJavaOptions"
    if options in settings and options not in (conf or {}):  # a local driver started here
        settings[options], saving = class_archive.java_options(settings[options])
    for key, value in {**settings, **(conf or {})}.items():
        builder = builder.config(key, value)
    try:
        session: SparkSession = builder.getOrCreate()
    except PySparkRuntimeError:
        # A JVM that refuses its class archive does not start: drop the archive, start without.
        if options not in settings or not class_archive.discard(settings[options]):
            raise
        saving = None
        session = builder.config(options, _JVM_OPTIONS).getOrCreate()
    if saving is not None:
        class_archive.publish_at_exit(saving)
    quiet(session, "WARN")
    return session


#: A local driver's JVM: C1 only and one collector thread (see `_local_settings`).
_JVM_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _local_settings(master: str | None) -> dict[str, str]:
    """What a ``local[...]`` session sets: loopback only; a shuffle partition per core; and a
    JVM that compiles with C1 only and collects with one thread, which halves the start of
    Spark on a busy 2-core machine (its optimising compiler's threads otherwise compete with
    the job for the cores), started from the archive of its classes (`_class_archive`). ``--conf
    spark.driver.extraJavaOptions=`` undoes the latter two."""
    return {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(local_cores(master)),
        "spark.driver.extraJavaOptions": _JVM_OPTIONS,
    }


def is_connect(spark: SparkSession) -> bool:
    """Whether `spark` is a Spark Connect session (no JVM, no SparkContext in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def quiet(spark: SparkSession, level: str) -> None:
    """Set the driver's log level (a classic session's; a Connect server keeps its own)."""
    if not is_connect(spark):
        spark.sparkContext.setLogLevel(level)


@contextmanager
def utc_timestamps(spark: SparkSession) -> Iterator[None]:
    """Write Parquet timestamps as UTC-adjusted microseconds while in the block.

    Spark's default, INT96, carries no time zone: pandas and pyarrow read it back as a naive
    timestamp. ``TIMESTAMP_MICROS`` is marked ``isAdjustedToUTC``, so every reader keeps UTC.
    """
    key = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(key, "INT96")
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        yield
    finally:
        spark.conf.set(key, before or "INT96")


@contextmanager
def atomic_output(spark: SparkSession, out: str, *, overwrite: bool) -> Iterator[str]:
    """Yield a staging directory beside `out`; rename it to `out` only if the body succeeds.

    A job that fails leaves no `out` at all (its staging directory is deleted), so a directory
    named `out` is always a complete result.

    Raises:
        FileExistsError: `out` exists and `overwrite` is false.
    """
    fs = _files_of(spark)
    if fs("exists", out) and not overwrite:
        raise FileExistsError(f"output {out} already exists (pass --overwrite to replace it)")
    staging = f"{out.rstrip('/')}.staging-{uuid.uuid4().hex[:8]}"
    try:
        yield staging
    except BaseException:
        fs("delete", staging)
        raise
    if fs("exists", out):
        fs("delete", out)
    if not fs("rename", staging, out):
        fs("delete", staging)
        raise OSError(f"could not rename {staging} to {out}")


_FileOp = Callable[..., bool]


def _files_of(spark: SparkSession) -> _FileOp:
    """The file operations (exists, delete, rename) where the session's jobs write."""
    return (lambda *args: _on_executor(spark, *args)) if is_connect(spark) else _hadoop(spark)


def _hadoop(spark: SparkSession) -> _FileOp:
    """Hadoop's FileSystem through the driver's JVM: the local disk, HDFS, object stores."""
    jvm: Any = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()

    def op(name: str, path: str, other: str | None = None) -> bool:
        jpath = jvm.org.apache.hadoop.fs.Path(path)
        fs = jpath.getFileSystem(conf)
        if name == "exists":
            return bool(fs.exists(jpath))
        if name == "delete":
            return bool(fs.delete(jpath, True))
        return bool(fs.rename(jpath, jvm.org.apache.hadoop.fs.Path(other)))

    return op


def _on_executor(spark: SparkSession, name: str, path: str, other: str | None = None) -> bool:
    """A file operation run in one task, where the job's files are (a Connect client may not
    see them), through pyarrow's filesystems (local, HDFS, S3, GCS)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"ok": [file_op(name, path, other)]})

    (row,) = spark.range(1, numPartitions=1).mapInArrow(run, "ok boolean").collect()
    return bool(row["ok"])


def file_op(name: str, path: str, other: str | None = None) -> bool:
    """``exists``, ``delete`` (recursively; ``False`` if nothing was there) or ``rename`` to
    `other`, on the filesystem of `path` (a local path or a URI pyarrow knows)."""
    import pyarrow.fs as pafs

    fs, where = pafs.FileSystem.from_uri(_uri(path))
    kind = fs.get_file_info(where).type
    if name == "exists":
        return bool(kind != pafs.FileType.NotFound)
    if name == "delete":
        if kind == pafs.FileType.Directory:
            fs.delete_dir(where)
        elif kind != pafs.FileType.NotFound:
            fs.delete_file(where)
        return bool(kind != pafs.FileType.NotFound)
    assert other is not None
    _, target = pafs.FileSystem.from_uri(_uri(other))
    fs.move(where, target)
    return True


def _uri(path: str) -> str:
    """`path` as pyarrow reads it: ``file:/x`` (Hadoop's form) as ``file:///x``, and a plain
    path made absolute."""
    if path.startswith("file:") and not path.startswith("file://"):
        return "file://" + path.removeprefix("file:")
    if "://" in path:
        return path
    return os.path.abspath(path)
