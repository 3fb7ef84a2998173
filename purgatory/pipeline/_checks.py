"""Checks of a command's inputs, outputs and settings that run before Spark starts.

Starting Spark costs seconds, and Spark reports a missing path, a torn Parquet file or an event
log given as a trace as pages of JVM and Py4J traces. These checks look at the local files first
(pure Python, plus pyarrow's Parquet footer reader) and raise `InputError` with one line that
names the file, so the command line can stop before a session exists.

Only local paths are checked: a path with a scheme (``hdfs://``, ``s3a://``) is left to Spark,
and so is a path without one under ``spark-submit``, whose default filesystem may be a cluster's.
What needs the data (nulls, duplicate ids, timeouts beyond the timer's horizon) stays in the
validation scan of `purgatory.pipeline.load_trace`; `horizon_limits` gives it its limits.

Imports only the standard library and the core package; pyarrow is imported where a Parquet
file is read, so the command line can say what is missing when the Spark extra is not installed.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import struct
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from .. import DelayedOperation, DelayedOperationPurgatory
from ..testing import ManualClock

if TYPE_CHECKING:
    from ._replay import ReplayConfig

__all__ = (
    "EVENT_LOG_SUFFIXES",
    "EXTRA_MODULES",
    "FOLLOW_SETTINGS",
    "TRACE_COLUMNS",
    "InputError",
    "check_apart",
    "check_checkpoint",
    "check_configs",
    "check_directory",
    "check_event_logs",
    "check_output",
    "check_trace",
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
        return
    files = list(_files(local))
    if any(os.path.basename(f).endswith(EVENT_LOG_SUFFIXES) for f in files):
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
