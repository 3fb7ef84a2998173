"""Checks of a command's inputs, outputs and settings that run before Spark starts.

Starting Spark costs seconds, and Spark reports a missing path, a torn Parquet file or an event
log given as a trace as pages of JVM and Py4J traces. These checks look at the local files first
(pure Python, plus pyarrow's Parquet footer reader; the first and last lines of JSON Lines
event logs, the framing of Arrow ones) and raise `InputError` with one line that names the
file, so the command line can stop before a session exists. `check_spark_start` does the same
for what Spark's start needs: a master URL of a known form, a usable java, a Spark Connect
server that accepts connections, a free port for one started here; Spark's own words for
these come late (a silent retry of minutes, a 47-line ``BindException``) or not at all (a
JVM's stderr dropped at its start).

Only local paths are checked: a path with a scheme (``hdfs://``, ``s3a://``) is left to Spark,
and so is a path without one under ``spark-submit``, whose default filesystem may be a cluster's.
What needs the data (nulls, duplicate ids, timeouts beyond the timer's horizon) stays in the
validation scan of `purgatory.pipeline.load_trace`; `horizon_limits` gives it its limits.

Imports only the standard library and the core package; pyarrow (and the event-log reader) is
imported where a file is read, so the command line can say what is missing when the Spark extra
is not installed.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import re
import shutil
import socket
import struct
import subprocess
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from .. import DelayedOperation, DelayedOperationPurgatory
from ..testing import ManualClock

if TYPE_CHECKING:
    from ._replay import ReplayConfig

__all__ = (
    "CONNECT_PORT",
    "EVENT_LOG_SUFFIXES",
    "EXTRA_MODULES",
    "FOLLOW_SETTINGS",
    "JAVA_RELEASE",
    "TRACE_COLUMNS",
    "InputError",
    "JavaMissing",
    "check_apart",
    "check_checkpoint",
    "check_configs",
    "check_connect_server",
    "check_directory",
    "check_event_logs",
    "check_java",
    "check_local_remote",
    "check_master",
    "check_output",
    "check_port_free",
    "check_spark_start",
    "check_trace",
    "connect_endpoint",
    "connect_url",
    "files_here",
    "horizon_limits",
    "local_path",
    "missing_extra",
    "timer_horizon",
    "trace_schema_problem",
)

#: The columns every trace file must have (trace schema version 1).
TRACE_COLUMNS: Final = ("purgatory", "op_id", "arrival", "keys", "timeout", "condition_at")
#: The files `analyze` and ``generate --from-log`` read; ``*.part`` files are still being written.
EVENT_LOG_SUFFIXES: Final = (".jsonl", ".arrows")
#: What the Spark extra brings that every command needs.
EXTRA_MODULES: Final = ("pyspark", "pyarrow", "numpy")
_MAGIC: Final = b"PAR1"
_INSTALL: Final = "pip install 'asyncio-purgatory[spark]'"


class InputError(ValueError):
    """A path, file or setting that a command cannot use; the message is one line."""


class JavaMissing(InputError, RuntimeError):
    """Spark cannot start here: no ``java``, a ``JAVA_HOME`` without one, or a Java too old.

    (A `RuntimeError` too, as it was before the checks of Spark's start moved here.)
    """


def missing_extra(modules: Sequence[str] = EXTRA_MODULES) -> str | None:
    """The hint to install the Spark extra if one of `modules` cannot be imported, else ``None``.

    Looks the modules up without importing them (``--help`` must stay cheap and work anywhere).
    """
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"this command needs the Spark extra (no module {name!r}): {_INSTALL}"
    return None


def connect_url(master: str | None, remote: str | None = None) -> str | None:
    """The Spark Connect URL a command runs against: `remote` (``--remote``: ``sc://...``, or
    ``local``/``local[N]`` for a server started in this process, as pyspark takes it), else
    `master` if it is one (``sc://...``), else ``SPARK_REMOTE`` when no master is given;
    ``None`` for a classic master."""
    if remote is not None:
        return remote
    if master is not None:
        return master if master.startswith("sc://") else None
    return os.environ.get("SPARK_REMOTE") or None


_LOOPBACK: Final = ("localhost", "::1", "[::1]")


def files_here(master: str | None, remote: str | None = None) -> bool:
    """Whether the jobs read and write this machine's files, so that local paths can be
    checked here (and, for Spark Connect, made absolute here): any classic master (the driver
    runs here), or a Spark Connect server on this machine (a loopback address, or ``local``)."""
    url = connect_url(master, remote)
    if url is None or url.startswith("local"):
        return True
    host = url.removeprefix("sc://").split("/", 1)[0].rsplit(":", 1)[0].split(";", 1)[0]
    return host in _LOOPBACK or host.startswith("127.")


# -- what Spark needs to start, checked before it starts -----------------------------------------

#: The master URLs Spark accepts (``SparkContext``'s and spark-submit's forms); ``sc://`` URLs
#: are Spark Connect's and handled apart.
_MASTER: Final = re.compile(
    r"local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?"
    r"|local-cluster\[\s*[1-9]\d*\s*,\s*[1-9]\d*\s*,\s*[1-9]\d*\s*\]"
    r"|spark://[^\s/]+(:\d+)?(,[^\s/]+(:\d+)?)*"
    r"|yarn|k8s://\S+"
)
#: The oldest Java Spark 4 runs on.
JAVA_RELEASE: Final = 17


def check_master(master: str | None, what: str = "--master") -> None:
    """Check the form of a classic master URL (``None``: the default) before a JVM starts.

    A misspelt master otherwise starts a JVM whose spark-submit refuses it on a stderr that the
    start drops: all one sees is "Java gateway process exited before sending its port number".

    Raises:
        InputError: Not a form Spark accepts.
    """
    if master is None or _MASTER.fullmatch(master.strip()) or master.startswith("sc://"):
        return
    raise InputError(
        f"{what} {master}: not a master URL Spark knows (local, local[N], local[*], "
        "spark://HOST:PORT, yarn, k8s://HOST:PORT, or sc://HOST:PORT for Spark Connect)"
    )


def check_local_remote(url: str) -> None:
    """Check a ``--remote`` that starts a Spark Connect server here (``local``, ``local[N]``).

    Raises:
        InputError: Another form.
    """
    if _MASTER.fullmatch(url.strip()) and url.strip().startswith("local") and "-" not in url:
        return
    raise InputError(
        f"--remote {url}: not a Spark Connect URL (sc://HOST:PORT) nor a local server to start "
        "here (local, local[N], local[*])"
    )


def check_java(environ: dict[str, str] | None = None) -> str:
    """The ``java`` a Spark started here runs, checked: it exists and is Java 17 or later.

    Spark's launcher takes ``$JAVA_HOME/bin/java`` when ``JAVA_HOME`` is set (even if it is
    wrong and a good java is on ``PATH``), else the ``java`` on ``PATH``. Run once per java:
    ``java -version`` takes a fraction of a second.

    Raises:
        JavaMissing: No java, a ``JAVA_HOME`` without one, one that does not run, or one older
            than 17; the message says which and what to do.
    """
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not os.access(java, os.X_OK):
            raise JavaMissing(
                f"JAVA_HOME={home} has no bin/java: point JAVA_HOME at a Java {JAVA_RELEASE} or "
                "later installation, or unset it to use the java on PATH"
            )
    else:
        found = shutil.which("java", path=env.get("PATH"))
        if found is None:
            raise JavaMissing(
                f"Java not found: Spark needs Java {JAVA_RELEASE} or later on PATH or in "
                "JAVA_HOME (for example: apt-get install openjdk-17-jre-headless)"
            )
        java = found
    release = _java_release(os.path.realpath(java))
    where = f"JAVA_HOME={home}" if home else java
    if isinstance(release, str):
        raise JavaMissing(f"{where}: java does not run ({release})")
    if release < JAVA_RELEASE:
        raise JavaMissing(
            f"{where} is Java {release}: Spark needs Java {JAVA_RELEASE} or later (set "
            "JAVA_HOME to one)"
        )
    return java


@functools.cache
def _java_release(java: str) -> int | str:
    """The feature release of `java` (8 for ``1.8.0_x``, 17 for ``17.0.15``), or why it did
    not say; cached per executable."""
    try:
        done = subprocess.run(
            [java, "-version"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc) or type(exc).__name__
    said = done.stderr + done.stdout
    found = re.search(r'version "(\d+)(?:\.(\d+))?', said)
    if done.returncode != 0 or found is None:
        lines = [line.strip() for line in said.splitlines() if line.strip()]
        return lines[0] if lines else f"exit status {done.returncode}"
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


#: Spark Connect's port when a URL gives none.
CONNECT_PORT: Final = 15002


def connect_endpoint(url: str) -> tuple[str, int]:
    """The host and port of an ``sc://HOST[:PORT][/;params]`` URL (port 15002 by default).

    Raises:
        InputError: Not such a URL.
    """
    parsed = urllib.parse.urlparse(url.strip())
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if parsed.scheme != "sc" or not parsed.hostname or port == -1:
        raise InputError(f"{url}: not a Spark Connect URL (sc://HOST:PORT)")
    return parsed.hostname, CONNECT_PORT if port is None else port


def check_connect_server(url: str, seconds: float = 10.0) -> None:
    """Check that something accepts connections where a Spark Connect URL points.

    pyspark's client retries an unreachable server for minutes without a word; a plain TCP
    connection says at once (or within `seconds`) whether anything listens there.

    Raises:
        InputError: Nothing listens there, or the host is unknown or unreachable.
    """
    host, port = connect_endpoint(url)
    try:
        with socket.create_connection((host, port), timeout=seconds):
            return
    except socket.gaierror as exc:
        reason = f"unknown host ({exc.strerror})"
    except TimeoutError:
        reason = f"no answer within {seconds:g} s"
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
    raise InputError(
        f"no Spark Connect server at {host}:{port} ({reason}): start one, or give the URL of a "
        "running one (--remote / --master / SPARK_REMOTE)"
    )


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Check that a server can listen on `port` of `host` (a Spark Connect server started here).

    Raises:
        InputError: The port is taken (or not a port); Spark's own error is a 47-line
            ``BindException`` after the JVM has started.
    """
    if not 0 <= port <= 65535:
        raise InputError(f"spark.connect.grpc.binding.port {port}: not a port (0-65535)")
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise InputError(
                f"cannot start a Spark Connect server on {host}:{port}: "
                f"{(exc.strerror or str(exc)).lower()} (another server holds it?): free it, or "
                "drop --conf spark.connect.grpc.binding.port (a free port is chosen)"
            ) from None


def check_spark_start(
    master: str | None, remote: str | None, conf: dict[str, str] | None = None
) -> None:
    """Everything a session of `master` / `remote` needs that can be checked without starting
    it, each failing in one line within seconds: a Spark Connect server that accepts
    connections; for a server started here, a free port; else a master URL of a known form;
    and for a JVM started here, a usable java.

    Raises:
        InputError: The first problem (`JavaMissing` for java).
    """
    url = connect_url(master, remote)
    if url is not None and not url.startswith("local"):
        check_connect_server(url)
        return
    if url is not None:
        check_local_remote(url)
        port = (conf or {}).get("spark.connect.grpc.binding.port", "0")
        if not port.strip().isdigit():
            raise InputError(f"spark.connect.grpc.binding.port {port!r}: not a port number")
        check_port_free(int(port))
    elif os.environ.get("PYSPARK_GATEWAY_PORT"):
        return  # spark-submit started the JVM and chose the master
    else:
        check_master(master)
    check_java()


def local_path(path: str) -> str | None:
    """The local file path Spark will read for `path`, or ``None`` if Spark resolves it elsewhere.

    ``file:`` URIs are local; other schemes are not; a plain path is local unless this driver
    runs under ``spark-submit``, whose default filesystem may be HDFS.
    """
    if path.startswith("file://"):
        return path.removeprefix("file://") or "/"
    if path.startswith("file:"):
        return path.removeprefix("file:")
    if "://" in path or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    return path


def _hidden(name: str) -> bool:
    """Spark skips files and directories whose names start with ``_`` or ``.``."""
    return name.startswith(("_", "."))


def _files(root: str) -> Iterator[str]:
    """Every file Spark would list under `root` (a directory), in a stable order."""
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not _hidden(d))
        for name in sorted(names):
            if not _hidden(name):
                yield os.path.join(directory, name)


