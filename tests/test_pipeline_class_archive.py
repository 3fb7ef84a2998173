"""The local Spark driver's class archive (purgatory/pipeline/_class_archive.py).

Unit tests of the options, the claim and the discard; then real pipeline processes: the first
saves the archive at its exit, the next starts from it, and one whose archive was damaged
drops it and still runs its job.
"""

from __future__ import annotations

import os
import time
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
        assert archive.java_options(BASE) == (BASE, None)


def test_a_directory_with_a_space_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(archive.SETTING, str(tmp_path / "a b"))
    assert archive.java_options(BASE) == (BASE, None)
    assert not (tmp_path / "a b").exists()


def test_the_default_place_is_the_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(archive.SETTING)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert archive.archive_directory() == tmp_path / "purgatory" / "spark-classes"


def test_one_process_saves_the_archive_and_later_ones_use_it(directory: Path) -> None:
    options, saving = archive.java_options(BASE)
    assert saving is not None
    assert saving.name.endswith(".jsa.part")
    assert options.startswith(BASE + " ")
    assert option(options, "-XX:ArchiveClassesAtExit") == str(saving)
    # While it is claimed, another process neither saves nor uses one.
    assert archive.java_options(BASE) == (BASE, None)
    published = saving.with_suffix("")
    published.write_bytes(b"classes")
    options, again = archive.java_options(BASE)
    assert again is None
    assert option(options, "-XX:SharedArchiveFile") == str(published)
    assert option(options, "-XX:ErrorFile") == str(directory / "hs_err_pid%p.log")


def test_other_jvm_options_name_another_archive(directory: Path) -> None:
    assert archive.archive_path(directory, BASE) != archive.archive_path(directory, "-Xmx1g")
    assert archive.archive_path(directory, BASE) == archive.archive_path(directory, BASE)


def test_a_claim_left_by_a_dead_process_is_taken_over_once_old(directory: Path) -> None:
    _, saving = archive.java_options(BASE)
    assert saving is not None
    saving.write_bytes(b"half")
    claim = saving.with_suffix(".claim")
    assert archive.java_options(BASE)[1] is None
    old = time.time() - 2 * 3600
    os.utime(claim, (old, old))
    assert archive.java_options(BASE)[1] == saving
    assert not saving.exists()  # the half-written one is gone


def test_discard_deletes_the_archive_named(directory: Path) -> None:
    directory.mkdir()
    published = archive.archive_path(directory, BASE)
    published.write_bytes(b"classes")
    options, _ = archive.java_options(BASE)
    assert archive.discard(options)
    assert not published.exists()
    assert not archive.discard(BASE)


def test_a_real_driver_saves_uses_and_drops_a_damaged_archive(tmp_path: Path) -> None:
    place = tmp_path / "archive"
    env = {**spark_env(), archive.SETTING: str(place)}
    args = ["generate", "--out", "trace", "--operations", "200", "--purgatories", "1"]
    args += ["--master", "local[1]", "--overwrite"]

    first = pipeline(*args, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    assert "saving Spark's classes for a faster start next time" in first.stderr
    assert "Traceback" not in first.stderr
    saved = sorted(path.name for path in place.iterdir())
    assert len(saved) == 1, saved
    assert saved[0].endswith(".jsa")

    second = pipeline(*args, cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr
    assert "saving Spark's classes" not in second.stderr
    assert sorted(path.name for path in place.iterdir()) == saved

    published = place / saved[0]
    published.chmod(0o644)
    with published.open("r+b") as damaged:
        damaged.truncate(published.stat().st_size // 2)
    third = pipeline(*args, cwd=tmp_path, env=env)
    assert third.returncode == 0, third.stderr
    assert not published.exists()
    assert not list(tmp_path.glob("hs_err_pid*.log"))  # the crash report is not left here
    assert (tmp_path / "trace").is_dir()
