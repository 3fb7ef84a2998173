"""The local Spark driver's class archive (purgatory/pipeline/_class_archive.py).

Unit tests of the plan, the claim (a dead process's claim taken over at once) and of `mapped`
against real JVMs given a good archive and three the JVM ignores; then real pipeline processes:
the first exits without waiting and a detached process saves the archive, the next starts from
it (and says only its one-line error), one whose archive is damaged (the JVM refuses it) or
ignored (not mapped) drops it and still runs its job, and an ignored one is saved again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from spark_support import pipeline, spark_env

from purgatory.pipeline import _class_archive as archive

BASE = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture
def directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    place = tmp_path / "archive"
    monkeypatch.setenv(archive.SETTING, str(place))
    return place


def option(options: str, name: str) -> str | None:
    for word in options.split():
        key, _, value = word.partition("=")
        if key == name:
            return value
    return None


def test_off_leaves_the_options_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for setting in ("off", "OFF", "0", "false"):
        monkeypatch.setenv(archive.SETTING, setting)
        plan = archive.plan(BASE)
        assert (plan.options, plan.used, plan.save) == (BASE, None, None)


def test_a_directory_with_a_space_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(archive.SETTING, str(tmp_path / "a b"))
    plan = archive.plan(BASE)
    assert (plan.options, plan.save) == (BASE, None)
    assert not (tmp_path / "a b").exists()


def test_the_default_place_is_the_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(archive.SETTING)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert archive.archive_directory() == tmp_path / "purgatory" / "spark-classes"


def test_without_an_archive_one_is_saved_after_the_job_and_used_once_there(
    directory: Path,
) -> None:
    plan = archive.plan(BASE)
    published = archive.archive_path(directory, BASE)
    assert (plan.options, plan.used, plan.save) == (BASE, None, published)
    # The job's own JVM saves nothing (that would keep the user waiting at its exit).
    assert "ArchiveClassesAtExit" not in plan.options
    # While another live process saves it, no other job plans to.
    part = published.with_name(published.name + ".part")
    assert archive._claim(part)
    assert archive.plan(BASE).save is None
    assert not archive._claim(part)
    directory.joinpath(part.name).with_suffix(".claim").unlink()
    published.write_bytes(b"classes")
    plan = archive.plan(BASE)
    assert (plan.used, plan.save) == (published, None)
    assert option(plan.options, "-XX:SharedArchiveFile") == str(published)
    assert option(plan.options, "-XX:ErrorFile") == str(directory / "hs_err_pid%p.log")


def test_other_jvm_options_name_another_archive(directory: Path) -> None:
    assert archive.archive_path(directory, BASE) != archive.archive_path(directory, "-Xmx1g")
    assert archive.archive_path(directory, BASE) == archive.archive_path(directory, BASE)


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert done.returncode == 0
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def claim_of(directory: Path, **owner: object) -> tuple[Path, Path]:
    """A claim (and the .part it guards) naming `owner`, as a saver writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    part = directory / "spark-x.jsa.part"
    part.write_bytes(b"half an archive")
    claim = part.with_suffix(".claim")
    claim.write_text(json.dumps(owner))
    return part, claim


def test_a_claim_of_a_dead_process_is_taken_over_at_once_with_its_part(directory: Path) -> None:
    part, claim = claim_of(directory, pid=dead_pid(), host=socket.gethostname(), started="1")
    assert not archive._claimed(part)
    assert archive._claim(part)
    assert not part.exists()  # the dead process's half archive is gone
    assert json.loads(claim.read_text())["pid"] == os.getpid()


def test_a_live_claim_is_respected_and_one_this_host_cannot_check_lasts_an_hour(
    directory: Path,
) -> None:
    me = archive._me()
    part, claim = claim_of(directory, **me)
    assert archive._claimed(part)
    assert not archive._claim(part)
    assert part.exists()
    # Another host's process, or a claim of an older version (no owner): its age decides.
    for text in (json.dumps({"pid": 1, "host": "elsewhere"}), ""):
        claim.write_text(text)
        assert archive._claimed(part)
        old = time.time() - 2 * 3600
        os.utime(claim, (old, old))
        assert not archive._claimed(part)
    assert archive._claim(part)