def _is_event_log(name: str) -> bool:
    return name.endswith(EVENT_LOG_SUFFIXES) or name.endswith(
        tuple(suffix + ".part" for suffix in EVENT_LOG_SUFFIXES)
    )


def _existing(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise InputError(f"{what} {path}: no such file or directory")
    if not os.access(path, os.R_OK):
        raise InputError(f"{what} {path}: permission denied")


def check_trace(path: str) -> None:
    """Check a trace before Spark reads it: a readable Parquet file, or a directory of them.

    Checked: the path exists; it holds Parquet files and no event logs; every file starts and
    ends with the Parquet magic and its footer reads (a truncated copy fails here); every file
    has the trace's columns and no other, of usable types; the files agree on each column's
    type.

    Raises:
        InputError: The first problem found, naming the file (and the column).
    """
    local = local_path(path)
    if local is None:
        return
    _existing(local, "trace")
    files = list(_files(local)) if os.path.isdir(local) else [local]
    logs = [f for f in files if _is_event_log(os.path.basename(f))]
    if logs:
        raise InputError(
            f"trace {path} holds event logs ({logs[0]}), not a Parquet trace: make a trace "
            f"from them with 'generate --from-log {path} --out TRACE', or summarise them "
            f"with 'analyze --log {path} --out DIR'"
        )
    if not files:
        raise InputError(f"trace {path}: no Parquet files in this directory")
    first: dict[str, tuple[str, str]] = {}  # column -> (type, file that had it first)
    for file in files:
        for name, kind in _trace_columns(file).items():
            seen = first.setdefault(name, (kind, file))
            if seen[0] != kind:
                raise InputError(
                    f"trace file {file}: column {name!r} has type {kind}, but {seen[1]} has "
                    f"{seen[0]}; all files of a trace must agree on column types"
                )


def _trace_columns(file: str) -> dict[str, str]:
    """The columns of one trace file and their types; `InputError` if it is not a usable one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = os.path.getsize(file)
    if size < 12:
        raise InputError(f"trace file {file}: not a Parquet file ({size} bytes)")
    try:
        with open(file, "rb") as f:
            head = f.read(4)
            f.seek(-4, os.SEEK_END)
            tail = f.read(4)
    except OSError as exc:
        raise InputError(f"trace file {file}: cannot read it: {exc.strerror}") from None
    if head != _MAGIC:
        raise InputError(f"trace file {file}: not a Parquet file (it does not start with PAR1)")
    if tail != _MAGIC:
        raise InputError(
            f"trace file {file}: truncated or still being written (no PAR1 footer at its end, "
            f"{size} bytes)"
        )
    try:
        schema = pq.read_schema(file)
    except (OSError, pa.ArrowException) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"trace file {file}: unreadable Parquet footer: {reason}") from None
    problem = trace_schema_problem(schema)
    if problem is not None:
        raise InputError(f"trace file {file}: {problem}")
    return {field.name: str(field.type) for field in schema}


def trace_schema_problem(schema: Any) -> str | None:
    """What makes an Arrow schema (a ``pyarrow.Schema``) not a trace's: a missing or an unknown
    column, or a column of a type that cannot be read as the trace's; ``None`` if it is one."""
    missing = [name for name in TRACE_COLUMNS if name not in schema.names]
    if missing:
        return (
            f"missing column {missing[0]!r} (it has {sorted(schema.names)}; "
            "see docs/pipeline-schemas.md)"
        )
    unknown = [name for name in schema.names if name not in TRACE_COLUMNS]
    if unknown:
        return (
            f"unknown column {unknown[0]!r} (a trace of schema version 1 has exactly "
            f"{', '.join(TRACE_COLUMNS)}; select those to replay it)"
        )
    for name in TRACE_COLUMNS:
        kind = schema.field(name).type
        expected = _usable(name, kind)
        if expected:
            return f"column {name!r} has type {kind}, expected {expected}"
    return None


def _usable(name: str, kind: object) -> str | None:
    """``None`` if a trace column of this Arrow type can be read, else what it should be."""
    import pyarrow as pa

    t = pa.types
    assert isinstance(kind, pa.DataType)
    if name == "purgatory":
        return None if t.is_string(kind) or t.is_large_string(kind) else "a string"
    if name == "op_id":
        return None if t.is_integer(kind) else "an integer"
    if name == "keys":
        ok = (t.is_list(kind) or t.is_large_list(kind)) and (
            t.is_string(kind.value_type)
            or t.is_large_string(kind.value_type)
            or t.is_integer(kind.value_type)
        )
        return None if ok else "a list of strings"
    numeric = t.is_integer(kind) or t.is_floating(kind) or t.is_decimal(kind)
    return None if numeric else "a number (seconds)"


def check_event_logs(path: str) -> None:
    """Check an event-log input before Spark reads it: event-log files, or a directory of them.

    Raises:
        InputError: The path is missing, holds no event log (an empty directory, a Parquet
            trace: the message says what to run instead), or is a file of another kind.
    """
    local = local_path(path)
    if local is None:
        return
    _existing(local, "event log")
    if not os.path.isdir(local):
        if not local.endswith(EVENT_LOG_SUFFIXES):
            raise InputError(
                f"event log {path}: not an event log file (expected a name ending in "
                f"{' or '.join(EVENT_LOG_SUFFIXES)}, or a directory of them)"
            )
        _check_event_file(local)
        return
    files = list(_files(local))
    logs = [f for f in files if os.path.basename(f).endswith(EVENT_LOG_SUFFIXES)]
    if logs:
        for file in logs:
            _check_event_file(file)
        return
    if any(f.endswith(".parquet") or _starts_with_magic(f) for f in files):
        raise InputError(
            f"event log {path} holds Parquet files, not event logs (*.jsonl, *.arrows): if it "
            f"is a trace, replay it with 'replay --trace {path} --out DIR'"
        )
    still = [f for f in files if _is_event_log(os.path.basename(f))]
    if still:
        raise InputError(
            f"event log {path}: no finished event log, only files still being written "
            f"({still[0]}); flush or close the recorder first"
        )
    raise InputError(f"event log {path}: no event logs (*.jsonl, *.arrows) in this directory")


#: How much of a JSON Lines file's start and end is read for its first and last lines.
_EDGE: Final = 1 << 20


def _check_event_file(file: str) -> None:
    """Check what an event-log file shows cheaply, before Spark reads it whole: a JSON Lines
    file's first and last lines (a copy cut short ends in half a line); an Arrow stream's
    schema, its first batch, and the framing of every message (through a memory map: the
    bodies are not read).

    Raises:
        InputError: What the reader would say in a Spark task, naming the file.
    """
    from ._eventfile import _arrow_records, _Columns, _jsonl_line
    from ._frames import TraceError

    try:
        if file.endswith(".arrows"):
            _check_arrow_stream(file, _arrow_records)
            return
        for number, raw in _edge_lines(file):
            _jsonl_line(file, number, raw, _Columns(), {})
    except TraceError as exc:
        text = str(exc).replace(f"{file}: line 0:", f"{file}: last line:", 1)
        raise InputError(text) from None
    except OSError as exc:
        raise InputError(f"event log file {file}: cannot read it: {exc.strerror}") from None


def _check_arrow_stream(file: str, records: Any) -> None:
    """An Arrow event-log stream's schema and first batch, checked by its reader (`records`),
    then every message's framing: a stream cut short ends inside a message."""
    import pyarrow as pa

    from ._frames import TraceError

    with pa.memory_map(file) as source:
        next(records(file, source, False, {}), None)
    with pa.memory_map(file) as source:
        reader = pa.ipc.open_stream(source)
        try:
            while True:
                reader.read_next_batch()
        except StopIteration:
            return
        except (OSError, ValueError, pa.ArrowException) as exc:
            reason = (str(exc).strip().splitlines() or ["cut short"])[0]
            raise TraceError(f"event log file {file}: unreadable Arrow stream ({reason})") from None


def _edge_lines(file: str) -> list[tuple[int, bytes]]:
    """A JSON Lines file's first non-blank line, numbered, and its last (numbered 0: its
    number is unknown without reading the whole file); none for an empty file or one whose
    first line is longer than what is read of it."""
    with open(file, "rb") as f:
        head = f.read(_EDGE)
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - _EDGE))
        tail = f.read(_EDGE)
    first = next(
        ((n, line + b"\n") for n, line in enumerate(head.split(b"\n")[:-1], 1) if line.strip()),
        None,
    )
    if first is None:  # no whole line: one line without its newline, or a very long one
        return [(1, head)] if head.strip() and size <= _EDGE else []
    edges = [first]
    lines = tail.split(b"\n")
    ending = lines.pop()  # after the last newline: a line cut short, or nothing
    whole = [line for line in lines if line.strip()]
    if ending.strip():
        edges.append((0, ending))
    elif whole and (size > _EDGE or len(whole) > 1 or whole[-1] + b"\n" != first[1]):
        edges.append((0, whole[-1] + b"\n"))
    return edges


