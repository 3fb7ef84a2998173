"""A local Spark driver started from an archive of the classes it loads (the JDK's AppCDS).

Half of a small job's wall time is Spark's start, and most of that is the JVM loading and
verifying the ten thousand classes Spark needs. Since Java 13 a JVM can save the classes it
loaded as it exits (``-XX:ArchiveClassesAtExit``) and map them at the next start
(``-XX:SharedArchiveFile``). Measured on a 2-core machine: a session and its first job
8-10 s -> 4-6 s (``benchmarks/PIPELINE_RESULTS.md``).

Saving an archive takes a JVM 10-25 s at its exit, so no user's job does it: the first local
job of an installation (this Java, this Spark, these JVM options) runs without an archive and,
as it exits, starts a detached background process (`save`, niced) that runs a small job of its
own (generate, replay, analyze: the classes the commands load) in a JVM that saves them, and
publishes the archive by rename only after that JVM exited cleanly. One process saves at a time
(a claim file naming it); a claim whose process is gone (same host) is taken over at once, with
the ``.part`` it left, and any other after an hour.

A session started from an archive checks that its JVM mapped it (``/proc/<pid>/maps``, Linux):
the JVM ignores an archive it cannot use without a word (an empty file, random bytes, a valid
header and garbage), so an archive that was not mapped is deleted and saved again in the
background. One the JVM refuses outright (it crashes at start: damaged after it was published)
is deleted by the session, with the crash reports its JVM wrote beside it, and the session
starts without it. A directory where the archive goes is removed if it is empty (or a symbolic
link); one with files in it is left alone, with a line that says so, and no archive is used.
``PURGATORY_SPARK_CLASS_ARCHIVE=off`` turns it all off; a directory there moves it;
``--conf spark.driver.extraJavaOptions=...`` replaces the options, archive included.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

#: The variable that turns the archive off (``off``) or names its directory.
SETTING: Final = "PURGATORY_SPARK_CLASS_ARCHIVE"
#: The JVM's own lines about the archive (classes it skips while saving, a refused archive)
#: would fill the console of every job; it falls back to loading classes without a word.
_QUIET: Final = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: How long the saver waits for its JVM to save the archive.
_SAVE_SECONDS: Final = 300.0
#: A claim older than this, of a process this host cannot check, is taken over.
_STALE_SECONDS: Final = 3600.0
#: The crash reports of the JVMs that use or save an archive, written beside it
#: (``-XX:ErrorFile``): a JVM given a damaged archive crashes at start and writes one.
_CRASH_REPORTS: Final = "hs_err_pid*.log"


def archive_directory() -> Path | None:
    """Where the archive lives: ``$PURGATORY_SPARK_CLASS_ARCHIVE``, else the user's cache;
    ``None`` when turned off."""
    setting = os.environ.get(SETTING, "").strip()
    if setting.lower() in {"off", "0", "no", "false"}:
        return None
    if setting:
        return Path(setting)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(cache) / "purgatory" / "spark-classes"


def archive_path(directory: Path, java_options: str) -> Path:
    """The archive of this Java, this Spark and these JVM options: any change of them (an
    upgrade, other options) names another file, so a stale archive is never tried."""
    import pyspark

    java = _java()
    spark_home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    parts = [pyspark.__version__, os.path.realpath(spark_home), java_options]
    if java is not None:
        real = os.path.realpath(java)
        stat = os.stat(real)
        parts += [real, str(stat.st_size), str(stat.st_mtime_ns)]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return directory / f"spark-{pyspark.__version__}-{digest}.jsa"


class Plan:
    """What a session does about the archive: start from one (`used`), or have one saved in
    the background once its job is done (`save`)."""

    def __init__(self, base: str, used: Path | None, save: Path | None) -> None:
        self.base = base
        self.used = used
        self.save = save

    @property
    def options(self) -> str:
        """The driver's JVM options."""
        if self.used is None:
            return self.base
        # A JVM that cannot map the archive (damaged after it was published) crashes at start;
        # its crash report then goes beside the archive, not into the user's directory.
        crash = self.used.parent / "hs_err_pid%p.log"
        return f"{self.base} -XX:SharedArchiveFile={self.used} -XX:ErrorFile={crash} {_QUIET}"


