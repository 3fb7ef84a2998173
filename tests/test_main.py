"""``python -m purgatory --version``: the version, and which core runs and why, in each case a
user meets: the native core, the core switched off, and an installation without it."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import sys
from pathlib import Path

import pytest
from helpers import run_process

import purgatory
from purgatory.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
NATIVE_BUILT = importlib.util.find_spec("purgatory._native") is not None


def version(*args: str, path: Path = ROOT, **env: str) -> list[str]:
    """The lines ``python -m purgatory`` prints, run in `path` (first on the path) with `env`
    (and no PURGATORY_NO_EXTENSIONS unless given)."""
    environment = {k: v for k, v in os.environ.items() if k != "PURGATORY_NO_EXTENSIONS"}
    environment.update(env, PYTHONPATH=str(path))
    done = run_process(
        sys.executable, "-m", "purgatory", *args, cwd=path, env=environment, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines: list[str] = done.stdout.splitlines()
    return lines


def test_the_first_line_names_the_version_the_interpreter_and_the_place() -> None:
    first, _ = version("--version")
    assert first == (
        f"asyncio-purgatory {purgatory.__version__} ({platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()} {platform.machine()}) "
        f"from {ROOT / 'purgatory'}"
    )
    assert version() == version("--version")  # (the default)


def test_the_native_core_where_it_is_built() -> None:
    """Where this checkout's core is built (make test builds it), it runs unless switched off;
    where it is not, the line says so (the next test checks that case on its own)."""
    _, core = version("--version")
    if NATIVE_BUILT:
        assert core == "core: native (the C extension purgatory._native)"
    else:
        assert core.startswith("core: python (the pure-Python modules): the native core is not")


def test_the_core_switched_off_says_by_what() -> None:
    _, core = version("--version", PURGATORY_NO_EXTENSIONS="1")
    assert core == (
        "core: python (the pure-Python modules): switched off by PURGATORY_NO_EXTENSIONS=1 "
        "in the environment"
    )


def test_an_installation_without_the_core_says_it_is_not_built(tmp_path: Path) -> None:
    """The package as a pure-Python wheel installs it: no compiled module beside the modules."""
    shutil.copytree(
        ROOT / "purgatory",
        tmp_path / "purgatory",
        ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", "_csrc"),
    )
    _, core = version("--version", path=tmp_path)
    assert core == (
        "core: python (the pure-Python modules): the native core is not built in this "
        "installation (a pure-Python wheel, an interpreter no wheel is built for, or a build "
        "without a C compiler: pip install -v shows why)"
    )


def test_help_says_what_it_prints(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "which core runs here" in capsys.readouterr().out