def _starts_with_magic(file: str) -> bool:
    try:
        with open(file, "rb") as f:
            return f.read(4) == _MAGIC
    except OSError:
        return False


def check_output(
    path: str, *, overwrite: bool, inputs: Sequence[str] = (), what: str = "output"
) -> None:
    """Check that a job can write `path` (a directory it creates whole) before Spark starts.

    Raises:
        InputError: `path` exists and `overwrite` is false; it is, contains or lies inside one
            of `inputs`; or the nearest existing directory above it is a file or not writable.
    """
    local = local_path(path)
    if local is None:
        return
    source = _overlapped(local, inputs)
    if source is not None:
        raise InputError(
            f"{what} {path} overlaps the input {source}: writing it would destroy the input; "
            "choose another directory"
        )
    if os.path.lexists(local):
        if not overwrite:
            raise InputError(f"{what} {path} already exists (pass --overwrite to replace it)")
        return
    _check_writable_above(os.path.dirname(os.path.abspath(local)), f"{what} {path}", "create it in")


def check_apart(path: str, what: str, others: Sequence[tuple[str, str]]) -> None:
    """Check that `path` neither is, contains nor lies inside any of `others` (a job's inputs
    and outputs, as ``(what, path)``): a directory written whole replaces what it holds, and an
    input directory read whole would read what lands in it.

    Raises:
        InputError: `path` overlaps one of `others`.
    """
    local = local_path(path)
    if local is None:
        return
    other = _overlapped(local, [other for _, other in others])
    if other is not None:
        other_what = next(kind for kind, where in others if where == other)
        raise InputError(
            f"{what} {path} overlaps the {other_what} {other}; choose a directory of its own"
        )


