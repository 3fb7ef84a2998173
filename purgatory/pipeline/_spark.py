"""The Spark session (classic or Spark Connect), the Java check, whole-or-nothing outputs.

The jobs use only what a classic session and a Spark Connect session both offer (the DataFrame
API, ``mapInArrow``, runtime SQL settings). What differs lives here, behind `is_connect`:
starting the session, the log level, and how an output directory is published (Hadoop's
FileSystem through the JVM on a classic session; pyarrow's filesystems inside a task on Spark
Connect, whose client has no JVM).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

import pyarrow as pa
from pyspark import SparkConf, SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from . import _class_archive as class_archive
from ._checks import (
    InputError,
    JavaMissing,
    check_connect_server,
    check_local_remote,
    check_master,
    check_port_free,
    connect_url,
)
from ._checks import check_java as _check_java
from ._relay import StderrRelay

__all__ = (
    "JavaMissing",
    "JvmStartError",
    "atomic_output",
    "check_java",
    "command_ended",
    "connect_url",
    "get_session",
    "interrupted",
    "is_connect",
    "is_local_master",
    "quiet",
    "running_under_spark_submit",
    "stop_on_interrupt",
    "utc_timestamps",
)

#: Session settings every job relies on: UTC for timestamps, Arrow batches of a size that
#: keeps a Python worker's memory small.
_SQL: Final = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
}
_LOCAL: Final = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")


def check_java() -> None:
    """Raise `JavaMissing` with one clear line when Spark's launcher would find no usable java:
    none on ``PATH`` nor in ``JAVA_HOME``, a ``JAVA_HOME`` without one, or one older than 17.

    Runs before Spark is started, whose own error for these is "Java gateway process exited
    before sending its port number" and nothing else.
    """
    _check_java()


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
    remote: str | None = None,
    quiet_start: bool = True,
) -> SparkSession:
    """The Spark session of a command: Spark Connect, a classic master, or spark-submit's.

    - Spark Connect: `remote` (``sc://host:port``, or ``local``/``local[N]`` for a server
      started in this process, as pyspark's ``--remote``), a `master` ``sc://host:port``, or no
      master and ``SPARK_REMOTE`` set. A remote server runs the jobs: no Java is needed here,
      and it must accept connections now (pyspark's client would retry for minutes). A server
      started here listens on 127.0.0.1 only, at a free port, with no web UI, and serves only
      clients with its token (`_server_settings`).
    - a classic master (default ``local[*]``), unless spark-submit already chose one. With a
      ``local[...]`` master the driver binds 127.0.0.1 only, and the shuffle has as many
      partitions as there are cores (adaptive execution coalesces them further): a small job
      does not pay for 200 tasks per shuffle.
    - the web UI starts only with `ui` (under spark-submit, its own settings decide); the
      console progress bar only when stderr is a terminal.
    - `quiet_start`: a driver started here says nothing while it starts (the JVM's and Spark's
      start-up lines, which would come before a command's one-line error); later lines pass.

    The Python workers run this interpreter (``PYSPARK_PYTHON``, unless set), so the package
    and its dependencies are the ones installed here. `conf` is applied last.

    Raises:
        InputError: What can be checked before Spark starts, in one line: a master or
            ``--remote`` of no known form, no usable java (`JavaMissing`), no Connect server at
            the URL, a busy port named for a server started here.
        JvmStartError: The JVM started here exited at its start (its cause, in one line).
    """
    settings: dict[str, str] = dict(_SQL)
    url = connect_url(master, remote)
    if url is not None and not url.startswith("local"):
        return _remote({**settings, **(conf or {})}, url)
    server = url  # a Spark Connect server to start in this process, or None
    if server is not None:
        check_local_remote(server)
        if running_under_spark_submit():
            raise InputError(
                f"--remote {server}: a Spark session already runs in this process "
                "(spark-submit's, or one made before): use it, or give sc://HOST:PORT"
            )
        master = server.strip()
    elif master is not None and os.environ.get("SPARK_REMOTE"):
        # The explicit option wins; pyspark would refuse the two together.
        print(f"purgatory.pipeline: --master {master}: SPARK_REMOTE ignored", file=sys.stderr)
        del os.environ["SPARK_REMOTE"]
    submitted = running_under_spark_submit()
    existing = SparkContext._active_spark_context is not None
    if not submitted:  # (else spark-submit's JVM runs, with its master)
        check_master(master)
        check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings.update(_driver_settings(master, app, ui=ui, submitted=submitted))
    if server is not None:
        settings.update(_server_settings(conf or {}))
    archive: class_archive.Plan | None = None
    options = "spark.driver.extraJavaOptions"
    if options in settings and options not in (conf or {}):  # a local driver started here
        archive = class_archive.plan(settings[options])
        settings[options] = archive.options
    settings.update(conf or {})
    session: SparkSession
    try:
        session = _classic(app, settings, quiet_start and not submitted)
    except PySparkRuntimeError:
        # A JVM that refuses its class archive does not start: drop the archive, start without.
        if archive is None or archive.used is None:
            raise
        class_archive.discard(archive.used)
        archive = class_archive.Plan(archive.base, None, archive.used)
        settings[options] = archive.options
        session = _classic(app, settings, quiet_start and not submitted)
    if archive is not None:
        _check_archive(archive)
    if not existing:  # (a session that ran already, a notebook's, keeps its user's log level)
        quiet(session, "WARN")
    if server is not None:
        return _connect_to_server(session, settings)
    return session


def _driver_settings(master: str | None, app: str, *, ui: bool, submitted: bool) -> dict[str, str]:
    """The driver's settings: under spark-submit, the web UI if asked for (spark-submit chose
    the rest); else the master, the app's name, the web UI and progress bar, and for a
    ``local[...]`` master loopback only (`_local_settings`)."""
    if submitted:
        chosen = _master_chosen(master)
        if chosen is not None:
            print(f"purgatory.pipeline: --master {master} ignored: {chosen}", file=sys.stderr)
        return {"spark.ui.enabled": "true"} if ui else {}
    settings = {
        "spark.master": master or "local[*]",
        "spark.app.name": app,
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "true" if _terminal() else "false",
    }
    if is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings.update(_local_settings(master))
    return settings


def _master_chosen(master: str | None) -> str | None:
    """Who chose the master that runs instead of `master` (``None``: no other one): spark-submit,
    or the Spark session already running in this process (a notebook's, a test's)."""
    running = SparkContext._active_spark_context
    if master is None or (running is not None and running.master == master):
        return None
    if os.environ.get("PYSPARK_GATEWAY_PORT") or running is None:
        return "spark-submit chose the master"
    return f"this process's Spark session runs on {running.master}"


def _remote(settings: Mapping[str, str], url: str) -> SparkSession:
    """A session of the Spark Connect server at `url`, which must accept connections now:
    pyspark's client would retry an unreachable one for minutes without a word."""
    check_connect_server(url)
    builder: Any = SparkSession.builder.remote(url)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session: SparkSession = builder.getOrCreate()
    return session


#: The Spark Connect server's plugin, and the settings pyspark gives a server it starts.
_SERVER: Final = {
    "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
    "spark.sql.artifact.isolation.enabled": "true",
    "spark.sql.artifact.isolation.alwaysApplyClassloader": "true",
}


def _server_settings(conf: Mapping[str, str]) -> dict[str, str]:
    """What a Spark Connect server started here listens with: loopback only, a free port
    (unless `conf` names one, checked free first), and a token every client must present.

    pyspark's own ``remote("local")`` server listens on every interface at port 15002 with a
    web UI on 4040. Here the token is made once per process (``SPARK_CONNECT_AUTHENTICATE_TOKEN``
    unless set; the server's JVM inherits it, this process's client sends it), and the web UI
    is off like a local driver's (``--ui`` starts it).
    """
    key = "spark.connect.grpc.binding.port"
    try:
        port = int(conf.get(key, "0"))
    except ValueError:
        raise InputError(f"{key} {conf[key]!r}: not a port number") from None
    check_port_free(port)
    token = conf.get("spark.connect.authenticate.token") or secrets.token_urlsafe(32)
    os.environ.setdefault("SPARK_CONNECT_AUTHENTICATE_TOKEN", token)
    return {
        **_SERVER,
        "spark.connect.grpc.binding.address": "127.0.0.1",
        key: str(port),
    }


def _connect_to_server(server: SparkSession, settings: Mapping[str, str]) -> SparkSession:
    """A Spark Connect session of the server that `server` (this process's driver) runs.

    As pyspark's ``remote("local")`` does: Connect mode for the DataFrame API, and the server
    stopped with the session (``SPARK_LOCAL_REMOTE``). The client goes to ``localhost``, the
    host for which pyspark sends the token over a local (loopback-only) channel.
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    jvm: Any = server.sparkContext._jvm
    service = getattr(jvm, "org.apache.spark.sql.connect.service.SparkConnectService$")
    port = int(getattr(service, "MODULE$").localPort())
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    os.environ["SPARK_LOCAL_REMOTE"] = "1"
    builder: Any = ConnectSession.builder.remote(f"sc://localhost:{port}")
    for key, value in settings.items():
        if key.startswith("spark.sql.") and not key.startswith("spark.sql.artifact."):
            builder = builder.config(key, value)
    session: SparkSession = builder.getOrCreate()
    return session


def _terminal() -> bool:
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def _check_archive(archive: class_archive.Plan) -> None:
    """After a local driver started: an archive its JVM did not map goes (it would slow every
    later job down without a word), and one to be saved is saved after this job."""
    process: Any = getattr(SparkContext._gateway, "proc", None)
    used = archive.used
    if (
        used is not None
        and process is not None
        and class_archive.mapped(process.pid, used) is False
    ):
        class_archive.discard(used)
        archive.save = used
    if archive.save is not None:
        class_archive.save_after_exit(archive.save, archive.base)


def _classic(app: str, settings: Mapping[str, str], quiet_start: bool) -> SparkSession:
    """A classic session with `settings`; with `quiet_start`, its driver's JVM started here
    with its stderr passed through a filter that holds back what it says while it starts
    (its start-up lines are dropped; a JVM that dies at its start is reported by its cause)."""
    if quiet_start and SparkContext._gateway is None:
        conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
        launch: Any = launch_gateway  # (untyped)
        read, write = os.pipe()
        relay = StderrRelay(os.fdopen(read, "rb", buffering=0))
        try:
            gateway = launch(conf, popen_kwargs={"stderr": write})
        except PySparkRuntimeError as exc:
            failed: PySparkRuntimeError | None = exc
        else:
            failed = None
        finally:
            os.close(write)  # (the JVM has its own copy)
        if failed is not None:
            raise JvmStartError(relay.failed()) from failed
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm
    else:
        relay = None
    builder: Any = SparkSession.builder.appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session: SparkSession = builder.getOrCreate()
    except BaseException:
        if relay is not None:
            _forget_gateway()
        raise
    finally:
        if relay is not None:
            relay.started()
    return session


class JvmStartError(PySparkRuntimeError):
    """Spark's JVM exited before it started: the message's first line is its cause, as the
    JVM (or spark-submit) said it; the lines after are all it said."""

    def __init__(self, said: list[str]) -> None:
        text = f"Spark's JVM exited at its start: {_cause(said)}"
        super().__init__(message="\n".join([text, *said]))


#: A JVM's or spark-submit's line that says why it stopped.
_CAUSE: Final = re.compile(
    r"(Error|Exception|error:|Unrecognized|Invalid|Could not|cannot|not found|No such)"
)


def _cause(said: list[str]) -> str:
    """The line of what a JVM said at its start that names why it stopped: the first error
    line (not a stack frame), without "Exception in thread "main"" before it."""
    lines = [line.strip() for line in said if line.strip() and not line.startswith("\tat ")]
    at = next((i for i, line in enumerate(lines) if _CAUSE.search(line)), 0)
    if not lines:
        return "it said nothing (is the Spark installation complete?)"
    found = re.sub(r'^Exception in thread "[^"]*"\s*', "", lines[at])
    if found.startswith(_GENERIC) and at + 1 < len(lines):  # the JVM says why on the next line
        found = f"{found.rstrip('.')}: {lines[at + 1]}"
    return found[:400]


#: A JVM's lines that say it stopped, not why.
_GENERIC: Final = ("Error occurred during initialization of VM", "Error: Could not create the")


def _forget_gateway() -> None:
    """Shut a gateway launched here whose context did not start, so that a retry starts a
    new JVM (with other options)."""
    gateway: Any = SparkContext._gateway
    SparkContext._gateway = None
    SparkContext._jvm = None
    if gateway is not None:
        with contextlib.suppress(Exception):
            gateway.shutdown()
        process = getattr(gateway, "proc", None)
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError):
                process.stdin.close()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


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
    """Set the driver's log level: a classic session's, or that of the Spark Connect server
    this process started (a remote server keeps its own)."""
    if not is_connect(spark):
        spark.sparkContext.setLogLevel(level)
    elif os.environ.get("SPARK_LOCAL_REMOTE") and SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.setLogLevel(level)


#: Set by the handler `stop_on_interrupt` installs, at the first Ctrl-C.
_INTERRUPTED: Final = threading.Event()
#: Set by `command_ended`: a Ctrl-C held back is not delivered again.
_ENDED: Final = threading.Event()


def interrupted() -> bool:
    """Whether Ctrl-C was pressed since `stop_on_interrupt` (a long job checks it between its
    calls into Spark, to stop cleanly)."""
    return _INTERRUPTED.is_set()


def command_ended() -> None:
    """Tell the handler of `stop_on_interrupt` that the command has ended (returned, or caught
    its error): a Ctrl-C it held back during a Spark Connect call is no longer raised (it would
    come through the command line's own error handling as a traceback)."""
    _ENDED.set()


def stop_on_interrupt(spark: SparkSession) -> None:
    """Make Ctrl-C stop a command's job cleanly, with no trace on stderr.

    pyspark's own handler cancels the jobs through the very Py4J connection the main thread is
    waiting on: a reentrant call that fails, and Py4J logs that and the interrupt on the root
    logger, 48 lines of traces. This one cancels the jobs from a thread of its own (on Spark
    Connect: interrupts the session's operations), drops what Py4J logs from then on, and
    raises `KeyboardInterrupt` in the main thread. A second Ctrl-C raises it again at once.
    Only for the main thread of a command line: a library leaves signals to its application.

    On Spark Connect the `KeyboardInterrupt` waits until the main thread is out of the client's
    call in flight, if any: raised inside one, it kills gRPC's channel thread (a ``KeyError`` in
    ``channel_spin``), after which every call on the channel, the queries' stop among them,
    waits forever (a follow job stopped so hung past the tests' 120 s). The interrupt is
    delivered again every `_REDELIVER` seconds until it could be raised (meanwhile the
    interrupted operations fail as cancelled) or the command has ended (`command_ended`).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _handler(spark, is_connect(spark)))


#: Seconds between deliveries of a Ctrl-C that a Spark Connect call in flight held back.
_REDELIVER: Final = 0.2
#: The modules whose frames mean a Spark Connect call in flight.
_CLIENT_MODULES: Final = ("grpc", "pyspark.sql.connect.client")


def _handler(spark: SparkSession, connect: bool) -> Callable[[int, Any], None]:
    """The SIGINT handler `stop_on_interrupt` installs (see there)."""
    redelivered = threading.Event()
    raised = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        first = not _INTERRUPTED.is_set()
        again = redelivered.is_set()
        redelivered.clear()
        _INTERRUPTED.set()
        if first:
            _silence_py4j()
            threading.Thread(
                target=_cancel, args=(spark,), name="purgatory-interrupt", daemon=True
            ).start()
        if (first or again) and connect and _in_client_call(frame):
            if first:
                threading.Thread(
                    target=_redeliver,
                    args=(redelivered, raised),
                    name="purgatory-interrupt-again",
                    daemon=True,
                ).start()
            return
        if again and (raised.is_set() or _ENDED.is_set()):
            return  # (already raised, or the command ended: it is stopping)
        raised.set()
        raise KeyboardInterrupt

    return handler


def _in_client_call(frame: Any) -> bool:
    """Whether `frame` (the main thread's, where a signal came) is inside a Spark Connect call."""
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(_CLIENT_MODULES):
            return True
        frame = frame.f_back
    return False


def _redeliver(redelivered: threading.Event, raised: threading.Event) -> None:
    """Deliver a held-back Ctrl-C to the main thread again until it has been raised there."""
    import _thread

    while not raised.wait(_REDELIVER) and not _ENDED.is_set():
        redelivered.set()
        _thread.interrupt_main(signal.SIGINT)


def _silence_py4j() -> None:
    """Drop what Py4J logs from now on: on its own loggers (``py4j.clientserver``: a connection
    the interrupt broke, shut down), and on the root logger, where it logs a send that failed."""
    logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)
    root = logging.getLogger()
    root.addFilter(_not_py4j)
    for handler in root.handlers:
        handler.addFilter(_not_py4j)


def _not_py4j(record: logging.LogRecord) -> bool:
    """A root-logger filter: Py4J's messages about a connection the interrupt broke go."""
    return f"{os.sep}py4j{os.sep}" not in record.pathname


def _cancel(spark: SparkSession) -> None:
    with contextlib.suppress(Exception):
        if is_connect(spark):
            spark.interruptAll()
        else:
            spark.sparkContext.cancelAllJobs()


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