# -- what a real JVM maps -------------------------------------------------------------------

SLEEP = """
public class Sleep {
    public static void main(String[] args) throws Exception {
        System.out.println("up");
        System.out.flush();
        Thread.sleep(Long.parseLong(args[0]));
    }
}
"""


def java() -> str:
    found = archive._java()
    if found is None:
        pytest.skip("no java")
    return found


@pytest.fixture(scope="module")
def real_archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A program that waits, and a dynamic archive of the classes it loads (made once)."""
    work = tmp_path_factory.mktemp("jvm")
    (work / "Sleep.java").write_text(SLEEP)
    javac = Path(os.path.realpath(java())).with_name("javac")
    if not javac.exists():  # a runtime without the compiler: nothing to run the JVM on
        pytest.skip(f"no javac beside {java()}")
    subprocess.run([javac, "-d", work, work / "Sleep.java"], check=True, timeout=120)
    # (An archive's class path holds jars: a directory with files in it is refused.)
    with zipfile.ZipFile(work / "sleep.jar", "w") as jar:
        jar.write(work / "Sleep.class", "Sleep.class")
    jsa = work / "sleep.jsa"
    with running(work, f"-XX:ArchiveClassesAtExit={jsa}", sleep=0) as jvm:
        assert jvm.wait(timeout=120) == 0  # it exits and saves the classes it loaded
    assert jsa.stat().st_size > 4096
    return work, jsa


@pytest.fixture
def bad_archives(real_archive: tuple[Path, Path], tmp_path: Path) -> dict[str, Path]:
    _, jsa = real_archive
    good = jsa.read_bytes()
    made = {
        "empty": b"",
        "random bytes": os.urandom(len(good)),
        "a valid header and garbage": good[:4096] + os.urandom(len(good) - 4096),
    }
    files = {}
    for name, content in made.items():
        files[name] = tmp_path / f"{name.replace(' ', '-')}.jsa"
        files[name].write_bytes(content)
    return files


class running:
    """A JVM running Sleep with `options`, up (it said so), killed at the end."""

    def __init__(self, work: Path, *options: str, sleep: int = 60_000) -> None:
        jar = str(work / "sleep.jar")
        quiet = archive._QUIET.split()  # as a driver runs: the JVM says nothing of the archive
        self.argv = [java(), *options, *quiet, "-cp", jar, "Sleep", str(sleep)]

    def __enter__(self) -> subprocess.Popen[bytes]:
        self.jvm = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.jvm.stdout is not None
        assert self.jvm.stdout.readline() == b"up\n"
        return self.jvm

    def __exit__(self, *exc_info: object) -> None:
        if self.jvm.poll() is None:
            self.jvm.kill()
        self.jvm.wait(timeout=60)
        assert self.jvm.stdout is not None
        self.jvm.stdout.close()


def test_a_jvm_maps_a_good_archive_and_ignores_a_bad_one_without_a_word(
    real_archive: tuple[Path, Path], bad_archives: dict[str, Path]
) -> None:
    work, jsa = real_archive
    with running(work, f"-XX:SharedArchiveFile={jsa}") as jvm:
        assert archive.mapped(jvm.pid, jsa) is True
    for name, bad in bad_archives.items():
        with running(work, f"-XX:SharedArchiveFile={bad}") as jvm:
            assert archive.mapped(jvm.pid, bad) is False, name
    assert archive.mapped(dead_pid(), jsa) is None  # (no /proc entry: cannot tell)


# -- real pipeline processes ----------------------------------------------------------------


def saved(place: Path, seconds: float = 300) -> Path:
    """The archive once the background process has published it (and released its claim)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done = list(place.glob("*.jsa"))
        if done and not list(place.glob("*.claim")):
            return done[0]
        time.sleep(0.5)
    logs = "".join(log.read_text(errors="replace")[-2000:] for log in place.glob("*.log"))
    raise AssertionError(f"no archive saved in {place}: {sorted(place.iterdir())}\n{logs}")