def _overlapped(local: str, others: Sequence[str]) -> str | None:
    """The first of `others` (local ones only) that `local` is, contains or lies inside."""
    target = os.path.realpath(local)
    for other in others:
        other_local = local_path(other)
        if other_local is None:
            continue
        real = os.path.realpath(other_local)
        if target == real or _inside(target, real) or _inside(real, target):
            return other
    return None


def _inside(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip(os.sep) + os.sep)


def check_directory(path: str, what: str) -> None:
    """Check that `path` is, or can be created as, a writable directory (an event-log target).

    Raises:
        InputError: It is a file, or cannot be created or written.
    """
    local = local_path(path)
    if local is None:
        return
    _check_writable_above(os.path.abspath(local), f"{what} {path}", "write in")


def _check_writable_above(start: str, named: str, doing: str) -> None:
    """Check that the nearest existing directory at or above `start` can be written: the one a
    job would create its directories in. `named` and `doing` word the error."""
    existing = start
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise InputError(f"{named}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{named}: cannot {doing} {existing} (permission denied)")


#: The file, in a ``--follow`` checkpoint, that remembers the settings its state depends on.
FOLLOW_SETTINGS: Final = "purgatory-follow.json"


def check_checkpoint(path: str, settings: dict[str, float]) -> None:
    """Check a ``--follow`` checkpoint against `settings` (``window``): a checkpoint holds
    windows of one length, so a job resumed from it must count the same windows. A new
    checkpoint is made and remembers them.

    Raises:
        InputError: The checkpoint was made with another window, or cannot be written.
    """
    local = local_path(path)
    if local is None:
        return
    file = os.path.join(local, FOLLOW_SETTINGS)
    try:
        with open(file, encoding="utf-8") as f:
            kept = json.load(f)
    except FileNotFoundError:
        kept = None
    except (OSError, ValueError) as exc:
        raise InputError(f"--checkpoint {path}: cannot read {file}: {exc}") from None
    if isinstance(kept, dict) and kept.get("window") != settings["window"]:
        raise InputError(
            f"--checkpoint {path} holds windows of {kept.get('window')!r} s, not "
            f"{settings['window']!r}: resume with --window {kept.get('window')!r}, or give a "
            "new --out and --checkpoint"
        )
    if kept is None:
        try:
            os.makedirs(local, exist_ok=True)
            with open(file, "w", encoding="utf-8") as f:
                json.dump(settings, f)
        except OSError as exc:
            raise InputError(f"--checkpoint {path}: cannot write in it: {exc.strerror}") from None