def plan(base: str) -> Plan:
    """The archive of a local driver whose JVM options are `base`: used if there is one, else
    to be saved after the job (unless turned off, or another process is saving it)."""
    directory = archive_directory()
    if directory is None or any(c.isspace() or c in "'\"\\" for c in str(directory)):
        return Plan(base, None, None)  # off, or a path Spark would split into several options
    archive = archive_path(directory, base)
    if archive.is_file():
        return Plan(base, archive, None)
    if not _make_way(archive):
        return Plan(base, None, None)
    return Plan(base, None, None if _claimed(_part(archive)) else archive)


def discard(archive: Path) -> None:
    """Delete `archive`, which its JVM refused or did not map, and the crash reports the JVMs
    that refused it left beside it: the session starts without it (and has it saved again),
    so they report nothing anyone needs to read, and they would pile up in the user's cache."""
    archive.unlink(missing_ok=True)
    _remove_crash_reports(archive.parent)


def _remove_crash_reports(directory: Path) -> None:
    for report in directory.glob(_CRASH_REPORTS):
        with contextlib.suppress(OSError):
            report.unlink()


def _make_way(archive: Path) -> bool:
    """Whether `archive` can be published: nothing is there, or what is there can go.

    A directory there (made by hand, or by a tool that took the name for one) would make every
    publication fail, and every job start a saver again: an empty one, or a symbolic link, is
    removed; one with files in it is not ours to delete, so it stays, the archive is not used
    and a line says what to do.
    """
    if archive.is_symlink() and not archive.is_file():
        with contextlib.suppress(OSError):
            archive.unlink()  # a dangling link, or one to a directory (which stays)
    if not archive.is_dir():
        return True
    try:
        archive.rmdir()
    except OSError:
        print(
            f"purgatory.pipeline: {archive} is a directory, not Spark's class archive, and not "
            "empty: it is left alone and Spark starts without an archive (remove it for a "
            "faster start)",
            file=sys.stderr,
        )
        return False
    return True


def mapped(pid: int, archive: Path) -> bool | None:
    """Whether the JVM of process `pid` mapped `archive`; ``None`` if this system cannot tell
    (no ``/proc/<pid>/maps``)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            target = os.path.realpath(archive)
            return any(line.rstrip("\n").endswith(target) for line in maps)
    except OSError:
        return None


def save_after_exit(archive: Path, base: str) -> None:
    """At this process's exit, start the detached process that saves `archive`."""
    atexit.register(_spawn_saver, archive, base)


