"""A local Spark driver started from an archive of the classes it loads (the JDK's AppCDS).

Half of a small job's wall time is Spark's start, and most of that is the JVM loading and
verifying the ten thousand classes Spark needs. Since Java 13 a JVM can save the classes it
loaded as it exits (``-XX:ArchiveClassesAtExit``) and map them at the next start
(``-XX:SharedArchiveFile``). Measured on a 2-core machine: a session and its first job
8-10 s -> 4-6 s; in one run, `analyze` of 1 MB of logs 20.5 -> 13.5 s and `replay` of 20,000
operations 21.7 -> 14.6 s, medians (``benchmarks/PIPELINE_RESULTS.md``).

The first local session of an installation (this Java, this Spark, these JVM options) saves the
archive as its driver exits: the process waits for it once (10-15 s, about 190 MB in the
user's cache). The archive is written under a name of its own and published by rename only
after its JVM exited cleanly, so no session maps a cut file; an archive the JVM refuses anyway
(damaged since: the JVM prints a crash banner and leaves its report beside the archive) is
deleted by the session, which then starts without one. ``PURGATORY_SPARK_CLASS_ARCHIVE=off``
turns it off; a directory there moves it; ``--conf spark.driver.extraJavaOptions=...`` replaces
the options, archive included.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: The variable that turns the archive off (``off``) or names its directory.
SETTING = "PURGATORY_SPARK_CLASS_ARCHIVE"
#: The JVM's own lines about the archive (classes it skips while saving, a refused archive)
#: would fill the console of every job; it falls back to loading classes without a word.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: How long the first session's exit waits for its JVM to save the archive.
_SAVE_SECONDS = 120.0
#: A claim older than this was left by a process that died while saving the archive.
_STALE_SECONDS = 3600.0


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


def java_options(base: str) -> tuple[str, Path | None]:
    """`base` plus the archive's options, and the archive this session saves (``None``: it
    uses one, or none at all)."""
    directory = archive_directory()
    if directory is None or any(c.isspace() or c in "'\"\\" for c in str(directory)):
        return base, None  # off, or a path Spark would split into several options
    archive = archive_path(directory, base)
    if archive.is_file():
        # A JVM that cannot map the archive (it was damaged after it was published) crashes at
        # start; its crash report then goes beside the archive, not into the user's directory.
        crash = directory / "hs_err_pid%p.log"
        return f"{base} -XX:SharedArchiveFile={archive} -XX:ErrorFile={crash} {_QUIET}", None
    saving = archive.with_name(archive.name + ".part")
    if not _claim(saving):
        return base, None  # another process saves it (or there is no place for it)
    return f"{base} -XX:ArchiveClassesAtExit={saving} {_QUIET}", saving


def discard(options: str) -> bool:
    """Delete the archive named in `options`, which the JVM refused; ``True`` if there was one."""
    for option in options.split():
        name, _, value = option.partition("=")
        if name in {"-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit"}:
            Path(value).unlink(missing_ok=True)
            return True
    return False


def publish_at_exit(saving: Path) -> None:
    """At this process's exit, end the driver's JVM (it exits when its stdin closes, as when
    this process ends), wait while it saves the archive, and publish the archive if it did."""
    atexit.register(_publish, saving)


def _publish(saving: Path) -> None:
    from pyspark import SparkContext

    process: subprocess.Popen[bytes] | None = getattr(SparkContext._gateway, "proc", None)
    if process is None or process.stdin is None:
        return
    print(
        "purgatory.pipeline: saving Spark's classes for a faster start next time (once)",
        file=sys.stderr,
    )
    context = SparkContext._active_spark_context
    if context is not None:
        context.stop()  # its threads end first: none reads from a JVM that went away
    try:
        process.stdin.close()
        code = process.wait(timeout=_SAVE_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        return  # left as a stale part, removed by a later session
    if code == 0 and saving.is_file() and saving.stat().st_size > 0:
        os.replace(saving, saving.with_suffix(""))
    else:
        saving.unlink(missing_ok=True)
    _claim_of(saving).unlink(missing_ok=True)


def _java() -> str | None:
    """The java that Spark starts: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def _claim(saving: Path) -> bool:
    """Whether this process saves the archive: one process at a time (a claim file of its
    own), so that concurrent first jobs do not all wait at their exit. A claim left by a
    process that died while saving is taken over once it is old."""
    claim = _claim_of(saving)
    try:
        saving.parent.mkdir(parents=True, exist_ok=True)
        if claim.exists() and time.time() - claim.stat().st_mtime > _STALE_SECONDS:
            claim.unlink(missing_ok=True)
            saving.unlink(missing_ok=True)
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:  # claimed by another process, or no place to keep an archive
        return False
    return True


def _claim_of(saving: Path) -> Path:
    return saving.with_suffix(".claim")