def check_configs(configs: Sequence[ReplayConfig], timeout: float | None = None) -> None:
    """Check each configuration as the replay's purgatory will, and `timeout` against its horizon.

    Builds the purgatory of each configuration (its own argument checks apply: a wheel of one
    slot, a negative purge interval), so a bad setting fails here in one line and not inside a
    Spark task.

    Raises:
        InputError: A setting the purgatory refuses, or `timeout` (scaled) beyond the horizon.
    """
    for config in configs:
        try:
            DelayedOperationPurgatory(
                "check",
                tick=config.tick,
                wheel_size=config.wheel_size,
                purge_interval=config.purge_interval,
                clock=ManualClock(),
            )
        except (TypeError, ValueError) as exc:
            raise InputError(f"configuration {config.label()}: {exc}") from None
    if timeout is not None:
        for scale, limit, label in horizon_limits(configs):
            if timeout * scale > limit:
                raise InputError(
                    f"timeout {timeout!r} s x{scale:g} is beyond the timer's horizon "
                    f"({label}); use a shorter timeout or a coarser tick"
                )


def horizon_limits(configs: Sequence[ReplayConfig]) -> list[tuple[float, float, str]]:
    """(timeout scale, the longest scaled timeout in seconds, a description) per configuration.

    A trace's timeout ``t`` replays as ``t * scale``, and the purgatory refuses it beyond its
    timer's horizon (`timer_horizon`): the validation scan of the trace checks
    ``t * scale <= limit``.
    """
    limits: dict[tuple[float, float], str] = {}
    for config in configs:
        limit = timer_horizon(float(config.tick))
        limits.setdefault(
            (config.timeout_scale, limit),
            f"{limit:.3g} s at tick {config.tick:g} s, timeout x{config.timeout_scale:g}",
        )
    return [(scale, limit, label) for (scale, limit), label in limits.items()]