def _spawn_saver(archive: Path, base: str) -> None:
    if _claimed(_part(archive)):
        return
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.with_name(archive.name + ".log"), "wb") as log:
        subprocess.Popen(
            [sys.executable, "-m", __name__, str(archive), base],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    print(
        "purgatory.pipeline: saving Spark's classes in the background for a faster start next "
        "time (once)",
        file=sys.stderr,
    )


def save(archive: Path, base: str) -> bool:
    """Save `archive` (the background process): claim it, run a small job in a local driver
    whose JVM saves the classes it loaded, and publish the archive if that JVM exited cleanly.
    Returns whether it was published."""
    part = _part(archive)
    if not _claim(part):
        return False
    try:
        with contextlib.suppress(OSError):
            os.nice(10)  # the user's next job comes first
        # A crash report goes beside the archive (not into whatever directory the saver was
        # started from), and goes with the failed attempt: the next job tries again.
        crash = archive.parent / "hs_err_pid%p.log"
        code = _train(f"{base} -XX:ArchiveClassesAtExit={part} -XX:ErrorFile={crash} {_QUIET}")
        if code == 0 and part.is_file() and part.stat().st_size > 0:
            if _make_way(archive):  # (else it said why)
                os.replace(part, archive)
                return True
        else:
            print(f"the saving JVM exited with status {code}: no archive", file=sys.stderr)
            _remove_crash_reports(archive.parent)
        part.unlink(missing_ok=True)
        return False
    finally:
        _claim_of(part).unlink(missing_ok=True)


def _train(options: str) -> int | None:
    """Run the commands' kinds of jobs on a little data in a local driver with JVM `options`
    (a generated trace: Parquet and Python tasks; an analysis of a small event log: the data
    source, aggregations, windows); end the driver's JVM (it exits when its stdin closes) and
    return its exit status."""
    from pyspark import SparkContext

    from . import W1, analyze, generate
    from ._spark import get_session

    work = Path(tempfile.mkdtemp(prefix="purgatory-classes-"))
    try:
        _small_event_log(work / "logs")
        spark = get_session(
            "local[1]",
            "purgatory-class-archive",
            {"spark.driver.extraJavaOptions": options, "spark.ui.showConsoleProgress": "false"},
        )
        generate(spark, W1(purgatories=1, operations=100, chunk=100), str(work / "trace"))
        analyze(spark, str(work / "logs"), str(work / "analysis"), window=1.0)
        process: Any = getattr(SparkContext._gateway, "proc", None)
        spark.stop()
        if process is None or process.stdin is None:
            return None
        process.stdin.close()
        try:
            code: int = process.wait(timeout=_SAVE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            return None
        return code
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _small_event_log(directory: Path) -> None:
    """A few operations recorded in `directory`, some completed, some expired."""
    from .. import DelayedOperationPurgatory, JsonLinesEventLog
    from ..testing import ManualClock
    from ._calibrate import FlagOp

    clock = ManualClock()
    with JsonLinesEventLog(directory, clock=None) as log:
        purgatory: DelayedOperationPurgatory[FlagOp] = DelayedOperationPurgatory(
            "classes", clock=clock, event_log=log
        )
        ops = [FlagOp(0.5) for _ in range(20)]
        for i, op in enumerate(ops):
            purgatory.try_complete_else_watch(op, (f"k{i % 3}",))
        for op in ops[::2]:
            op.ready = True
            op.force_complete()
        clock.advance(1.0)


def _java() -> str | None:
    """The java that Spark starts: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def _part(archive: Path) -> Path:
    return archive.with_name(archive.name + ".part")


def _claim_of(part: Path) -> Path:
    return part.with_suffix(".claim")


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": _started(os.getpid())}


def _started(pid: int) -> str | None:
    """When process `pid` started (Linux: its start time in clock ticks since boot), to tell it
    from a later process given the same id; ``None`` if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(owner: dict[str, Any]) -> bool | None:
    """Whether the process a claim names still runs; ``None`` if this host cannot tell."""
    pid = owner.get("pid")
    if owner.get("host") != socket.gethostname() or not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    started = owner.get("started")
    return started is None or _started(pid) in (None, started)


def _claimed(part: Path) -> bool:
    """Whether a live process is saving this archive (a stale claim does not count)."""
    claim = _claim_of(part)
    try:
        age = time.time() - claim.stat().st_mtime
        text = claim.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    except OSError:
        return True  # there, but unreadable here: not ours to take
    try:
        owner = json.loads(text)
    except ValueError:  # being written, or left by an older version: its age decides
        owner = None
    alive = _alive(owner) if isinstance(owner, dict) else None
    return alive if alive is not None else age <= _STALE_SECONDS


def _claim(part: Path) -> bool:
    """Whether this process saves the archive: one process at a time (a claim file naming
    it). A claim whose process is gone is taken over at once, with the ``.part`` it left; one
    this host cannot check, once it is an hour old."""
    claim = _claim_of(part)
    try:
        part.parent.mkdir(parents=True, exist_ok=True)
        if claim.exists() and not _claimed(part):
            claim.unlink(missing_ok=True)
            part.unlink(missing_ok=True)
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except OSError:  # claimed by another process, or no place to keep an archive
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        json.dump(_me(), file)
    return True


if __name__ == "__main__":  # the detached saver: python -m ... ARCHIVE BASE_OPTIONS
    sys.exit(0 if save(Path(sys.argv[1]), sys.argv[2]) else 1)