@pytest.fixture
def stop_savers(tmp_path: Path) -> Iterator[None]:
    """Whatever saver a test started in the background is stopped when it ends."""
    yield
    for claim in tmp_path.rglob("*.claim"):
        try:
            owner = json.loads(claim.read_text())
            os.killpg(int(owner["pid"]), signal.SIGKILL)
        except (OSError, ValueError, KeyError, TypeError):
            pass


@pytest.mark.usefixtures("stop_savers")
def test_a_real_driver_saves_in_the_background_uses_and_replaces_what_it_cannot_use(
    tmp_path: Path,
) -> None:
    place = tmp_path / "archive"
    env = {**spark_env(), archive.SETTING: str(place)}
    args = ["generate", "--out", "trace", "--operations", "200", "--purgatories", "1"]
    args += ["--master", "local[1]", "--overwrite"]

    first = pipeline(*args, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stderr.splitlines() == [
        "purgatory.pipeline: saving Spark's classes in the background for a faster start next "
        "time (once)"
    ]
    published = saved(place)
    good = published.read_bytes()

    # A job that starts from it (and fails on a bad event log): one line on stderr, nothing of
    # the JVM's or Spark's start before it. (The bad line is between two good ones: a bad first
    # or last line is found before Spark starts.)
    (tmp_path / "bad").mkdir()
    anchor = '{"v":2,"anchor":{"clock":1.0,"utc":1800000000.0}}\n'
    (tmp_path / "bad" / "a.jsonl").write_text(f"{anchor}{{oops\n{anchor}")
    bad = ["analyze", "--log", "bad", "--out", "analysis", "--master", "local[1]"]
    second = pipeline(*bad, cwd=tmp_path, env=env)
    assert second.returncode == 2, second.stderr
    assert second.stderr.splitlines() == [
        "purgatory.pipeline analyze: error: event log file bad/a.jsonl: line 2: not JSON "
        "(Expecting property name enclosed in double quotes, column 2)"
    ]
    assert published.read_bytes() == good  # mapped: kept as it is

    # Damaged after it was published: the JVM refuses it at start. The test holds the claim, so
    # no new one is saved meanwhile.
    part = published.with_name(published.name + ".part")
    assert archive._claim(part)
    published.chmod(0o644)
    published.write_bytes(good[: len(good) // 2])
    third = pipeline(*args, cwd=tmp_path, env=env)
    assert third.returncode == 0, third.stderr
    assert not published.exists()
    assert not list(tmp_path.glob("hs_err_pid*.log"))  # the crash report is not left here
    part.with_suffix(".claim").unlink()

    # A valid header and garbage: the JVM starts without it, without a word. The session sees
    # it was not mapped, deletes it, and has a new one saved (as the first job did: started
    # here, then stopped by the fixture).
    published.write_bytes(good[:4096] + os.urandom(len(good) - 4096))
    fourth = pipeline(*args, cwd=tmp_path, env=env)
    assert fourth.returncode == 0, fourth.stderr
    assert fourth.stderr.splitlines() == first.stderr.splitlines()
    assert not published.exists()
    claim = part.with_suffix(".claim")
    deadline = time.monotonic() + 60
    while not (claim.exists() and archive._claimed(part)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert archive._claimed(part), sorted(place.iterdir())
    assert (tmp_path / "trace").is_dir()


def test_the_saver_of_a_killed_job_left_nothing_that_blocks(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A saver killed while saving leaves its claim and .part: the next plan takes over."""
    published = archive.archive_path(directory, BASE)
    part = published.with_name(published.name + ".part")
    claim_of(directory, pid=dead_pid(), host=socket.gethostname())
    shutil.move(directory / "spark-x.jsa.part", part)
    shutil.move(directory / "spark-x.jsa.claim", part.with_suffix(".claim"))
    assert archive.plan(BASE).save == published


# -- what is left where the archive goes ----------------------------------------------------


def test_a_refused_archive_goes_with_the_crash_report_its_jvm_wrote_beside_it(
    real_archive: tuple[Path, Path], directory: Path
) -> None:
    """A real JVM given the plan's options and an archive damaged after it was published
    crashes at start and writes its report where ``-XX:ErrorFile`` says: `discard` removes
    both (as the session does before it starts without the archive)."""
    work, jsa = real_archive
    published = archive.archive_path(directory, BASE)
    directory.mkdir(parents=True)
    good = jsa.read_bytes()
    published.write_bytes(good[: len(good) // 2])
    options = archive.plan(BASE).options
    error_file = option(options, "-XX:ErrorFile")
    assert error_file == str(directory / "hs_err_pid%p.log")
    argv = [java(), f"-XX:SharedArchiveFile={published}", f"-XX:ErrorFile={error_file}"]
    argv += [*archive._QUIET.split(), "-cp", str(work / "sleep.jar"), "Sleep", "0"]
    jvm = subprocess.run(argv, capture_output=True, timeout=120, check=False)
    assert jvm.returncode != 0  # it refused the archive outright
    reports = list(directory.glob("hs_err_pid*.log"))
    assert reports, jvm.stdout.decode(errors="replace")
    (directory / "notes.txt").write_text("not a crash report")
    archive.discard(published)
    assert sorted(p.name for p in directory.iterdir()) == ["notes.txt"]


def published_by_a_saver(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What `save` publishes, its JVM's job replaced by one that writes the ``.part``."""
    published = archive.archive_path(directory, BASE)
    part = published.with_name(published.name + ".part")

    def train(options: str) -> int:
        assert option(options, "-XX:ArchiveClassesAtExit") == str(part)
        assert option(options, "-XX:ErrorFile") == str(directory / "hs_err_pid%p.log")
        part.write_bytes(b"classes")
        return 0

    monkeypatch.setattr(archive, "_train", train)
    return published


def test_an_empty_directory_where_the_archive_goes_is_replaced(
    directory: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    published = published_by_a_saver(directory, monkeypatch)
    published.mkdir(parents=True)
    assert archive.plan(BASE).save == published  # (the directory made way)
    published.mkdir()  # (made again, say, between the plan and the save)
    assert archive.save(published, BASE)
    assert published.read_bytes() == b"classes"
    assert archive.plan(BASE).used == published
    assert capsys.readouterr().err == ""


def test_a_link_to_a_directory_where_the_archive_goes_is_replaced_not_followed(
    directory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    published = published_by_a_saver(directory, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("the user's")
    directory.mkdir()
    published.symlink_to(elsewhere, target_is_directory=True)
    assert archive.plan(BASE).save == published
    assert not published.exists()
    assert archive.save(published, BASE)
    assert published.read_bytes() == b"classes"
    assert (elsewhere / "keep.txt").read_text() == "the user's"


def test_a_directory_with_files_where_the_archive_goes_is_left_with_one_line(
    directory: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    published = published_by_a_saver(directory, monkeypatch)
    published.mkdir(parents=True)
    (published / "keep.txt").write_text("someone's")
    plan = archive.plan(BASE)
    assert (plan.options, plan.used, plan.save) == (BASE, None, None)  # nothing saved either
    assert capsys.readouterr().err.splitlines() == [
        f"purgatory.pipeline: {published} is a directory, not Spark's class archive, and not "
        "empty: it is left alone and Spark starts without an archive (remove it for a faster "
        "start)"
    ]
    assert not archive.save(published, BASE)  # (a saver started before it was made)
    assert (published / "keep.txt").read_text() == "someone's"
    assert not published.with_name(published.name + ".part").exists()