class _Done(DelayedOperation[None]):
    """An operation complete at its first try: a watch of it registers nothing."""

    def try_complete(self) -> bool:
        return self.force_complete()

    def on_complete(self) -> None:
        pass


@functools.cache
def timer_horizon(tick: float) -> float:
    """The longest timeout a purgatory of this `tick` accepts, in seconds, asked of it.

    The purgatory refuses a timeout beyond its timer's horizon (`ValueError`) before its first
    try, and an operation complete at that try registers nothing: a bisection over the doubles
    (as integers, which order non-negative doubles) finds the last accepted one in 64 watches,
    so the limit is the purgatory's own, whatever it is.
    """
    purgatory: DelayedOperationPurgatory[_Done] = DelayedOperationPurgatory(
        "horizon", tick=tick, clock=ManualClock()
    )

    def accepted(bits: int) -> bool:
        timeout = struct.unpack("<d", struct.pack("<q", bits))[0]
        try:
            purgatory.try_complete_else_watch(_Done(timeout), ("k",))
        except ValueError:
            return False
        return True

    low, high = 0, struct.unpack("<q", struct.pack("<d", math.inf))[0]  # 0.0 in, inf out
    while high - low > 1:
        middle = (low + high) // 2
        if accepted(middle):
            low = middle
        else:
            high = middle
    horizon: float = struct.unpack("<d", struct.pack("<q", low))[0]
    return horizon
