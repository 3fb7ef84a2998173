"""The Spark session, the Java check and whole-or-nothing output directories."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

__all__ = (
    "JavaMissing",
    "atomic_output",
    "check_java",
    "get_session",
    "running_under_spark_submit",
)


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


def get_session(
    master: str | None, app: str = "purgatory-pipeline", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """The Spark session: `master` (default ``local[*]``) unless spark-submit already chose one.

    The Python workers run this interpreter (``PYSPARK_PYTHON``, unless set), so the package
    and its dependencies are the ones installed here; Spark's console progress bar is on.
    """
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder: Any = SparkSession.builder.appName(app)
    if not running_under_spark_submit():
        builder = builder.master(master or "local[*]")
        builder = builder.config("spark.ui.showConsoleProgress", "true")
    elif master is not None:
        print(
            f"purgatory.pipeline: --master {master} ignored: spark-submit chose the master",
            file=sys.stderr,
        )
    builder = builder.config("spark.sql.session.timeZone", "UTC").config(
        "spark.sql.execution.arrow.maxRecordsPerBatch", "10000"
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session: SparkSession = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def _fs(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """Hadoop's FileSystem and Path for `path`: the local disk, HDFS or an object store alike."""
    jvm: Any = spark.sparkContext._jvm
    jpath = jvm.org.apache.hadoop.fs.Path(path)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return jpath.getFileSystem(conf), jpath


@contextmanager
def atomic_output(spark: SparkSession, out: str, *, overwrite: bool) -> Iterator[str]:
    """Yield a staging directory beside `out`; rename it to `out` only if the body succeeds.

    A job that fails leaves no `out` at all (its staging directory is deleted), so a directory
    named `out` is always a complete result.

    Raises:
        FileExistsError: `out` exists and `overwrite` is false.
    """
    fs, final = _fs(spark, out)
    if fs.exists(final) and not overwrite:
        raise FileExistsError(f"output {out} already exists (pass --overwrite to replace it)")
    staging = f"{out.rstrip('/')}.staging-{uuid.uuid4().hex[:8]}"
    _, jstaging = _fs(spark, staging)
    try:
        yield staging
    except BaseException:
        fs.delete(jstaging, True)
        raise
    if fs.exists(final):
        fs.delete(final, True)
    if not fs.rename(jstaging, final):
        fs.delete(jstaging, True)
        raise OSError(f"could not rename {staging} to {out}")
